"""Align what a live cache holds with the sequence a new request renders to: the edit plan.

Contract: ``plan_edit(old, new, min_reuse)`` compares two token sequences (the cached one and the
new one) and returns an :class:`EditPlan`, one of three shapes:

- ``append`` — ``old`` is a prefix of ``new``: keep every row, prefill ``new[len(old):]``.
- ``reuse`` — after the common prefix ``p``, runs of the old sequence reappear in the new one:
  each :class:`Run` ``old[i:i+L] == new[j:j+L]`` (``i, j >= p``, ``L >= min_reuse``). Runs are
  in the new sequence's order and never overlap there or in the old one, but may cross (a moved
  or reordered span: a shuffled tool list). Keep ``[0, p)``, move every run's rows to its new
  positions (keys re-rotated, K/V stale: they were computed after another context), prefill the
  gaps between runs (inserted or edited text), drop every old row no run keeps, then prefill the
  tail ``new[tail_start:]``.
- ``reencode`` — no run worth reusing: keep ``[0, p)`` and prefill ``new[p:]`` (what a prefix
  cache such as mlx-lm's does for every edit).

Runs are found greedily from left to right over the new sequence: at each position the longest
run of still unused old rows that starts with the same ``k``-gram (``k = min(8, min_reuse)``);
``min_reuse`` keeps short coincidental matches from being re-anchored. Pure Python and numpy: it
knows nothing of models, caches or chat templates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from nexus_mlx.errors import ArgumentError

PlanKind = Literal["append", "reuse", "reencode"]
GRAM = 8  # k-gram length of the run index (capped by min_reuse)
CANDIDATES = 64  # old starts examined per k-gram (bounds the work on repetitive text)


@dataclass(frozen=True)
class Run:
    """``old[old:old+length]`` reappears as ``new[new:new+length]``."""

    old: int
    new: int
    length: int

    @property
    def delta(self) -> int:
        """Positions the run moves by."""
        return self.new - self.old


@dataclass(frozen=True)
class EditPlan:
    kind: PlanKind
    prefix: int  # rows [0, prefix) are kept as they are
    old_length: int
    new_length: int
    runs: tuple[Run, ...] = ()  # empty unless kind == "reuse"

    @property
    def reused(self) -> int:
        """Old rows moved to new positions (0 unless kind == "reuse")."""
        return sum(run.length for run in self.runs)

    @property
    def deleted(self) -> int:
        """Old tokens whose rows are dropped."""
        kept = self.old_length if self.kind == "append" else self.prefix + self.reused
        return self.old_length - kept

    @property
    def tail_start(self) -> int:
        """First new token prefilled after everything kept or reused."""
        if self.kind == "reuse":
            return self.runs[-1].new + self.runs[-1].length
        return self.prefix if self.kind == "reencode" else self.old_length

    @property
    def inserted(self) -> int:
        """New tokens prefilled in the gaps before the last run (0 unless kind == "reuse")."""
        return self.tail_start - self.prefix - self.reused if self.kind == "reuse" else 0

    def sources(self) -> np.ndarray:
        """For every new position before :attr:`tail_start`: the old row it copies, or -1 for a
        token to compute (an inserted gap)."""
        out = np.full(self.tail_start, -1, np.int64)
        out[: self.prefix] = np.arange(self.prefix)
        for run in self.runs:
            out[run.new : run.new + run.length] = np.arange(run.old, run.old + run.length)
        return out


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


def _gram_index(old: list[int], start: int, k: int) -> dict[tuple[int, ...], list[int]]:
    index: dict[tuple[int, ...], list[int]] = {}
    for i in range(start, len(old) - k + 1):
        starts = index.setdefault(tuple(old[i : i + k]), [])
        if len(starts) < CANDIDATES:
            starts.append(i)
    return index


def _longest_from(old: list[int], new: list[int], j: int, starts: list[int],
                  used: np.ndarray) -> tuple[int, int]:
    """(start, length) of the longest run of unused old rows matching ``new[j:]``."""
    best, best_len = -1, 0
    for i in starts:
        n = 0
        while (i + n < len(old) and j + n < len(new) and old[i + n] == new[j + n]
               and not used[i + n]):
            n += 1
        if n > best_len:
            best, best_len = i, n
    return best, best_len


def matching_runs(old: np.ndarray, new: np.ndarray, start: int, min_reuse: int) -> list[Run]:
    """The greedy runs of ``old[start:]`` in ``new[start:]`` described in the module docstring."""
    a, b = old.tolist(), new.tolist()
    k = min(GRAM, min_reuse)
    index = _gram_index(a, start, k)
    used = np.zeros(len(a), bool)
    runs: list[Run] = []
    j = start
    while j + min_reuse <= len(b):
        starts = index.get(tuple(b[j : j + k]))
        i, n = _longest_from(a, b, j, starts, used) if starts else (-1, 0)
        if n >= min_reuse:
            runs.append(Run(i, j, n))
            used[i : i + n] = True
            j += n
        else:
            j += 1
    return runs


def check_min_reuse(min_reuse: Any) -> int:
    """``min_reuse`` when it is a positive integer, else an :class:`ArgumentError`."""
    if isinstance(min_reuse, bool) or not isinstance(min_reuse, int) or min_reuse < 1:
        raise ArgumentError(f"min_reuse must be a positive integer, got {min_reuse!r}")
    return min_reuse


def plan_edit(
    old: Sequence[int] | np.ndarray, new: Sequence[int] | np.ndarray, min_reuse: int = 32
) -> EditPlan:
    """The edit plan that turns a cache holding ``old`` into one holding ``new``."""
    check_min_reuse(min_reuse)
    a, b = _ids(old, "the cached sequence"), _ids(new, "the new sequence")
    p = common_prefix(a, b)
    if p == a.size:
        return EditPlan("append", p, a.size, b.size)
    runs = matching_runs(a, b, p, min_reuse)
    if not runs:
        return EditPlan("reencode", p, a.size, b.size)
    return EditPlan("reuse", p, a.size, b.size, tuple(runs))
