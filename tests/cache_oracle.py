"""Helpers shared by the cache-atomicity tests: byte snapshots of a :class:`NexusCache` and a
fresh prefill of the sequence a cache claims to hold.

``snapshot(cache)`` is everything a failed operation must leave alone: ``n_past``, capacity,
V layout, positions, token ids (live and stored) and every layer's whole K/V storage, as bytes.
``live_snapshot`` is the live part only (what ``NexusCache.transaction`` restores).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from nexus_mlx.kv.cache import NexusCache
from nexus_mlx.models.forward import forward, make_cache


def snapshot(cache: NexusCache) -> tuple[Any, ...]:
    """The whole state as bytes, storage past ``n_past`` included."""
    mx.eval(cache._keys, cache._values)
    return (
        cache.n_past,
        cache.capacity,
        cache.v_layout,
        cache._positions.tobytes(),
        cache._tokens.tobytes(),
        tuple(np.array(k).tobytes() for k in cache._keys),
        tuple(np.array(v).tobytes() for v in cache._values),
    )


def live_snapshot(cache: NexusCache) -> tuple[Any, ...]:
    """The live state as bytes: n_past, positions, token ids and each layer's live K/V."""
    return (
        cache.n_past,
        cache.positions.tobytes(),
        cache.tokens.tobytes(),
        tuple(np.array(cache.keys(i)).tobytes() for i in range(cache.num_layers)),
        tuple(np.array(cache.stored_values(i)).tobytes() for i in range(cache.num_layers)),
    )


def fresh_prefill(model: Any, cache: NexusCache) -> tuple[NexusCache, np.ndarray]:
    """A fresh cache holding the tokens ``cache`` claims, at the same positions, prefilled in
    position order in one forward call; and, for each row of ``cache``, the matching row of
    the fresh one."""
    order = np.argsort(cache.positions, kind="stable")
    fresh = make_cache(model, max_tokens=cache.max_tokens, v_layout=cache.v_layout)
    if order.size:
        forward(model, cache.tokens[order], fresh, positions=cache.positions[order])
        fresh.evaluate()
    match = np.empty(order.size, np.int64)
    match[order] = np.arange(order.size)
    return fresh, match


def max_diff(a: Any, b: Any) -> float:
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b))) if a.size else 0.0
