"""Edit operators for a context ``p + e + s`` whose span ``e`` is deleted (paper 2).

Contract: an :class:`Edit` names the cache rows ``[p0, p1)`` of the deleted span ``e``; rows
before it are the valid prefix ``p`` and rows from ``p1`` to ``n_past`` are the suffix ``s``,
whose cached K/V still encode ``e``. Each operator validates the edit (integer bounds, not
bools; a non-empty span of live rows; a cache holding one linear context) and its other
arguments first, then works on a copy and returns it as a *new* cache: the input is never
modified, whether the operator succeeds or raises. The edited context:

- ``dirty``: the untreated reference; ``e`` stays in the cache (a copy).
- ``shift``: ``e``'s rows removed, suffix positions moved down by ``|e|`` with keys re-rotated
  by ``-|e|`` (one float32 rotation, see :mod:`nexus_mlx.kv.cache`); V unchanged. The suffix is
  stale but correctly placed: not exact, only its layer-0 K/V equal a re-prefill's.
- ``replay``: ``shift``, then every suffix row recomputed through all layers from the valid
  prefix (budget 100%): equal to ``reprefill`` within float32 rounding.
- ``reprefill``: the edited token sequence prefilled from an empty cache (the gold reference).

It does not choose which rows to recompute (``repair.allocators``) nor how (``repair.executors``).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.nn as nn
import numpy as np

from nexus_mlx.errors import CacheError
from nexus_mlx.kv.cache import NexusCache
from nexus_mlx.kv.checks import is_int
from nexus_mlx.models.forward import forward, make_cache
from nexus_mlx.refresh.executors import EXECUTORS, refresh


@dataclass(frozen=True)
class Edit:
    """Deletion of cache rows ``[p0, p1)``."""

    p0: int
    p1: int

    @property
    def size(self) -> int:
        return self.p1 - self.p0

    def check(self, cache: NexusCache) -> None:
        """Raise :class:`CacheError` unless ``[p0, p1)`` is a non-empty span of live rows and
        the cache's positions are ``0..n_past-1`` (one linear context)."""
        if not (is_int(self.p0) and is_int(self.p1)):
            raise CacheError(
                f"edit bounds must be integers (not bool), got p0={self.p0!r}, p1={self.p1!r}"
            )
        if not 0 <= self.p0 < self.p1 <= cache.n_past:
            raise CacheError(
                f"edit [{self.p0}, {self.p1}) is not a non-empty span inside [0, n_past={cache.n_past})"
            )
        if not np.array_equal(cache.positions, np.arange(cache.n_past)):
            raise CacheError("edits need a cache holding one linear context (positions 0..n_past-1)")

    def suffix_length(self, cache: NexusCache) -> int:
        return cache.n_past - self.p1


def dirty(cache: NexusCache, edit: Edit) -> NexusCache:
    """A copy of the cache with ``e`` still in it."""
    edit.check(cache)
    return cache.copy()


def shift(cache: NexusCache, edit: Edit) -> NexusCache:
    """Remove ``e`` and move the suffix down by ``|e|`` (keys re-rotated, V unchanged)."""
    edit.check(cache)
    out = cache.copy()
    out.remove(edit.p0, edit.p1)
    out.shift(edit.p0, out.n_past, -edit.size)
    return out


def replay(model: nn.Module, cache: NexusCache, edit: Edit, executor: str = "packed") -> NexusCache:
    """Shift, then recompute every suffix row from the valid prefix."""
    if not isinstance(executor, str) or executor not in EXECUTORS:
        raise CacheError(f"executor {executor!r} is not one of {EXECUTORS}")
    edit.check(cache)
    if (cache.tokens[edit.p1 :] < 0).any():
        raise CacheError("the suffix has rows without token ids; cannot recompute it")
    out = shift(cache, edit)
    refresh(model, out, np.arange(edit.p0, out.n_past), executor)
    return out


def edited_tokens(cache: NexusCache, edit: Edit) -> np.ndarray:
    """Token ids of ``p + s`` (requires the cache to know its token ids)."""
    edit.check(cache)
    tokens = np.concatenate([cache.tokens[: edit.p0], cache.tokens[edit.p1 :]])
    if (tokens < 0).any():
        raise CacheError("the cache has rows without token ids; cannot rebuild the edited text")
    return tokens


def reprefill(model: nn.Module, cache: NexusCache, edit: Edit) -> NexusCache:
    """Prefill ``p + s`` into a fresh cache."""
    tokens = edited_tokens(cache, edit)
    out = make_cache(model, max_tokens=cache.max_tokens, v_layout=cache.v_layout)
    forward(model, tokens, out, logits="last")
    out.evaluate()
    return out
