"""Align what a live cache holds with the sequence a new request renders to: the edit plan.

Contract: ``plan_edit(old, new, min_reuse)`` compares two token sequences (the cached one and the
new one) and returns an :class:`EditPlan`, the cheapest of three shapes:

- ``append`` — ``old`` is a prefix of ``new``: keep every row, prefill ``new[len(old):]``.
- ``reuse`` — after the common prefix ``p``, one block ``old[i:i+L]`` reappears as
  ``new[j:j+L]`` (``i, j >= p``, ``L >= min_reuse``): keep ``[0, p)``, drop the rest of ``old``
  except that block, prefill the inserted tokens ``new[p:j]``, re-anchor the block from position
  ``i`` to ``j`` (its keys re-rotated, its K/V stale: they were computed after ``old[p:i]``), then
  prefill the tail ``new[j+L:]``. A deleted span is ``j == p``; an edited one ``j > p``.
- ``reencode`` — no block worth reusing: keep ``[0, p)`` and prefill ``new[p:]`` (what a prefix
  cache such as mlx-lm's does for every edit).

The block is the longest common run of the two remainders (``difflib``'s longest match, junk
heuristics off); ``min_reuse`` keeps tiny coincidental matches from being re-anchored. Pure
Python and numpy: it knows nothing of models, caches or chat templates.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from nexus_mlx.errors import ArgumentError

PlanKind = Literal["append", "reuse", "reencode"]


@dataclass(frozen=True)
class EditPlan:
    kind: PlanKind
    prefix: int  # rows [0, prefix) are kept as they are
    old_length: int
    new_length: int
    block_old: int = 0  # i: where the reused block starts in the old sequence
    block_new: int = 0  # j: where it starts in the new one
    block_length: int = 0  # L (0 unless kind == "reuse")

    @property
    def deleted(self) -> int:
        """Old tokens whose rows are dropped."""
        return self.old_length - self.prefix - self.block_length

    @property
    def inserted(self) -> int:
        """New tokens prefilled before the reused block (0 unless kind == "reuse")."""
        return self.block_new - self.prefix if self.kind == "reuse" else 0

    @property
    def tail_start(self) -> int:
        """First new token prefilled after everything kept or reused."""
        if self.kind == "reuse":
            return self.block_new + self.block_length
        return self.prefix if self.kind == "reencode" else self.old_length

    @property
    def delta(self) -> int:
        """Positions the reused block moves by."""
        return self.block_new - self.block_old


def common_prefix(old: np.ndarray, new: np.ndarray) -> int:
    """Length of the longest common prefix of two id arrays."""
    n = min(old.size, new.size)
    differ = np.flatnonzero(old[:n] != new[:n])
    return int(differ[0]) if differ.size else n


def _ids(tokens: Sequence[int] | np.ndarray, what: str) -> np.ndarray:
    arr = np.asarray(tokens, dtype=np.int64).reshape(-1)
    if arr.size and arr.min() < 0:
        raise ArgumentError(f"{what} holds negative token ids")
    return arr


def plan_edit(
    old: Sequence[int] | np.ndarray, new: Sequence[int] | np.ndarray, min_reuse: int = 32
) -> EditPlan:
    """The edit plan that turns a cache holding ``old`` into one holding ``new``."""
    if isinstance(min_reuse, bool) or not isinstance(min_reuse, int) or min_reuse < 1:
        raise ArgumentError(f"min_reuse must be a positive integer, got {min_reuse!r}")
    a, b = _ids(old, "the cached sequence"), _ids(new, "the new sequence")
    p = common_prefix(a, b)
    if p == a.size:
        return EditPlan("append", p, a.size, b.size)
    rest_old, rest_new = a[p:].tolist(), b[p:].tolist()
    match = difflib.SequenceMatcher(None, rest_old, rest_new, autojunk=False).find_longest_match(
        0, len(rest_old), 0, len(rest_new)
    )
    if match.size < min_reuse:
        return EditPlan("reencode", p, a.size, b.size)
    return EditPlan("reuse", p, a.size, b.size, p + match.a, p + match.b, match.size)
