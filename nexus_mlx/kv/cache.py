"""The nexus KV cache: per-layer K/V rows with an absolute position per row.

Contract:
- Rows ``[0, n_past)`` are live; row ``r`` of every layer holds the K/V of one token whose RoPE
  position is ``positions[r]`` and whose id is ``tokens[r]`` (-1 where K/V were written without
  token ids). Positions need not be contiguous or sorted: attention is masked
  by position, not by row order (see ``models.forward``). Live positions are distinct and lie
  in ``[0, position_limit)`` (the models' ``max_position_embeddings`` named by the RoPE specs,
  else ``2**31``); a write or shift that would break either is refused.
- K is stored ``(1, H_kv, capacity, D)``. V is row-major ``(1, H_kv, capacity, D)`` or
  token-innermost ``(1, H_kv, D, capacity)`` (``v_layout="transposed"``, used for soft-capped
  models as llama.cpp does without flash attention). Capacity grows in ``step``-row chunks up to
  ``max_tokens``.
- Range operations take half-open row ranges ``[p0, p1)`` inside ``[0, n_past)``: ``remove``,
  ``shift`` (positions move by ``delta``, keys are re-rotated by ``delta``, V unchanged),
  ``trim``, ``fork``. Bounds and deltas must be integers (``bool`` is refused). Every operation
  plans and validates all of its arguments before touching anything, so a failed operation
  leaves the cache exactly as it was (llama.cpp ``llama_memory_seq_*`` semantics); multi-step
  callers (splice, refresh) wrap their apply phase in :meth:`NexusCache.transaction`.
- What ``shift`` makes exact: the new positions (integers), V and every unmoved row (bit for
  bit). The moved keys are rotated once by the angle ``delta * inv_freq`` computed in float64,
  so one shift of a key rotated at ``p`` equals rotating it at ``p + delta`` up to one float32
  rotation's rounding (about an ulp of the key), however large ``p`` and ``delta`` are. Shifts
  do not compose exactly: each one rotates the stored, already rounded keys again, so ``n``
  shifts (a round trip +d / -d is two) drift by up to about ``n * 2**-22 * max|K|``. Nothing
  of the original rotation is kept; to place keys exactly after many moves, recompute the rows
  (``refresh``) or re-splice them from their compiled block (one re-anchor from the stored
  anchor).
- ``to_mlx_lm``/``from_mlx_lm`` convert to and from mlx-lm's cache list so that
  ``mlx_lm.generate_step(prompt_cache=...)`` can continue from a nexus cache.

It knows the per-layer RoPE specs (to re-rotate keys) but nothing about weights or tokens.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import mlx.core as mx
import numpy as np

from nexus_mlx.errors import CacheError, ModelMismatchError, PositionError
from nexus_mlx.kv.checks import check_distinct, check_positions, checked_tokens, int_array, is_int
from nexus_mlx.kv.rope import RopeSpec, reanchor
from nexus_mlx.kv.row_backup import RowBackup

V_LAYOUTS = ("row", "transposed")
MAX_POSITION = 2**31 - 1
MAX_SLICE_RUNS = 8  # a write in at most this many runs of rows stores one slice per run


@dataclass(frozen=True)
class WritePlan:
    """A validated write of ``len(rows)`` tokens: rows, their positions and the new n_past."""

    rows: np.ndarray  # (T,) int64
    positions: np.ndarray  # (T,) int64
    n_past_after: int

    @cached_property
    def runs(self) -> list[tuple[int, int]]:
        """Index ranges ``[a, b)`` of ``rows`` whose rows are consecutive (in the given order)."""
        breaks = np.flatnonzero(np.diff(self.rows) != 1) + 1
        bounds = np.concatenate([[0], breaks, [self.rows.size]]).astype(int).tolist()
        return list(zip(bounds[:-1], bounds[1:], strict=True))


class NexusCache:
    """K/V storage for every layer of one sequence (batch size 1)."""

    def __init__(
        self,
        rope_specs: Sequence[RopeSpec],
        n_kv_heads: int,
        head_dim: int,
        *,
        dtype: mx.Dtype = mx.float32,
        v_layout: str = "row",
        max_tokens: int | None = None,
        step: int = 256,
    ) -> None:
        if v_layout not in V_LAYOUTS:
            raise CacheError(f"v_layout {v_layout!r} is not one of {V_LAYOUTS}")
        if max_tokens is not None and max_tokens <= 0:
            raise CacheError(f"max_tokens must be positive, got {max_tokens}")
        if step <= 0:
            raise CacheError(f"step must be positive, got {step}")
        self.rope_specs = tuple(rope_specs)
        self.n_kv_heads = int(n_kv_heads)
        self.head_dim = int(head_dim)
        self.dtype = dtype
        self.v_layout = v_layout
        self.max_tokens = max_tokens
        self.step = step
        self.n_past = 0
        self.capacity = 0
        self._positions = np.zeros(0, dtype=np.int64)
        self._tokens = np.zeros(0, dtype=np.int64)
        self._keys: list[mx.array] = []
        self._values: list[mx.array] = []

    # ---- introspection ------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self.rope_specs)

    @property
    def positions(self) -> np.ndarray:
        """Absolute positions of the live rows, a copy ``(n_past,)``."""
        return self._positions[: self.n_past].copy()

    @property
    def tokens(self) -> np.ndarray:
        """Token ids of the live rows (-1 where unknown), a copy ``(n_past,)``."""
        return self._tokens[: self.n_past].copy()

    @property
    def next_position(self) -> int:
        """One past the largest live position (0 for an empty cache)."""
        return int(self._positions[: self.n_past].max()) + 1 if self.n_past else 0

    @property
    def position_limit(self) -> int:
        """One past the largest position a row may hold: the smallest
        ``max_position_embeddings`` among the RoPE specs (``2**31`` when none names one)."""
        limits = [s.max_position_embeddings for s in self.rope_specs if s.max_position_embeddings]
        return min(int(x) for x in limits) if limits else MAX_POSITION + 1

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in zip(self._keys, self._values, strict=True))

    def evaluate(self) -> None:
        """Force pending writes (MLX is lazy); executors call this to time their stages."""
        mx.eval(self._keys, self._values)

    def can_shift(self) -> bool:
        """Keys can be re-rotated to new positions (every layer has an invertible RoPE)."""
        return all(spec.dims > 0 for spec in self.rope_specs)

    def check_compatible(
        self, rope_specs: Sequence[RopeSpec], n_kv_heads: int, head_dim: int
    ) -> None:
        """Raise :class:`ModelMismatchError` unless this cache was shaped for a model with
        these per-layer RoPE specs and K/V head shape (checked before any model writes)."""
        problems = []
        if tuple(rope_specs) != self.rope_specs:
            problems.append(f"layers/RoPE specs: {len(rope_specs)} model layers vs "
                            f"{self.num_layers} cache layers, or differing specs")
        if (int(n_kv_heads), int(head_dim)) != (self.n_kv_heads, self.head_dim):
            problems.append(f"kv heads x head_dim: model {n_kv_heads}x{head_dim} != cache "
                            f"{self.n_kv_heads}x{self.head_dim}")
        if problems:
            raise ModelMismatchError("cache does not match the model: " + "; ".join(problems))

    def keys(self, layer: int) -> mx.array:
        """Live keys of ``layer``, ``(1, H_kv, n_past, D)``."""
        self._check_layer(layer)
        if not self._keys:
            return mx.zeros((1, self.n_kv_heads, 0, self.head_dim), self.dtype)
        return self._keys[layer][:, :, : self.n_past, :]

    def values(self, layer: int) -> mx.array:
        """Live values of ``layer`` in row-major form ``(1, H_kv, n_past, D)``."""
        self._check_layer(layer)
        if not self._values:
            return mx.zeros((1, self.n_kv_heads, 0, self.head_dim), self.dtype)
        if self.v_layout == "transposed":
            return self._values[layer][..., : self.n_past].swapaxes(-1, -2)
        return self._values[layer][:, :, : self.n_past, :]

    def stored_values(self, layer: int) -> mx.array:
        """Live values in their stored layout (``(1,H,n,D)`` or ``(1,H,D,n)``)."""
        self._check_layer(layer)
        if self.v_layout == "transposed":
            return self._values[layer][..., : self.n_past]
        return self._values[layer][:, :, : self.n_past, :]

    def __repr__(self) -> str:
        return (
            f"NexusCache(layers={self.num_layers}, n_past={self.n_past}, capacity={self.capacity}, "
            f"kv_heads={self.n_kv_heads}, head_dim={self.head_dim}, v_layout={self.v_layout!r}, "
            f"dtype={self.dtype})"
        )

    # ---- validation ---------------------------------------------------------------------
    def _check_layer(self, layer: int) -> None:
        if not 0 <= layer < self.num_layers:
            raise CacheError(f"layer {layer} is outside [0, {self.num_layers})")

    def _check_range(self, p0: int, p1: int) -> None:
        if not (is_int(p0) and is_int(p1)):
            raise CacheError(f"range bounds must be integers (not bool), got p0={p0!r}, p1={p1!r}")
        if p0 < 0 or p0 > p1 or p1 > self.n_past:
            raise CacheError(f"range [{p0}, {p1}) is not inside [0, n_past={self.n_past})")

    def _check_rows_fit(self, n_rows: int) -> None:
        if not is_int(n_rows) or n_rows < 0:
            raise CacheError(f"a row count must be a non-negative integer (not bool), got {n_rows!r}")
        if self.max_tokens is not None and n_rows > self.max_tokens:
            raise CacheError(
                f"{n_rows} rows needed but the cache holds at most max_tokens={self.max_tokens}"
            )

    def plan_write(
        self, rows: np.ndarray | Sequence[int] | None, positions: np.ndarray | Sequence[int]
    ) -> WritePlan:
        """Validate a write of ``len(positions)`` tokens. ``rows`` None appends at ``n_past``.

        Rows may overwrite live rows or extend past ``n_past``, but the live rows afterwards
        must be gap-free; rows must be distinct; positions must be in ``[0, position_limit)``
        and, together with the live rows that are not overwritten, distinct.
        """
        pos = int_array(positions, "positions", PositionError)
        check_positions(pos, self.position_limit)
        if rows is None:
            row_arr = np.arange(self.n_past, self.n_past + pos.size, dtype=np.int64)
        else:
            row_arr = int_array(rows, "rows", CacheError)
        if row_arr.size != pos.size:
            raise CacheError(f"{row_arr.size} rows for {pos.size} positions")
        if row_arr.size == 0:
            return WritePlan(row_arr, pos, self.n_past)
        if row_arr.min() < 0:
            raise CacheError(f"row {int(row_arr.min())} is negative")
        if np.unique(row_arr).size != row_arr.size:
            raise CacheError("rows must be distinct; got duplicates")
        n_after = max(self.n_past, int(row_arr.max()) + 1)
        new_rows = row_arr[row_arr >= self.n_past]
        if new_rows.size != n_after - self.n_past:
            raise CacheError(
                f"rows would leave gaps: writing {new_rows.size} rows past n_past={self.n_past} "
                f"but the highest row is {int(row_arr.max())}"
            )
        self._check_rows_fit(n_after)
        live = self._positions[: self.n_past]
        overwritten = row_arr[row_arr < self.n_past]
        check_distinct(np.delete(live, overwritten) if overwritten.size else live, pos)
        return WritePlan(row_arr, pos, n_after)

    # ---- storage growth -----------------------------------------------------------------
    def _v_shape(self, n: int) -> tuple[int, ...]:
        if self.v_layout == "transposed":
            return (1, self.n_kv_heads, self.head_dim, n)
        return (1, self.n_kv_heads, n, self.head_dim)

    def reserve(self, n_rows: int) -> None:
        """Make room for ``n_rows`` rows (grows in ``step`` chunks, never past max_tokens)."""
        self._check_rows_fit(n_rows)
        if n_rows <= self.capacity:
            return
        new_cap = math.ceil(n_rows / self.step) * self.step
        if self.max_tokens is not None:
            new_cap = min(new_cap, self.max_tokens)
        extra = new_cap - self.capacity
        # One fresh array per layer: rows are later written in place (``a[...] = x``), so
        # layers must never share an array object.
        k_shape = (1, self.n_kv_heads, extra, self.head_dim)
        v_axis = -1 if self.v_layout == "transposed" else 2
        if not self._keys:
            self._keys = [mx.zeros(k_shape, self.dtype) for _ in range(self.num_layers)]
            self._values = [mx.zeros(self._v_shape(extra), self.dtype) for _ in range(self.num_layers)]
        else:
            k_pad = mx.zeros(k_shape, self.dtype)
            v_pad = mx.zeros(self._v_shape(extra), self.dtype)
            self._keys = [mx.concatenate([k, k_pad], axis=2) for k in self._keys]
            self._values = [mx.concatenate([v, v_pad], axis=v_axis) for v in self._values]
        self._positions = np.concatenate([self._positions, np.zeros(extra, np.int64)])
        self._tokens = np.concatenate([self._tokens, np.full(extra, -1, np.int64)])
        self.capacity = new_cap

    # ---- writes (used by the engine and by splice) --------------------------------------
    def commit_positions(self, plan: WritePlan, tokens: np.ndarray | None = None) -> None:
        """Record a validated write's positions, token ids and cursor (reserving storage).

        The plan is checked again against the cache as it is now (a stale plan is refused)."""
        checked = self.plan_write(plan.rows, plan.positions)
        if checked.n_past_after != plan.n_past_after:
            raise CacheError(
                f"stale write plan: it ends at n_past={plan.n_past_after}, the cache now gives "
                f"{checked.n_past_after}"
            )
        ids = checked_tokens(tokens, plan.rows.size)
        self.reserve(plan.n_past_after)
        self._positions[plan.rows] = plan.positions
        self._tokens[plan.rows] = -1 if ids is None else ids
        self.n_past = plan.n_past_after

    def record_tokens(self, rows: np.ndarray | Sequence[int], tokens: np.ndarray | Sequence[int]) -> None:
        """Set the token ids of live ``rows`` whose K/V were written before their ids were
        known on the host (a pipelined decode step feeds the sampled token without reading it);
        K/V and positions are untouched."""
        row_arr = int_array(rows, "rows", CacheError)
        ids = checked_tokens(tokens, row_arr.size)
        if row_arr.size and (row_arr.min() < 0 or row_arr.max() >= self.n_past):
            raise CacheError(f"rows to label must lie in [0, n_past={self.n_past})")
        if ids is not None:
            self._tokens[row_arr] = ids

    def write_layer(self, layer: int, plan: WritePlan, k: mx.array, v: mx.array) -> None:
        """Write ``k, v (1, H_kv, T, D)`` into the rows of ``plan`` for one layer (after
        :meth:`commit_positions` recorded the plan): a slice per run of consecutive rows up to
        :data:`MAX_SLICE_RUNS` runs, else one scatter (~6 us a slice, ~80 us a scatter on the
        CPU: 30 layers of SmolLM2 K/V, 64 rows in 4 runs, 2.3 ms against 6.0 ms)."""
        self._check_layer(layer)
        if plan.rows.size == 0:
            return
        if plan.n_past_after > self.n_past:
            raise CacheError("commit the plan's positions (commit_positions) before its K/V")
        want = (1, self.n_kv_heads, plan.rows.size, self.head_dim)
        if tuple(k.shape) != want or tuple(v.shape) != want:
            raise CacheError(f"layer {layer}: K {k.shape} / V {v.shape}, expected {want}")
        k = k.astype(self.dtype)
        v = v.astype(self.dtype)
        if len(plan.runs) > MAX_SLICE_RUNS:
            self._store(layer, mx.array(plan.rows.astype(np.int32)), k, v)
            return
        for a, b in plan.runs:
            r0 = int(plan.rows[a])
            self._store(layer, slice(r0, r0 + b - a), k[:, :, a:b], v[:, :, a:b])

    def _store(self, layer: int, place: slice | mx.array, k: mx.array, v: mx.array) -> None:
        """Store ``k, v (1, H_kv, n, D)`` in the ``n`` rows ``place`` names of one layer."""
        self._keys[layer][:, :, place, :] = k
        if self.v_layout == "transposed":
            self._values[layer][..., place] = v.swapaxes(-1, -2)
        else:
            self._values[layer][:, :, place, :] = v

    def write(
        self,
        positions: np.ndarray | Sequence[int],
        keys: Sequence[mx.array],
        values: Sequence[mx.array],
        rows: np.ndarray | Sequence[int] | None = None,
        tokens: np.ndarray | Sequence[int] | None = None,
    ) -> WritePlan:
        """Write precomputed K/V (one ``(1, H_kv, T, D)`` pair per layer) at ``rows``, with
        their token ids if known."""
        plan = self.plan_write(rows, positions)
        ids = checked_tokens(tokens, plan.rows.size)
        if len(keys) != self.num_layers or len(values) != self.num_layers:
            raise CacheError(
                f"need K and V for {self.num_layers} layers, got {len(keys)} and {len(values)}"
            )
        want = (1, self.n_kv_heads, plan.rows.size, self.head_dim)
        for i, (k, v) in enumerate(zip(keys, values, strict=True)):
            if tuple(k.shape) != want or tuple(v.shape) != want:
                raise CacheError(f"layer {i}: K {k.shape} / V {v.shape}, expected {want}")
        with self.transaction():  # only rows past n_past are written: restoring metadata suffices
            self.commit_positions(plan, ids)
            for i, (k, v) in enumerate(zip(keys, values, strict=True)):
                self.write_layer(i, plan, k, v)
        return plan

    # ---- rollback -------------------------------------------------------------------------
    @contextmanager
    def transaction(self, rows: np.ndarray | Sequence[int] = ()) -> Iterator[None]:
        """Restore the cache's live state if the block raises.

        Saves ``n_past``, positions, token ids, the storage arrays and the K/V of the given
        live ``rows`` (evaluated copies of those rows only, so the big buffers can still be
        written in place); on an exception they are put back and the exception propagates.
        The block may overwrite only ``rows`` among the live rows (anything past ``n_past`` is
        free); callers validate first, so this guards the apply phase against failures no
        plan can foresee (out of memory, an interrupted evaluation, a bug).
        """
        saved_rows = int_array(rows, "rows", CacheError)
        if saved_rows.size and (saved_rows.min() < 0 or saved_rows.max() >= self.n_past):
            raise CacheError(f"rows to save must lie in [0, n_past={self.n_past})")
        state = (self.n_past, self.capacity, self._positions.copy(), self._tokens.copy(),
                 list(self._keys), list(self._values))
        backup = (RowBackup.save(self._keys, self._values, saved_rows,
                                 self.v_layout == "transposed") if saved_rows.size else None)
        try:
            yield
        except BaseException:
            (self.n_past, self.capacity, self._positions, self._tokens,
             self._keys, self._values) = state
            if backup is not None:
                backup.put_back(self._keys, self._values)
            raise

    # ---- range operations ---------------------------------------------------------------
    def remove(self, p0: int, p1: int) -> None:
        """Delete rows ``[p0, p1)``; later rows move down, keeping their positions."""
        self._check_range(p0, p1)
        n = p1 - p0
        if n == 0:
            return
        keep = np.r_[0:p0, p1:self.capacity]
        pad_k = mx.zeros((1, self.n_kv_heads, n, self.head_dim), self.dtype)
        pad_v = mx.zeros(self._v_shape(n), self.dtype)
        # joined slices, not a row gather: a copy at memory speed
        self._keys = [mx.concatenate([k[:, :, :p0], k[:, :, p1:], pad_k], axis=2)
                      for k in self._keys]
        if self.v_layout == "transposed":
            self._values = [mx.concatenate([v[..., :p0], v[..., p1:], pad_v], axis=-1)
                            for v in self._values]
        else:
            self._values = [mx.concatenate([v[:, :, :p0], v[:, :, p1:], pad_v], axis=2)
                            for v in self._values]
        self._positions = np.concatenate([self._positions[keep], np.zeros(n, np.int64)])
        self._tokens = np.concatenate([self._tokens[keep], np.full(n, -1, np.int64)])
        self.n_past -= n

    def shift(self, p0: int, p1: int, delta: int) -> None:
        """Move rows ``[p0, p1)`` by ``delta`` positions, re-rotating their keys by ``delta``.

        One shift matches a fresh rotation at the new positions up to float32 rounding;
        repeated shifts accumulate that rounding (see the module docstring)."""
        self._check_range(p0, p1)
        if not is_int(delta):
            raise CacheError(f"delta must be an integer (not bool), got {delta!r}")
        if p0 == p1 or delta == 0:
            return
        if not self.can_shift():
            raise CacheError("this cache's RoPE specs cannot re-rotate keys")
        moved = self._positions[p0:p1] + int(delta)
        check_positions(moved, self.position_limit,
                        f"shifting rows [{p0}, {p1}) by {delta} gives position")
        others = np.concatenate([self._positions[:p0], self._positions[p1 : self.n_past]])
        check_distinct(others, moved)
        # plan: every new key block is built (lazily) before the first one is stored
        rotated = [
            reanchor(self._keys[layer][:, :, p0:p1, :], int(delta), spec)
            for layer, spec in enumerate(self.rope_specs)
        ]
        for layer, k in enumerate(rotated):
            self._keys[layer][:, :, p0:p1, :] = k
        self._positions[p0:p1] = moved

    def trim(self, n: int) -> None:
        """Keep only rows ``[0, n)``."""
        self._check_range(n, self.n_past)
        self.n_past = int(n)

    def fork(self, p0: int = 0, p1: int | None = None) -> NexusCache:
        """A new cache holding a copy of rows ``[p0, p1)`` (default: all live rows)."""
        p1 = self.n_past if p1 is None else p1
        self._check_range(p0, p1)
        other = NexusCache(
            self.rope_specs, self.n_kv_heads, self.head_dim, dtype=self.dtype,
            v_layout=self.v_layout, max_tokens=self.max_tokens, step=self.step,
        )
        n = p1 - p0
        if n == 0:
            return other
        other.reserve(n)
        other._positions[:n] = self._positions[p0:p1]
        other._tokens[:n] = self._tokens[p0:p1]
        other.n_past = n
        for layer in range(self.num_layers):
            other._keys[layer][:, :, :n, :] = self._keys[layer][:, :, p0:p1, :]
            if self.v_layout == "transposed":
                other._values[layer][..., :n] = self._values[layer][..., p0:p1]
            else:
                other._values[layer][:, :, :n, :] = self._values[layer][:, :, p0:p1, :]
        mx.eval(other._keys, other._values)
        return other

    def copy(self) -> NexusCache:
        """An independent copy of the whole cache."""
        return self.fork()

    # ---- mlx-lm interoperability (:mod:`nexus_mlx.kv.interop`) --------------------------
    def to_mlx_lm(self, model: Any) -> list[Any]:
        """mlx-lm caches holding the same rows (positions must be exactly ``0..n_past-1``)."""
        from nexus_mlx.kv.interop import to_mlx_lm

        return to_mlx_lm(self, model)

    @classmethod
    def from_mlx_lm(
        cls,
        caches: Sequence[Any],
        rope_specs: Sequence[RopeSpec],
        *,
        v_layout: str = "row",
        max_tokens: int | None = None,
    ) -> NexusCache:
        """Build a nexus cache from mlx-lm ``KVCache`` objects (positions ``0..offset-1``)."""
        from nexus_mlx.kv.interop import from_mlx_lm

        return from_mlx_lm(caches, rope_specs, v_layout=v_layout, max_tokens=max_tokens, cls=cls)
