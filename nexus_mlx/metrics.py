"""Fidelity metrics between two next-token distributions: the one definition the CLI, the demo,
the tests and the benchmarks share.

Contract: inputs are logits or log-probabilities as ``mx.array`` or numpy arrays of shape
``(V,)`` (any leading axes of size 1 are dropped); arithmetic is float64 on the host, so the
result does not depend on the model's compute dtype.

- :func:`log_softmax` — float64 log-probabilities ``(V,)`` of a logit vector.
- :func:`next_token_kl` — ``KL(p || q)`` in nats between the softmaxes of two logit vectors
  (the reference first), clamped at 0 against rounding.
- :func:`kl_from_logprobs` — the same from log-probabilities already normalised.
- :func:`top1_agreement` — whether the two argmaxes agree.
- :func:`top2_margin` — how far the largest logit of one vector is above the second (a close
  call when small; ``inf`` when fewer than two are finite, e.g. under a mask).

It knows nothing of models or caches.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np


def _vector(values: Any) -> np.ndarray:
    if isinstance(values, mx.array):
        values = values.astype(mx.float32)  # numpy cannot read bfloat16
    x = np.asarray(values, dtype=np.float64)
    if x.ndim > 1:
        if x.size != x.shape[-1]:
            raise ValueError(f"expected one distribution (V,), got shape {x.shape}")
        x = x.reshape(-1)
    return x


def log_softmax(logits: Any) -> np.ndarray:
    """Float64 log-probabilities ``(V,)`` of one logit vector."""
    x = _vector(logits)
    x = x - x.max()
    out: np.ndarray = x - np.log(np.exp(x).sum())
    return out


def kl_from_logprobs(ref_logprobs: Any, other_logprobs: Any) -> float:
    """``KL(p_ref || p_other)`` in nats from two normalised log-probability vectors."""
    log_p, log_q = _vector(ref_logprobs), _vector(other_logprobs)
    return max(float(np.sum(np.exp(log_p) * (log_p - log_q))), 0.0)


def next_token_kl(ref_logits: Any, other_logits: Any) -> float:
    """``KL(softmax(ref) || softmax(other))`` in nats between two logit vectors."""
    return kl_from_logprobs(log_softmax(ref_logits), log_softmax(other_logits))


def top1_agreement(ref_logits: Any, other_logits: Any) -> bool:
    """Whether the two vectors' argmaxes (the greedy next tokens) are the same."""
    return bool(np.argmax(_vector(ref_logits)) == np.argmax(_vector(other_logits)))


def top2_margin(logits: Any) -> float:
    """The largest finite logit minus the second largest (``inf`` with fewer than two)."""
    x = _vector(logits)
    x = x[np.isfinite(x)]
    if x.size < 2:
        return float("inf")
    top = np.partition(x, x.size - 2)[-2:]
    return float(top[1] - top[0])
