"""Next-token fidelity metrics (``nexus_mlx.metrics``) against float64 hand computations:
KL of a distribution with itself, two-point distributions, bfloat16 MLX input, shape errors."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

from nexus_mlx.metrics import (
    kl_from_logprobs,
    log_softmax,
    next_token_kl,
    top1_agreement,
    top2_margin,
)


def _two_point_kl(p: float, q: float) -> float:
    """KL(Bernoulli(p) || Bernoulli(q)) in nats, by hand."""
    return p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q))


def _logits(p: float) -> list[float]:
    """Logits whose softmax is ``[p, 1 - p]``."""
    return [math.log(p), math.log(1 - p)]


def test_kl_of_identical_distributions_is_zero():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(257) * 4.0
    assert next_token_kl(logits, logits) == 0.0
    assert next_token_kl(logits, logits + 3.5) == pytest.approx(0.0, abs=1e-12)  # shift-invariant
    logp = log_softmax(logits)
    assert kl_from_logprobs(logp, logp) == 0.0


@pytest.mark.parametrize(("p", "q"), [(0.25, 0.5), (0.5, 0.25), (0.9, 0.1), (0.01, 0.6)])
def test_two_point_values(p, q):
    expected = _two_point_kl(p, q)
    assert next_token_kl(_logits(p), _logits(q)) == pytest.approx(expected, rel=1e-12)
    assert next_token_kl(np.array(_logits(p)) + 7.0, _logits(q)) == pytest.approx(expected,
                                                                                 rel=1e-12)
    assert kl_from_logprobs(_logits(p), _logits(q)) == pytest.approx(expected, rel=1e-12)


def test_log_softmax_is_normalised_float64():
    out = log_softmax(mx.array([[[1.0, 2.0, 3.0]]]))  # (1, 1, V): leading axes of size 1 dropped
    assert out.dtype == np.float64 and out.shape == (3,)
    expected = np.array([1.0, 2.0, 3.0]) - math.log(math.exp(1) + math.exp(2) + math.exp(3))
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-15)


def test_bfloat16_mlx_input():
    ref = [0.5, -1.25, 2.0, 0.0]  # exact in bfloat16
    other = [1.0, 0.75, -0.5, 3.0]
    expected = next_token_kl(np.array(ref), np.array(other))
    got = next_token_kl(mx.array(ref, dtype=mx.bfloat16)[None, None],
                        mx.array(other, dtype=mx.bfloat16))
    assert isinstance(got, float) and got == pytest.approx(expected, rel=1e-12)
    by_hand = log_softmax(ref)
    assert expected == pytest.approx(
        float(np.sum(np.exp(by_hand) * (by_hand - log_softmax(other)))), rel=1e-12)
    assert not top1_agreement(mx.array(ref, dtype=mx.bfloat16), mx.array(other, dtype=mx.bfloat16))
    assert top1_agreement(mx.array(ref, dtype=mx.bfloat16), np.array(ref) - 1.0)


@pytest.mark.parametrize("shape", [(2, 3), (3, 2), (1, 2, 2)])
def test_more_than_one_distribution_is_an_error(shape):
    batch = np.zeros(shape)
    with pytest.raises(ValueError, match="one distribution"):
        next_token_kl(batch, np.zeros(shape[-1]))
    with pytest.raises(ValueError, match="one distribution"):
        log_softmax(mx.array(batch))
    with pytest.raises(ValueError, match="one distribution"):
        top1_agreement(np.zeros(shape[-1]), batch)


def test_top2_margin_is_the_gap_between_the_two_largest_finite_logits():
    assert top2_margin(np.array([0.5, 3.0, 2.25, -1.0])) == pytest.approx(0.75)
    assert top2_margin(mx.array([[1.0, 1.0]])) == 0.0
    assert top2_margin(np.array([-np.inf, 2.0, -np.inf])) == float("inf")  # one allowed token
    assert top2_margin(np.array([4.0, -np.inf, 1.0])) == 3.0
