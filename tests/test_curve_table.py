"""Per-model curves: the fit covers every measured need with the least recompute, the table
round-trips through the user's cache (atomically, validated), and ``splice(curve="model")``
uses the stored curve (the paper's when none is stored)."""

from __future__ import annotations

import json

import pytest
from test_splice import SCHEMA
from tiny_models import tiny_model

from nexus_mlx.blocks.compile import compile_block
from nexus_mlx.blocks.curve import Curve
from nexus_mlx.blocks.curve_table import (
    CURVE_GRID,
    PACKAGED_TABLE,
    curve_for,
    fit_curve,
    read_table,
    store_curve,
    user_table,
)
from nexus_mlx.blocks.splicing import splice
from nexus_mlx.errors import ArgumentError, FormatError
from nexus_mlx.models.fingerprint import model_fingerprint
from nexus_mlx.models.forward import forward, make_cache


@pytest.fixture()
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("NEXUS_MLX_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.parametrize("needs", [
    {128: 0.0, 512: 0.0},
    {128: 5.0, 512: 20.0, 2048: 100.0},
    {64: 30.0, 1024: 30.0},
    {256: 2.0, 1024: 50.0, 2048: 75.0},
])
def test_the_fit_covers_every_need_with_the_least_recompute(needs):
    curve = fit_curve(needs)
    assert all(curve.percent(n) >= need for n, need in needs.items())
    spent = sum(curve.percent(n) for n in needs)
    covering = [c for c in CURVE_GRID if all(c.percent(n) >= v for n, v in needs.items())]
    assert spent == min(sum(c.percent(n) for n in needs) for c in covering)


def test_the_fit_refuses_no_needs_or_bad_ones():
    for needs in ({}, {-1: 5.0}, {128: 101.0}, {True: 5.0}):
        with pytest.raises(ArgumentError):
            fit_curve(needs)


def test_a_stored_curve_is_the_models_and_others_keep_the_papers(cache_home):
    llama, gemma = tiny_model("llama"), tiny_model("gemma2")
    assert curve_for(llama) == Curve()
    path = store_curve(llama, Curve(M=128, R_base=10.0, K=8.0), source="test")
    assert path == user_table() and path.parent == cache_home
    assert curve_for(llama) == Curve(M=128, R_base=10.0, K=8.0)
    assert curve_for(gemma) == Curve()
    entry = read_table(path)[model_fingerprint(llama).weights_digest]
    assert entry == {"M": 128, "R_base": 10.0, "K": 8.0, "source": "test"}
    store_curve(gemma, Curve(K=2.0))  # a second model keeps the first one's entry
    assert curve_for(llama) == Curve(M=128, R_base=10.0, K=8.0)
    assert curve_for(gemma) == Curve(K=2.0)
    assert not list(cache_home.glob(".curves-*"))  # no temporary file left behind


def test_the_packaged_table_is_valid_and_holds_the_qwen_curve():
    table = read_table(PACKAGED_TABLE)
    qwen = table["4bd1921a28893376895ff0d512307c530ed511bf326ca4e8b24e5f1826bcbe82"]
    assert (qwen["M"], qwen["R_base"], qwen["K"]) == (64, 0.0, 1.5)
    for entry in table.values():  # every entry is a curve the grid can express
        assert Curve(M=entry["M"], R_base=entry["R_base"], K=entry["K"]) in CURVE_GRID


@pytest.mark.parametrize("text, needle", [("not json", "not JSON"), ("[1, 2]", "must map"),
                                          ('{"x": {"M": 0, "R_base": 5, "K": 4}}', "bad entry")])
def test_a_malformed_table_is_refused_by_name(cache_home, text, needle):
    model = tiny_model("llama")
    cache_home.mkdir(parents=True)
    digest = model_fingerprint(model).weights_digest
    user_table().write_text(text.replace('"x"', json.dumps(digest)))
    with pytest.raises(FormatError, match=needle):
        curve_for(model)


def test_splice_with_the_model_curve_uses_the_stored_one(cache_home):
    model = tiny_model("llama")
    block = compile_block(model, None, SCHEMA)
    history = list(range(40))

    def spliced(curve):
        cache = make_cache(model)
        forward(model, history, cache)
        return splice(model, cache, block, curve=curve)

    assert spliced("model").recomputed == spliced(Curve()).recomputed  # nothing stored yet
    store_curve(model, Curve(M=16, R_base=100.0, K=2.0))
    result = spliced("model")
    assert result.path == "prefill" and result.recomputed == len(SCHEMA)
    with pytest.raises(ArgumentError, match="'model'"):
        spliced("models")
