"""The decode loop over the engine: greedy tokens equal mlx-lm's own generate_step."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import generate_step
from tiny_models import ARCHITECTURES, VOCAB, tiny_model

from nexus_mlx.decode.generate import GenerationStats, generate_tokens
from nexus_mlx.models.forward import forward, make_cache


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_greedy_tokens_equal_mlx_lm(name):
    model = tiny_model(name)
    prompt = np.random.default_rng(0).integers(0, VOCAB, size=12).tolist()
    ref = [int(tok) for tok, _ in generate_step(mx.array(prompt), model, max_tokens=10)]
    cache = make_cache(model)
    stats = GenerationStats()
    ours = list(generate_tokens(model, prompt, cache, max_tokens=10, stats=stats))
    assert ours == ref
    assert cache.n_past == 12 + 9  # the last sampled token is not yet in the cache
    assert stats.generated_tokens == 10 and stats.ttft_s > 0


def test_stops_at_end_of_sequence():
    model = tiny_model("llama")
    prompt = [1, 2, 3]
    first = next(generate_tokens(model, prompt, make_cache(model), max_tokens=5))
    out = list(generate_tokens(model, prompt, make_cache(model), max_tokens=5, eos_token_ids={first}))
    assert out == [first]


def test_logits_processor_and_sampler_are_applied():
    model = tiny_model("llama")
    banned = 7

    def ban(tokens, logits):
        return mx.where(mx.arange(logits.shape[-1]) == banned, -1e9, logits)

    def pick_banned_if_allowed(logprobs):
        return mx.array([banned]) if logprobs[0, banned].item() > -1e8 else mx.argmax(logprobs, -1)

    out = list(generate_tokens(model, [1, 2], make_cache(model), max_tokens=4,
                               sampler=pick_banned_if_allowed, logits_processors=[ban]))
    assert banned not in out
    out = list(generate_tokens(model, [1, 2], make_cache(model), max_tokens=4,
                               sampler=pick_banned_if_allowed))
    assert out == [banned] * 4


def _sequential_reference(model, prompt, n):
    """The unpipelined greedy loop: forward one known token at a time."""
    cache = make_cache(model)
    logits = forward(model, prompt, cache, logits="last")
    out = []
    for _ in range(n):
        tok = int(mx.argmax(logits[0, -1]).item())
        out.append(tok)
        if len(out) == n:
            break
        logits = forward(model, [tok], cache, logits="last")
    return out, cache


@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_pipelined_loop_leaves_the_cache_as_the_sequential_one(name):
    """The pipelined loop's cache (rows, positions, token ids, K/V) equals the unpipelined
    loop's after max_tokens, after an end-of-sequence id, and when the consumer stops early."""
    model = tiny_model(name)
    prompt = np.random.default_rng(1).integers(0, VOCAB, size=9).tolist()
    ref, ref_cache = _sequential_reference(model, prompt, 7)
    cache = make_cache(model)
    assert list(generate_tokens(model, prompt, cache, max_tokens=7)) == ref
    assert cache.n_past == ref_cache.n_past == 9 + 6
    assert np.array_equal(cache.tokens, ref_cache.tokens)
    for i in range(cache.num_layers):
        assert float(mx.abs(cache.keys(i) - ref_cache.keys(i)).max()) <= 1e-5
    eos_cache = make_cache(model)  # stops at the 4th token: its step is taken back
    out = list(generate_tokens(model, prompt, eos_cache, max_tokens=7, eos_token_ids={ref[3]}))
    assert out == ref[: ref.index(ref[3]) + 1]
    assert eos_cache.n_past == 9 + len(out) - 1
    assert np.array_equal(eos_cache.tokens, np.array(prompt + out[:-1]))
    early = make_cache(model)  # the consumer stops after two tokens
    gen = generate_tokens(model, prompt, early, max_tokens=7)
    assert [next(gen), next(gen)] == ref[:2]
    gen.close()
    assert early.n_past == 9 + 1 and np.array_equal(early.tokens, np.array(prompt + ref[:1]))
