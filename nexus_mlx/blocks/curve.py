"""The depth-adaptive recompute curve of paper 1 (Eq. 2).

Contract: ``Curve(M, R_base, K).percent(n_past)`` is

    R(n) = R_base                                            for n <= M
    R(n) = R_base + (n - M) / (M (K - 1)) * (100 - R_base)    for n >  M, clamped to 100

evaluated in exact rational arithmetic, and ``tokens(S, n_past) = ceil(S * R(n_past) / 100)``
(0 <= tokens <= S) is how many trailing block tokens a splice at depth ``n_past`` re-decodes.
At R = 100 the splice is exactly a text prefill. ``Curve.flat()`` is the K = 16 variant.

It knows nothing about caches or models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from nexus_mlx.errors import ArgumentError


@dataclass(frozen=True)
class Curve:
    M: int = 256
    R_base: float = 5.0
    K: float = 4.0

    def __post_init__(self) -> None:
        if self.M <= 0:
            raise ArgumentError(f"M must be positive, got {self.M}")
        if not 0 <= self.R_base <= 100:
            raise ArgumentError(f"R_base must be in [0, 100], got {self.R_base}")
        if self.K <= 1:
            raise ArgumentError(f"K must be > 1, got {self.K}")

    @classmethod
    def flat(cls) -> Curve:
        """The paper's flatter K = 16 curve."""
        return cls(K=16.0)

    def _percent_exact(self, n_past: int) -> Fraction:
        if n_past < 0:
            raise ArgumentError(f"n_past must be >= 0, got {n_past}")
        base = Fraction(self.R_base)
        if n_past <= self.M:
            return base
        slope = Fraction(n_past - self.M) / (self.M * (Fraction(self.K) - 1))
        return min(Fraction(100), base + slope * (100 - base))

    def percent(self, n_past: int) -> float:
        """R(n_past) in percent."""
        return float(self._percent_exact(n_past))

    def tokens(self, block_tokens: int, n_past: int) -> int:
        """ceil(S * R(n_past) / 100): trailing block tokens to re-decode."""
        if block_tokens < 0:
            raise ArgumentError(f"block size must be >= 0, got {block_tokens}")
        return min(block_tokens, math.ceil(block_tokens * self._percent_exact(n_past) / 100))
