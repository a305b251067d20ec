"""``repair``: delete a span from a cached context and recompute a budgeted part of the suffix.

Contract: ``repair(model, cache, edit, query, budget=5.0, allocator="sur", executor="packed")``
shifts out ``edit``'s rows, asks the allocator for exactly ``B = budget_tokens(S, budget)``
suffix positions, recomputes them with the executor, and returns a :class:`RepairResult` with
the repaired cache, the chosen positions (suffix-relative and as cache rows), their maximal
intervals and per-stage timings (selection, shift, refresh, in seconds). The input cache is left
untouched unless ``in_place=True`` (then it ends up equal to the result's cache). ``budget=0``
is Shift; ``budget=100`` is Replay. The query is what the allocators score relevance against;
it is *not* written into the cache. An edit whose suffix is empty returns the shifted cache.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.nn as nn
import numpy as np

from nexus_mlx.errors import CacheError, TokenError
from nexus_mlx.kv.cache import NexusCache
from nexus_mlx.refresh.allocators import AllocationRequest, checked_selection, get_allocator
from nexus_mlx.refresh.budget import budget_tokens, intervals
from nexus_mlx.refresh.edit import Edit, shift
from nexus_mlx.refresh.executors import EXECUTORS, refresh


@dataclass
class RepairResult:
    cache: NexusCache
    selected: np.ndarray  # (B,) suffix-relative positions, sorted
    rows: np.ndarray  # (B,) the same as rows of the repaired cache
    intervals: list[tuple[int, int]]  # maximal runs of rows, half-open
    suffix_length: int
    budget_tokens: int
    timings: dict[str, float] = field(default_factory=dict)


def _query_array(tokenizer: Any, query: str | Sequence[int]) -> np.ndarray:
    if isinstance(query, str):
        if tokenizer is None:
            raise TokenError("a text query needs a tokenizer (pass tokenizer=...)")
        query = tokenizer.encode(query, add_special_tokens=False)
    arr = np.asarray(list(query), dtype=np.int64)
    if arr.size == 0:
        raise TokenError("the query tokenizes to nothing; allocators need at least one token")
    return arr


def _install(target: NexusCache, source: NexusCache) -> None:
    """Make ``target`` hold exactly ``source``'s state (for in-place repair)."""
    target.__dict__.update(source.__dict__)


def repair(
    model: nn.Module,
    cache: NexusCache,
    edit: Edit,
    query: str | Sequence[int],
    budget: float = 5.0,
    allocator: str = "sur",
    executor: str = "packed",
    *,
    tokenizer: Any = None,
    in_place: bool = False,
    seed: int = 0,
    **options: Any,
) -> RepairResult:
    """Delete ``edit`` from ``cache`` and refresh ``budget`` percent of the suffix."""
    edit.check(cache)
    if executor not in EXECUTORS:
        raise CacheError(f"executor {executor!r} is not one of {EXECUTORS}")
    allocate = get_allocator(allocator)
    query_tokens = _query_array(tokenizer, query)
    s = edit.suffix_length(cache)
    b = budget_tokens(s, budget)
    timings: dict[str, float] = {}
    cache.evaluate()  # pending lazy work on the input cache is not the repair's cost

    start = time.perf_counter()
    shifted = shift(cache, edit)
    shifted.evaluate()
    timings["shift"] = time.perf_counter() - start

    start = time.perf_counter()
    request = AllocationRequest(model, cache, shifted, edit, query_tokens, b, tokenizer, seed, options)
    selected = checked_selection(allocate(request) if b else np.zeros(0, np.int64), s, b, allocator)
    timings["selection"] = time.perf_counter() - start

    rows = selected + edit.p0
    start = time.perf_counter()
    refresh(model, shifted, rows, executor)
    timings["refresh"] = time.perf_counter() - start
    if in_place:
        _install(cache, shifted)
    return RepairResult(shifted, selected, rows, intervals(rows), s, b, timings)
