"""Allocators: which suffix positions a repair budget recomputes.

Contract: an allocator is a plain callable ``allocate(request) -> np.ndarray`` returning exactly
``request.budget`` sorted, distinct suffix indices in ``[0, S)`` (0 = the first suffix token,
the one right after the deleted span). It may read anything in :class:`AllocationRequest` —
the untouched dirty cache, the shifted cache, token ids, the query, the model — but must not
modify either cache (use ``fork()`` for scratch passes). ``register(name)`` adds one to
:data:`ALLOCATORS`; ``checked_selection`` enforces the contract on what an allocator returns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mlx.nn as nn
import numpy as np

from nexus_mlx.errors import ArgumentError
from nexus_mlx.kv.cache import NexusCache
from nexus_mlx.refresh.edit import Edit


@dataclass
class AllocationRequest:
    model: nn.Module
    dirty: NexusCache  # p + e + s, untouched
    shifted: NexusCache  # p + s after Shift (suffix stale, re-positioned)
    edit: Edit
    query_tokens: np.ndarray  # (Q,) token ids of the question that follows
    budget: int  # exactly how many suffix positions to return
    tokenizer: Any = None  # needed by text-structured allocators (units)
    seed: int = 0
    options: dict[str, Any] = field(default_factory=dict)
    # the stale rows' token ids when they are not the contiguous rows [p0, n_past) of
    # ``shifted`` (a session's reused runs gathered in position order); only allocators that
    # read the suffix through suffix_tokens / suffix_length (the text-only ones) accept it
    suffix: np.ndarray | None = None

    @property
    def suffix_length(self) -> int:
        if self.suffix is not None:
            return int(self.suffix.size)
        return self.shifted.n_past - self.edit.p0

    @property
    def suffix_tokens(self) -> np.ndarray:
        if self.suffix is not None:
            return self.suffix
        return self.shifted.tokens[self.edit.p0 :]

    @property
    def prefix_tokens(self) -> np.ndarray:
        return self.shifted.tokens[: self.edit.p0]


Allocator = Callable[[AllocationRequest], np.ndarray]
ALLOCATORS: dict[str, Allocator] = {}


def register(name: str) -> Callable[[Allocator], Allocator]:
    """Decorator adding an allocator to :data:`ALLOCATORS` under ``name``."""

    def add(fn: Allocator) -> Allocator:
        if name in ALLOCATORS:
            raise ArgumentError(f"allocator {name!r} is already registered")
        ALLOCATORS[name] = fn
        return fn

    return add


def get_allocator(name: str) -> Allocator:
    _load_builtin()
    try:
        return ALLOCATORS[name]
    except KeyError:
        raise ArgumentError(f"unknown allocator {name!r}; known: {sorted(ALLOCATORS)}") from None


def checked_selection(selection: np.ndarray, suffix_length: int, budget: int, name: str) -> np.ndarray:
    """The allocator's output as int64, or :class:`ArgumentError` if it breaks the contract."""
    sel = np.asarray(selection, dtype=np.int64).reshape(-1)
    if sel.size != budget:
        raise ArgumentError(f"allocator {name!r} returned {sel.size} positions for budget {budget}")
    if sel.size and (sel.min() < 0 or sel.max() >= suffix_length):
        raise ArgumentError(f"allocator {name!r} returned positions outside [0, {suffix_length})")
    if sel.size > 1 and not np.all(np.diff(sel) > 0):
        raise ArgumentError(f"allocator {name!r} returned unsorted or repeated positions")
    return sel


def top_k_positions(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` highest scores (earlier index wins ties), sorted ascending."""
    order = np.lexsort((np.arange(scores.size), -np.asarray(scores, dtype=np.float64)))
    return np.sort(order[:k])


_BUILTIN_MODULES = ("positional", "oracle", "kv_based", "attention_based", "semantic")


def _load_builtin() -> None:
    import importlib

    for module in _BUILTIN_MODULES:
        importlib.import_module(f"nexus_mlx.refresh.allocators.{module}")
