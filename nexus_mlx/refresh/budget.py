"""Exact recompute budgets (paper 2).

Contract: ``budget_tokens(S, b) = min(S, ceil(S * b / 100))`` for a suffix of ``S`` positions
and a budget of ``b`` percent, ``0 <= b <= 100``, in exact rational arithmetic (b = 2.5 means
exactly 2.5%). b = 0 is Shift; b = 100 is Replay. ``intervals(rows)`` splits sorted rows into
maximal runs of consecutive rows, as half-open ``(start, stop)`` pairs.
"""

from __future__ import annotations

import math
from fractions import Fraction

from nexus_mlx.errors import ArgumentError
from nexus_mlx.kv.row_backup import intervals  # noqa: F401  (re-exported: refresh's runs)


def budget_tokens(suffix_length: int, budget_pct: float) -> int:
    """How many suffix positions a budget of ``budget_pct`` percent buys, exactly."""
    if suffix_length < 0:
        raise ArgumentError(f"suffix length must be >= 0, got {suffix_length}")
    if isinstance(budget_pct, bool):
        raise ArgumentError(f"budget must be a percentage in [0, 100], not a bool ({budget_pct!r})")
    if not (isinstance(budget_pct, int | float) and 0 <= budget_pct <= 100):
        raise ArgumentError(f"budget must be a percentage in [0, 100], got {budget_pct!r}")
    return min(suffix_length, math.ceil(Fraction(suffix_length) * Fraction(budget_pct) / 100))

