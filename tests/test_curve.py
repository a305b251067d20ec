"""Eq. 2 of paper 1, reproduced exactly."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nexus_mlx.blocks.curve import Curve
from nexus_mlx.errors import ArgumentError


@pytest.mark.parametrize(
    "curve, n_past, expected",
    [
        (Curve(), 0, 5.0),
        (Curve(), 256, 5.0),
        (Curve(), 512, 5 + 256 / 768 * 95),
        (Curve(), 1024, 100.0),
        (Curve(), 2048, 100.0),
        (Curve.flat(), 512, 5 + 256 / 3840 * 95),
        (Curve.flat(), 1024, 24.0),
        (Curve.flat(), 2048, 5 + 1792 / 3840 * 95),
        (Curve.flat(), 4096, 100.0),
    ],
)
def test_paper_values(curve, n_past, expected):
    assert curve.percent(n_past) == pytest.approx(expected, abs=1e-12)


@given(n=st.integers(0, 100_000), s=st.integers(0, 5000),
       m=st.integers(1, 4096), r=st.integers(0, 100), k=st.integers(2, 64))
def test_formula_and_token_count(n, s, m, r, k):
    curve = Curve(M=m, R_base=float(r), K=float(k))
    exact = Fraction(r) if n <= m else min(Fraction(100), r + Fraction(n - m, m * (k - 1)) * (100 - r))
    assert curve.percent(n) == float(exact)
    assert curve.tokens(s, n) == min(s, math.ceil(s * exact / 100))
    assert 0 <= curve.tokens(s, n) <= s


def test_full_recompute_at_100_percent():
    assert Curve().tokens(235, 1024) == 235
    assert Curve().tokens(235, 256) == 12  # ceil(11.75)


@pytest.mark.parametrize("kwargs", [{"M": 0}, {"R_base": -1}, {"R_base": 101}, {"K": 1}])
def test_bad_parameters(kwargs):
    with pytest.raises(ArgumentError):
        Curve(**kwargs)


def test_negative_inputs():
    with pytest.raises(ArgumentError, match="n_past"):
        Curve().percent(-1)
    with pytest.raises(ArgumentError, match="block size"):
        Curve().tokens(-3, 10)
