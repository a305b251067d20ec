"""The decode loop over the engine: greedy tokens equal mlx-lm's own generate_step."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import generate_step
from tiny_models import ARCHITECTURES, VOCAB, tiny_model

from nexus_mlx.decode.generate import GenerationStats, generate_tokens
from nexus_mlx.models.forward import make_cache


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
