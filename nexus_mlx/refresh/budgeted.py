"""``repair``: delete a span from a cached context and recompute a budgeted part of the suffix.

Contract: ``repair(model, cache, edit, query, budget=5.0, allocator="sur", executor="packed")``
shifts out ``edit``'s rows, asks the allocator for exactly ``B = budget_tokens(S, budget)``
suffix positions, recomputes them with the executor, and returns a :class:`RepairResult` with
the repaired cache, the chosen positions (suffix-relative and as cache rows), their maximal
intervals and per-stage timings (selection, shift, refresh, in seconds). ``budget=0`` is Shift;
``budget=100`` is Replay. The query is what the allocators score relevance against; it is *not*
written into the cache. An edit whose suffix is empty returns the shifted cache. Other keyword
arguments go to the allocator as options (``seam=`` for ``sur``, ``chunk=`` for ``legolink``...).

Plan -> apply: the edit, executor, allocator name, query, budget (a number in [0, 100], not a
bool), ``in_place`` (a bool), the cache against the model and the suffix's token ids are all
checked before anything runs; the shift, the allocation and the refresh then run on a copy.
The input cache is left untouched unless ``in_place=True`` and the whole repair succeeded:
then the copy's state is moved into it and ``result.cache`` *is* the input cache. A repair that
raises at any stage leaves the input exactly as it was.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.nn as nn
import numpy as np

from nexus_mlx.errors import ArgumentError, CacheError, TokenError
from nexus_mlx.kv.cache import NexusCache
from nexus_mlx.models.arch import model_plan
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
    """Make ``target`` hold exactly ``source``'s state (for in-place repair); ``source`` must
    not be used afterwards (the two would share storage)."""
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
    # ---- plan: every check before any work --------------------------------------------------
    if not isinstance(edit, Edit):
        raise ArgumentError(f"edit must be an Edit, got {type(edit).__name__}")
    edit.check(cache)
    if not isinstance(executor, str) or executor not in EXECUTORS:
        raise CacheError(f"executor {executor!r} is not one of {EXECUTORS}")
    if not isinstance(in_place, bool):
        raise ArgumentError(f"in_place must be a bool, got {in_place!r}")
    allocate = get_allocator(allocator)
    query_tokens = _query_array(tokenizer, query)
    s = edit.suffix_length(cache)
    b = budget_tokens(s, budget)  # ArgumentError for bools, NaN, values outside [0, 100]
    plan = model_plan(model)
    cache.check_compatible(plan.rope_specs, plan.n_kv_heads, plan.head_dim)
    if b and (cache.tokens[edit.p1 :] < 0).any():
        raise CacheError("the suffix has rows without token ids; cannot recompute them")
    timings: dict[str, float] = {}
    cache.evaluate()  # pending lazy work on the input cache is not the repair's cost

    # ---- apply, on a copy -------------------------------------------------------------------
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
    out = shifted
    if in_place:
        _install(cache, shifted)
        out = cache
    return RepairResult(out, selected, rows, intervals(rows), s, b, timings)
