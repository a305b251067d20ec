"""L0 radix arena: a fixed pool of sequence slots for exact-token warm-prefix reuse (paper 1).

Contract:
- Storage. ``RadixArena(model, slots=32, slot_tokens=N)`` allocates once, per layer, one K array
  ``(slots, H_kv, N, D)`` and one V array in the model's cache layout (``(slots, H_kv, N, D)``
  row-major or ``(slots, H_kv, D, N)`` transposed), in the model's compute dtype, and evaluates
  them. Slot ``s`` holds one *linear* context: rows ``[0, length)`` are the K/V of the tokens
  ``contents(s)`` at positions ``0..length-1``. The arena never allocates K/V storage again: the
  array objects, their shapes and ``nbytes`` are fixed for its lifetime.
- "No allocation on the hot path" under MLX's functional arrays: ``a[idx] = x`` records a
  ``slice_update``; when evaluated, MLX *donates* the input buffer to the result (an in-place
  write of the updated rows only) if nothing else references that buffer, and otherwise copies
  the whole array (measured on CPU for a 25 MB layer array: 0.1 ms for a 500-row update, 7 ms
  with an evaluated view alive, 240 ms with a lazy one). So the arena never hands out views:
  ``checkout`` copies rows *out* into a working cache and ``commit`` copies rows *in*, and each
  evaluates before returning, so no slice of an arena array outlives the call and every later
  update is in place in the pre-reserved buffers. The working cache ``checkout`` returns is the
  caller's: a fresh one is allocated per call unless ``into=`` passes one to reuse.
- Matching: ``lookup(tokens) -> Match(slot, prefix_len)`` is the longest common prefix, in exact
  token ids, of ``tokens`` with any slot's contents (ties go to the most recently used slot;
  ``slot`` is None when no slot shares even the first token). It is a compact scan, one
  vectorised comparison of the ``(slots, L)`` token table: O(slots * L) integer compares, tens
  of microseconds for 32 slots and L = 1024, while each reused token saves copying
  ``2 * layers * H_kv * D`` values (46 KB for SmolLM2-135M in fp32). A radix trie would make the
  lookup O(L), but needs node splits on insert and merges on eviction, in Python, to save time
  invisible next to that copy. What is "radix" is the invariant ``commit`` keeps: no slot's
  contents are a prefix of another slot's, so the slots are the leaves of the radix tree of the
  stored sequences and no slot is spent on a sequence another slot already holds.
- ``checkout(tokens)`` copies the best slot's first ``r`` rows into a working cache and returns
  ``(cache, r)``; the caller prefills ``tokens[r:]``. ``r = min(prefix_len, len(tokens) -
  min_remainder)`` (default ``min_remainder=1``: the last token is always left to prefill, since
  the next token's logits come from it). A hit moves the slot to most recently used.
- ``commit(cache)`` stores a finished sequence (its first ``slot_tokens`` rows: a longer one is
  truncated, and a prefix of a linear context is still one; ``Commit.truncated_tokens`` says how
  many rows were dropped). If a slot already holds it (or a longer sequence it prefixes) that
  slot is only marked most recently used ("dedup"); if a slot holds a prefix of it, that slot is
  overwritten ("extend"); otherwise it takes a free slot ("new") or evicts the least recently
  used one ("evict"). Refused with :class:`CacheError`: caches of another geometry, empty caches,
  positions other than ``0..n_past-1`` in row order, and unknown token ids (-1) in stored rows.
- Failure: every argument is validated before any state changes (plan -> apply), so a rejected
  call leaves the arena's contents, LRU order and stats, and an ``into`` cache, as they were.
  Should the copy itself fail, the target slot is left empty, never holding rows that disagree
  with its token ids.

It does not run the model (it never computes K/V), tokenize, or lock (the orchestrator's per-turn
lock serialises access). It trusts that a committed cache's rows are the K/V of its tokens: a
cache with an unrepaired splice seam would be served later as if it were exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from nexus_mlx.errors import CacheError
from nexus_mlx.kv.cache import NexusCache
from nexus_mlx.models.arch import model_plan
from nexus_mlx.models.forward import TokenInput, make_cache, token_ids

CommitAction = Literal["new", "extend", "evict", "dedup"]
_GEOMETRY = ("rope_specs", "n_kv_heads", "head_dim", "dtype", "v_layout")


@dataclass(frozen=True)
class Match:
    """The longest exact-token common prefix of a request with any slot (``slot`` None: none)."""

    slot: int | None
    prefix_len: int


@dataclass(frozen=True)
class Commit:
    """What ``commit`` did: the slot now holding the sequence and how it got there."""

    slot: int
    action: CommitAction
    stored_tokens: int  # length of the committed sequence kept (after truncation)
    truncated_tokens: int  # rows past slot_tokens that were not stored
    evicted_tokens: int  # length of the sequence evicted (0 unless action == "evict")


@dataclass(frozen=True)
class ArenaStats:
    """Counters since construction (or ``clear``)."""

    checkouts: int
    hits: int  # checkouts that reused at least one row
    misses: int
    requested_tokens: int  # sum of len(tokens) over checkouts
    warm_tokens: int  # rows copied out of the arena instead of being prefilled
    commits: int
    stored_tokens: int  # rows copied into the arena
    evictions: int

    @property
    def hit_rate(self) -> float:
        """Fraction of checkouts that reused a warm prefix."""
        return self.hits / self.checkouts if self.checkouts else 0.0

    @property
    def token_hit_rate(self) -> float:
        """Fraction of requested tokens served from the arena."""
        return self.warm_tokens / self.requested_tokens if self.requested_tokens else 0.0


@dataclass(frozen=True)
class _CommitPlan:
    slot: int
    action: CommitAction
    tokens: np.ndarray  # (n,) the ids to store
    truncated: int
    evicted: int


def _int_at_least(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise CacheError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


class RadixArena:
    """A fixed pool of ``slots`` linear contexts of up to ``slot_tokens`` rows each."""

    def __init__(
        self,
        model: nn.Module,
        slots: int = 32,
        *,
        slot_tokens: int,
        v_layout: str | None = None,
    ) -> None:
        self.slots = _int_at_least("slots", slots, 1)
        self.slot_tokens = _int_at_least("slot_tokens", slot_tokens, 1)
        template = make_cache(model, v_layout=v_layout)
        if template.max_tokens is not None and self.slot_tokens > template.max_tokens:
            raise CacheError(
                f"slot_tokens={self.slot_tokens} exceeds the model's {template.max_tokens} positions"
            )
        self.vocab_size = model_plan(model).vocab_size
        self.rope_specs = template.rope_specs
        self.n_kv_heads = template.n_kv_heads
        self.head_dim = template.head_dim
        self.dtype = template.dtype
        self.v_layout = template.v_layout
        self.max_tokens = template.max_tokens
        s, h, n, d = self.slots, self.n_kv_heads, self.slot_tokens, self.head_dim
        v_shape = (s, h, d, n) if self.v_layout == "transposed" else (s, h, n, d)
        # One array per layer and per K/V: they are updated in place, so never shared.
        self._keys = [mx.zeros((s, h, n, d), self.dtype) for _ in self.rope_specs]  # (S, H, N, D)
        self._values = [mx.zeros(v_shape, self.dtype) for _ in self.rope_specs]
        mx.eval(self._keys, self._values)
        self._tokens = np.full((s, n), -1, np.int64)  # (S, N) ids, -1 past each slot's length
        self._lengths = np.zeros(s, np.int64)  # (S,) 0 = free
        self._last_used = np.zeros(s, np.int64)  # (S,) LRU clock values
        self._clock = 0
        self._counts = dict.fromkeys(ArenaStats.__dataclass_fields__, 0)

    # ---- introspection ------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self.rope_specs)

    @property
    def nbytes(self) -> int:
        """Bytes of K/V storage (fixed at construction)."""
        return sum(k.nbytes + v.nbytes for k, v in zip(self._keys, self._values, strict=True))

    @property
    def lengths(self) -> np.ndarray:
        """Rows held by each slot, a copy ``(slots,)`` (0: free)."""
        return self._lengths.copy()

    @property
    def occupied(self) -> int:
        return int(np.count_nonzero(self._lengths))

    @property
    def stats(self) -> ArenaStats:
        return ArenaStats(**self._counts)

    def contents(self, slot: int) -> np.ndarray:
        """Token ids held by ``slot``, a copy ``(length,)``."""
        self._check_slot(slot)
        return self._tokens[slot, : self._lengths[slot]].copy()

    def lru_order(self) -> list[int]:
        """Occupied slots from least to most recently used (the first is evicted next)."""
        used = np.flatnonzero(self._lengths)
        return [int(s) for s in used[np.argsort(self._last_used[used], kind="stable")]]

    def __repr__(self) -> str:
        return (
            f"RadixArena(slots={self.slots}, slot_tokens={self.slot_tokens}, "
            f"occupied={self.occupied}, layers={self.num_layers}, kv_heads={self.n_kv_heads}, "
            f"head_dim={self.head_dim}, v_layout={self.v_layout!r}, dtype={self.dtype}, "
            f"nbytes={self.nbytes})"
        )

    # ---- validation ---------------------------------------------------------------------
    def _check_slot(self, slot: int) -> None:
        if not isinstance(slot, int | np.integer) or not 0 <= slot < self.slots:
            raise CacheError(f"slot {slot!r} is outside [0, {self.slots})")

    def _check_geometry(self, cache: object, what: str) -> NexusCache:
        if not isinstance(cache, NexusCache):
            raise CacheError(f"{what} must be a NexusCache, got {type(cache).__name__}")
        diff = [
            f"{f}: arena {getattr(self, f)!r}, {what} {getattr(cache, f)!r}"
            for f in _GEOMETRY
            if getattr(self, f) != getattr(cache, f)
        ]
        if diff:
            raise CacheError(f"{what} does not match the arena's geometry: " + "; ".join(diff))
        return cache

    # ---- matching -----------------------------------------------------------------------
    def _prefix_lengths(self, ids: np.ndarray) -> np.ndarray:
        """``(slots,)`` common-prefix length of ``ids`` with every slot (0 for free slots)."""
        n = min(ids.size, self.slot_tokens, int(self._lengths.max()))
        if n == 0:
            return np.zeros(self.slots, np.int64)
        differs = self._tokens[:, :n] != ids[:n]  # (S, n); the -1 padding never matches
        lcp: np.ndarray = np.where(differs.any(axis=1), differs.argmax(axis=1), n)
        return lcp

    def _best(self, lcp: np.ndarray) -> Match:
        best = int(lcp.max())
        if best == 0:
            return Match(None, 0)
        ties = np.flatnonzero(lcp == best)
        return Match(int(ties[np.argmax(self._last_used[ties])]), best)

    def lookup(self, tokens: TokenInput) -> Match:
        """The slot sharing the longest exact-token prefix with ``tokens``. Changes nothing."""
        return self._best(self._prefix_lengths(token_ids(tokens, self.vocab_size)))

    # ---- checkout -----------------------------------------------------------------------
    def _rows(self, slot: int, layer: int, n: int) -> tuple[mx.array, mx.array]:
        """Lazy views of ``slot``'s first ``n`` rows: K and row-major V, ``(1, H, n, D)``."""
        k = self._keys[layer][slot : slot + 1, :, :n, :]
        if self.v_layout == "transposed":
            return k, self._values[layer][slot : slot + 1, :, :, :n].swapaxes(-1, -2)
        return k, self._values[layer][slot : slot + 1, :, :n, :]

    def _touch(self, slot: int) -> None:
        self._clock += 1
        self._last_used[slot] = self._clock

    def checkout(
        self, tokens: TokenInput, *, into: NexusCache | None = None, min_remainder: int = 1
    ) -> tuple[NexusCache, int]:
        """A working cache holding the warm prefix of ``tokens`` and its length ``r``: rows
        ``[0, r)`` at positions ``0..r-1``; the caller prefills ``tokens[r:]``.

        ``into`` (same geometry) is emptied and reused instead of allocating a new cache; room
        for ``len(tokens)`` rows is reserved either way. At least ``min_remainder`` tokens are
        left to prefill."""
        ids = token_ids(tokens, self.vocab_size)
        keep = _int_at_least("min_remainder", min_remainder, 0)
        match = self._best(self._prefix_lengths(ids))
        reuse = max(0, min(match.prefix_len, ids.size - keep))
        if into is not None:
            self._check_geometry(into, "into")
            if into.max_tokens is not None and reuse > into.max_tokens:
                raise CacheError(
                    f"{reuse} warm rows do not fit into a cache of max_tokens={into.max_tokens}"
                )
            cache = into
        else:
            cache = NexusCache(
                self.rope_specs, self.n_kv_heads, self.head_dim, dtype=self.dtype,
                v_layout=self.v_layout, max_tokens=self.max_tokens,
            )
        room = ids.size if cache.max_tokens is None else min(ids.size, cache.max_tokens)
        # ---- apply (everything is validated) ----
        cache.trim(0)
        cache.reserve(room)  # room >= reuse: checked above
        if reuse:
            assert match.slot is not None
            rows = [self._rows(match.slot, layer, reuse) for layer in range(self.num_layers)]
            cache.write(
                np.arange(reuse), [k for k, _ in rows], [v for _, v in rows], tokens=ids[:reuse]
            )
            del rows
            cache.evaluate()  # the views into the arena die here (see the module docstring)
            self._touch(match.slot)
        c = self._counts
        c["checkouts"] += 1
        c["hits" if reuse else "misses"] += 1
        c["requested_tokens"] += int(ids.size)
        c["warm_tokens"] += reuse
        return cache, reuse

    # ---- commit -------------------------------------------------------------------------
    def _plan_commit(self, cache: object) -> _CommitPlan:
        cache = self._check_geometry(cache, "cache")
        n_past = cache.n_past
        if n_past == 0:
            raise CacheError("cannot commit an empty cache (n_past == 0)")
        positions = cache.positions
        linear = np.arange(n_past)
        if not np.array_equal(positions, linear):
            row = int(np.flatnonzero(positions != linear)[0])
            raise CacheError(
                f"only linear contexts can be stored: row {row} has position "
                f"{int(positions[row])}, expected positions 0..{n_past - 1} in row order"
            )
        n = min(n_past, self.slot_tokens)
        ids = cache.tokens[:n]
        if ids.min() < 0:
            row = int(np.flatnonzero(ids < 0)[0])
            raise CacheError(
                f"row {row} has no token id (-1): K/V written without ids cannot be matched"
            )
        lcp = self._prefix_lengths(ids)
        covering = np.flatnonzero(lcp == n)  # slots already holding ids (or a longer sequence)
        if covering.size:
            slot = int(covering[np.argmax(self._last_used[covering])])
            return _CommitPlan(slot, "dedup", ids, n_past - n, 0)
        prefixed = np.flatnonzero((lcp == self._lengths) & (self._lengths > 0))
        assert prefixed.size <= 1, "radix invariant: no slot is a prefix of another"
        if prefixed.size:
            return _CommitPlan(int(prefixed[0]), "extend", ids, n_past - n, 0)
        free = np.flatnonzero(self._lengths == 0)
        if free.size:
            return _CommitPlan(int(free[0]), "new", ids, n_past - n, 0)
        slot = self.lru_order()[0]
        return _CommitPlan(slot, "evict", ids, n_past - n, int(self._lengths[slot]))

    def commit(self, cache: NexusCache) -> Commit:
        """Store ``cache``'s sequence (its first ``slot_tokens`` rows) and mark it most recently
        used; see the module docstring for the dedup / extend / new / evict rules."""
        plan = self._plan_commit(cache)
        n, slot = plan.tokens.size, plan.slot
        if plan.action != "dedup":
            self._lengths[slot] = 0  # the slot is empty while its rows are being replaced
            self._tokens[slot] = -1
            for layer in range(self.num_layers):
                self._keys[layer][slot : slot + 1, :, :n, :] = cache.keys(layer)[:, :, :n, :]
                stored_v = cache.stored_values(layer)
                if self.v_layout == "transposed":
                    self._values[layer][slot : slot + 1, :, :, :n] = stored_v[..., :n]
                else:
                    self._values[layer][slot : slot + 1, :, :n, :] = stored_v[:, :, :n, :]
            mx.eval(self._keys, self._values)  # in place: the arena buffers are donated
            self._tokens[slot, :n] = plan.tokens
            self._lengths[slot] = n
            self._counts["stored_tokens"] += n
        self._touch(slot)
        self._counts["commits"] += 1
        self._counts["evictions"] += int(plan.action == "evict")
        return Commit(slot, plan.action, n, plan.truncated, plan.evicted)

    def clear(self) -> None:
        """Forget every stored sequence and reset the stats; the storage stays allocated."""
        self._tokens.fill(-1)
        self._lengths.fill(0)
        self._last_used.fill(0)
        self._clock = 0
        self._counts = dict.fromkeys(ArenaStats.__dataclass_fields__, 0)
