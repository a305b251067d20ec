"""Conversion between a :class:`NexusCache` and mlx-lm's per-layer cache list.

Contract: ``to_mlx_lm(cache, model)`` returns ``make_prompt_cache(model)`` filled with the
cache's live rows, so that ``mlx_lm.generate_step(prompt_cache=...)`` continues from it; mlx-lm
caches know only an offset, so the positions must be exactly ``0..n_past-1`` in row order.
``from_mlx_lm(caches, rope_specs)`` builds a nexus cache at positions ``0..offset-1`` from
``KVCache`` objects (rotated or batched caches are refused). Both validate before building
anything and never modify their input.

It does not know about weights beyond ``make_prompt_cache`` (imported lazily).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from nexus_mlx.errors import CacheError
from nexus_mlx.kv.cache import NexusCache
from nexus_mlx.kv.rope import RopeSpec


def to_mlx_lm(cache: NexusCache, model: Any) -> list[Any]:
    """mlx-lm caches (``make_prompt_cache(model)``) holding the same rows."""
    if not np.array_equal(cache.positions, np.arange(cache.n_past)):
        raise CacheError(
            "mlx-lm caches need positions 0..n_past-1 in row order; this cache has "
            f"positions {cache.positions[:8].tolist()}..."
        )
    from mlx_lm.models.cache import make_prompt_cache

    caches = make_prompt_cache(model)
    if len(caches) != cache.num_layers:
        raise CacheError(f"model has {len(caches)} layers, cache has {cache.num_layers}")
    if cache.n_past:
        for layer, c in enumerate(caches):
            c.update_and_fetch(cache.keys(layer), cache.values(layer))
        mx.eval([c.keys for c in caches], [c.values for c in caches])
    return caches


def from_mlx_lm(
    caches: Sequence[Any],
    rope_specs: Sequence[RopeSpec],
    *,
    v_layout: str = "row",
    max_tokens: int | None = None,
    cls: type[NexusCache] = NexusCache,
) -> NexusCache:
    """Build a nexus cache from mlx-lm ``KVCache`` objects (positions ``0..offset-1``)."""
    if len(caches) != len(rope_specs):
        raise CacheError(f"{len(caches)} caches for {len(rope_specs)} RoPE specs")
    offsets = {int(c.offset) for c in caches}
    if len(offsets) != 1:
        raise CacheError(f"mlx-lm caches disagree on their offset: {sorted(offsets)}")
    n = offsets.pop()
    if n == 0:
        raise CacheError("cannot infer the head shape from empty mlx-lm caches")
    keys, values = [], []
    for i, c in enumerate(caches):
        if c.keys is None:
            raise CacheError(f"layer {i}: cache has offset {c.offset} but no keys")
        k, v = _live_rows(c)
        if k.shape[2] != c.offset or k.shape[0] != 1:
            raise CacheError(
                f"layer {i}: {type(c).__name__} holds {k.shape[2]} rows for offset "
                f"{c.offset} (rotated or batched caches cannot be converted)"
            )
        keys.append(k)
        values.append(v)
    first = keys[0]
    out = cls(rope_specs, first.shape[1], first.shape[3], dtype=first.dtype,
              v_layout=v_layout, max_tokens=max_tokens)
    out.write(np.arange(n), keys, values)
    return out


def _live_rows(c: Any) -> tuple[mx.array, mx.array]:
    """The first ``offset`` rows an mlx-lm cache holds (a rotated cache holds fewer)."""
    if hasattr(c, "keys_and_values"):
        return c.keys_and_values()  # type: ignore[no-any-return]
    return c.keys[..., : c.offset, :], c.values[..., : c.offset, :]
