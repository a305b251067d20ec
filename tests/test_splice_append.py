"""One pass per turn: a splice with ``append`` runs the seam repair and the appended request in
one forward call; it equals the separate calls (splice, then forward of the request) within 1e-4
on every path, and at R = 100% it is exactly a text prefill of block + request."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from test_splice import CONTEXT, QUERY, SCHEMA
from tiny_models import VOCAB, tiny_model

from nexus_mlx.blocks.compile import compile_block
from nexus_mlx.blocks.curve import Curve
from nexus_mlx.blocks.splicing import splice
from nexus_mlx.errors import PositionError, TokenError
from nexus_mlx.kv.rope import reanchor
from nexus_mlx.models.forward import forward, make_cache

TOL = 1e-4


def _diff(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def _cache_after(model, prefix):
    cache = make_cache(model)
    if prefix:
        forward(model, prefix, cache)
        cache.evaluate()
    return cache


CASES = {  # name: (prefix, block context, curve)
    "anchored": (CONTEXT, CONTEXT, Curve()),
    "bare": (list(range(30)), None, None),
    "repaired": (list(np.arange(300) % VOCAB), None, Curve()),
    "prefill": (list(range(7)), None, Curve(R_base=100.0)),
}


@pytest.mark.parametrize("name", ["llama", "gemma2", "gemma3"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_one_pass_equals_separate_calls(name, case):
    model = tiny_model(name)
    prefix, context, curve = CASES[case]
    block = compile_block(model, None, SCHEMA, context=context)
    separate = _cache_after(model, prefix)
    one = separate.copy()
    res_a = splice(model, separate, block, curve=curve)
    logits_a = forward(model, QUERY, separate, logits="last")
    res_b = splice(model, one, block, curve=curve, append=QUERY)
    assert res_a.path == res_b.path == case and res_a.recomputed == res_b.recomputed
    assert res_a.logits is None and res_b.logits is not None
    assert res_b.logits.shape == (1, 1, VOCAB)
    assert _diff(res_b.logits, logits_a) <= TOL
    assert np.array_equal(one.tokens, separate.tokens)
    assert np.array_equal(one.positions, separate.positions)
    for i in range(one.num_layers):
        assert _diff(one.keys(i), separate.keys(i)) <= TOL
        assert _diff(one.values(i), separate.values(i)) <= TOL


def test_full_recompute_with_request_is_one_text_prefill():
    model = tiny_model("qwen3")
    prefix = list(range(9))
    block = compile_block(model, None, SCHEMA)
    cache = _cache_after(model, prefix)
    result = splice(model, cache, block, curve=Curve(R_base=100.0), append=QUERY)
    assert result.path == "prefill" and result.recomputed == len(SCHEMA)
    ref_cache = make_cache(model)
    ref = forward(model, prefix + SCHEMA + QUERY, ref_cache, logits="last")
    assert _diff(result.logits, ref) <= TOL
    for i in range(cache.num_layers):
        assert _diff(cache.keys(i), ref_cache.keys(i)) <= TOL


def test_kept_rows_are_the_reanchored_block_and_the_rest_recomputed():
    model = tiny_model("llama")
    prefix = list(np.arange(300) % VOCAB)
    block = compile_block(model, None, SCHEMA)
    cache = _cache_after(model, prefix)
    result = splice(model, cache, block, append=QUERY)
    k = result.recomputed
    assert 0 < k < len(SCHEMA)
    kept = slice(300, 300 + len(SCHEMA) - k)
    for layer, spec in enumerate(cache.rope_specs):
        want = reanchor(block.keys(layer), 300, spec)[:, :, : len(SCHEMA) - k]
        assert _diff(cache.keys(layer)[:, :, kept], want) <= 1e-5
        assert _diff(cache.values(layer)[:, :, kept], block.values(layer)[:, :, : len(SCHEMA) - k]) == 0
    assert cache.n_past == 300 + len(SCHEMA) + len(QUERY)


def test_query_directed_seam_with_request_equals_separate_calls(default_model):
    """curve="sur": scattered picked rows (kept rows gathered, not a leading run)."""
    from nexus_mlx.blocks.splicing import plan_splice

    model, tokenizer = default_model
    history = tokenizer.encode("You are a helpful assistant. " * 40)[:300]
    schema = tokenizer.encode("create_issue(owner: string, repo: string, title: string, "
                              "body?: string, labels?: string[]) creates an issue. Deprecated "
                              "alias, kept for compatibility with older clients only.")
    query = tokenizer.encode("Open an issue titled crash on start in repo nexus")
    block = compile_block(model, tokenizer, schema)
    separate = _cache_after(model, history)
    plan = plan_splice(model, separate, block, curve="sur", query=query, tokenizer=tokenizer)
    assert plan.picked.size and plan.picked[-1] < block.num_tokens - 1  # kept rows: a gather
    one = separate.copy()
    splice(model, separate, block, curve="sur", query=query, tokenizer=tokenizer)
    logits_a = forward(model, query, separate, logits="last")
    res = splice(model, one, block, curve="sur", query=query, tokenizer=tokenizer, append=query)
    assert _diff(res.logits, logits_a) <= 2e-4
    for i in range(one.num_layers):
        assert _diff(one.keys(i), separate.keys(i)) <= TOL


def test_query_directed_seam_at_full_budget_scores_nothing_and_is_a_prefill(monkeypatch):
    """At depth >= M * K the default curve re-decodes the whole block: curve="sur" then has no
    choice to make, so it runs no selection and costs (and equals) the text prefill."""
    import nexus_mlx.blocks.splicing as splicing

    def no_selection(*_args, **_kwargs):
        raise AssertionError("a selection of every row was scored")

    monkeypatch.setattr(splicing, "_query_directed", no_selection)
    model = tiny_model("llama")
    block = compile_block(model, None, SCHEMA)
    history = list(np.arange(1024) % VOCAB)
    assert Curve().tokens(len(SCHEMA), len(history)) == len(SCHEMA)
    cache, text = _cache_after(model, history), _cache_after(model, history)
    res = splice(model, cache, block, curve="sur", query=QUERY, tokenizer=object(), append=QUERY)
    want = forward(model, SCHEMA + QUERY, text, logits="last")
    assert res.path == "prefill" and res.recomputed == len(SCHEMA)
    assert _diff(res.logits, want) <= TOL
    for i in range(cache.num_layers):
        assert _diff(cache.keys(i), text.keys(i)) <= TOL


@pytest.mark.parametrize("append, error", [([VOCAB], TokenError), ([1.5], TokenError)])
def test_bad_append_is_refused_and_cache_unchanged(append, error):
    model = tiny_model("llama")
    block = compile_block(model, None, SCHEMA)
    cache = _cache_after(model, list(range(5)))
    before = (cache.n_past, cache.tokens.tobytes(), np.array(cache.keys(0)).tobytes())
    with pytest.raises(error):
        splice(model, cache, block, append=append)
    assert (cache.n_past, cache.tokens.tobytes(), np.array(cache.keys(0)).tobytes()) == before


def test_append_past_the_position_limit_is_refused():
    model = tiny_model("llama")  # max_position_embeddings 4096
    block = compile_block(model, None, SCHEMA)
    cache = _cache_after(model, [1, 2, 3])
    with pytest.raises(PositionError, match="appending"):
        splice(model, cache, block, at=4096 - len(SCHEMA) - 2, append=QUERY)
    assert cache.n_past == 3
    mx.eval(cache.keys(0))
