"""Temperature / top-p sampling with a seeded generator, as a session ``sampler``, and OpenAI's
penalties and logit bias as logits processors.

Contract: :func:`make_sampler` ``(temperature, top_p, seed)`` returns None for greedy decoding
(temperature 0) or a callable ``(logprobs (1, V) mx.array) -> (1,) mx.array`` holding the sampled
id. It draws from ``softmax(logprobs / temperature)`` restricted to the smallest set of ids whose
probability reaches ``top_p`` (ties broken by id), with a ``numpy`` generator seeded by ``seed``
(fresh entropy when None; a negative seed, which OpenAI's API allows, is read as its unsigned
64-bit two's complement): the same seed over the same logits gives the same ids, whatever else
the process samples. ``stream`` (default 0) picks one of the seed's independent streams: the
choices of a request with ``n`` > 1 draw from streams 0, 1, ..., so each differs from the others
and choice 0 is the reply the request with ``n`` = 1 would get. Ids a constraint masked
(``-inf``) are never drawn. It must run where the logits are evaluated (the session's decode
loop); it knows nothing about requests or sessions.

:func:`make_logits_processors` ``(frequency_penalty, presence_penalty, logit_bias)`` returns the
logits processors of OpenAI's ``frequency_penalty`` / ``presence_penalty`` (a token's logit
lowered by ``frequency * count + presence * (count > 0)``, ``count`` its occurrences in the
reply so far) and ``logit_bias`` (``{id: bias}`` added to those ids' logits); none for zeros. They
run before the turn's constraint, which they cannot loosen (a masked id stays masked).
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import numpy as np

from nexus_mlx.decode.generate import LogitsProcessor

Sampler = Callable[[mx.array], mx.array]


def make_sampler(temperature: float, top_p: float = 1.0, seed: int | None = None,
                 stream: int = 0) -> Sampler | None:
    if temperature <= 0:
        return None
    rng = np.random.default_rng(_entropy(seed, stream))

    def sample(logprobs: mx.array) -> mx.array:
        scaled = np.array(logprobs.astype(mx.float32), dtype=np.float64).reshape(-1) / temperature
        probs = np.exp(scaled - scaled.max())  # (V,)
        if top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            cumulative = np.cumsum(probs[order]) / probs.sum()
            keep = order[: int(np.searchsorted(cumulative, top_p)) + 1]
            kept = np.zeros_like(probs)
            kept[keep] = probs[keep]
            probs = kept
        cumulative = np.cumsum(probs)
        token = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
        return mx.array([min(token, probs.size - 1)])

    return sample


def _entropy(seed: int | None, stream: int) -> int | list[int] | None:
    if seed is None:
        return None  # fresh entropy
    unsigned = seed % (1 << 64)  # numpy's seeds are >= 0
    return unsigned if stream == 0 else [unsigned, stream]


def make_logits_processors(frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                           logit_bias: dict[int, float] | None = None) -> list[LogitsProcessor]:
    processors: list[LogitsProcessor] = []
    if frequency_penalty or presence_penalty:
        def penalize(ids: mx.array, logits: mx.array) -> mx.array:
            if ids.size == 0:
                return logits
            counts = np.bincount(np.asarray(ids).reshape(-1), minlength=logits.shape[-1])
            penalty = frequency_penalty * counts + presence_penalty * (counts > 0)
            return logits - mx.array(penalty[: logits.shape[-1]], dtype=logits.dtype)
        processors.append(penalize)
    if logit_bias:
        ids = mx.array(list(logit_bias), dtype=mx.int32)
        biases = mx.array(list(logit_bias.values()), dtype=mx.float32)

        def bias(_ids: mx.array, logits: mx.array) -> mx.array:
            return logits.at[..., ids].add(biases.astype(logits.dtype))
        processors.append(bias)
    return processors
