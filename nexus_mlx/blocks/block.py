"""The in-memory compiled tool block: the K/V of one prefilled span of one model, and its check
against the running model.

Contract:
- A :class:`CompiledBlock` is the K/V of ``S`` consecutive tokens at RoPE positions
  ``m0 .. m0 + S - 1``, for every layer of one model, plus a :class:`BlockHeader` naming that
  model (:class:`ModelFingerprint`), its per-layer :class:`RopeSpec`, the token ids, the token
  ids that preceded the block when it was compiled (``context``), the dtype (float16, or
  float32 for exact CPU tests) and the V layout. Its arrays must have exactly the shapes and
  dtype the header implies, else :class:`FormatError`.
- A :class:`BlockHeader` checks itself when built and raises :class:`FormatError` listing every
  problem: it only holds values a version-1 ``.atb`` header can represent (u16 layer / head /
  head_dim counts, a u32 vocabulary, an architecture name of at most 12 ASCII bytes, token ids
  inside the vocabulary, positions inside ``[0, MAX_POSITION]``), so any header can be written.
- ``block_from_cache`` cuts one out of a :class:`NexusCache` (rows of consecutive positions and
  known token ids); it is lazy: K/V are evaluated when they are first used or written.
- ``validate_block(block, model)`` compares a block (or a bare header) with the running model
  (fingerprint and every layer's RoPE spec) and raises :class:`ModelMismatchError` listing each
  differing field; ``block_mismatches`` returns the same list. A block must pass it before it
  is spliced.

It does not know the file format: how a block is laid out, written, read and checksummed is
:mod:`nexus_mlx.blocks.atb` (a header read from a file carries its :class:`BlockLayout`, one
built in memory has none). It does not splice, re-anchor or recompute anything, and does not
know about routing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from nexus_mlx.errors import CacheError, FormatError, ModelMismatchError
from nexus_mlx.kv.cache import MAX_POSITION, V_LAYOUTS, NexusCache
from nexus_mlx.kv.rope import RopeSpec
from nexus_mlx.models.arch import model_plan
from nexus_mlx.models.fingerprint import ModelFingerprint, model_fingerprint

ITEMSIZE = {"float16": 2, "float32": 4}  # the dtypes a block may hold, bytes per element
MX_DTYPES = {"float16": mx.float16, "float32": mx.float32}
_U16_MAX = 2**16 - 1
_U32_MAX = 2**32 - 1
_ARCH_BYTES = 12


@dataclass(frozen=True)
class BlockLayout:
    """Where the sections of a written ``.atb`` file lie (byte offsets and sizes)."""

    meta_size: int
    k_offset: int
    k_size: int
    v_offset: int
    v_size: int

    @property
    def file_size(self) -> int:
        return self.v_offset + self.v_size


@dataclass(frozen=True)
class BlockHeader:
    """Everything in a block but its K/V. ``layout`` is set when read from a file."""

    fingerprint: ModelFingerprint
    rope_specs: tuple[RopeSpec, ...]
    m0: int
    tokens: tuple[int, ...]
    dtype: str = "float16"
    v_layout: str = "row"
    layout: BlockLayout | None = field(default=None, compare=False)
    # Token ids that preceded the block (positions 0..m0-1) when it was compiled; a splice at
    # m0 after exactly these tokens is anchored, i.e. output-exact. Empty when unknown.
    context: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        problems = _header_problems(self)
        if problems:
            raise FormatError("invalid block header: " + "; ".join(problems))

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def positions(self) -> np.ndarray:
        """RoPE positions of the block's tokens, ``m0 .. m0 + S - 1`` ``(S,)`` int64."""
        return np.arange(self.m0, self.m0 + self.num_tokens, dtype=np.int64)

    @property
    def k_shape(self) -> tuple[int, int, int, int]:
        fp = self.fingerprint
        return (fp.num_layers, fp.n_kv_heads, self.num_tokens, fp.head_dim)

    @property
    def v_shape(self) -> tuple[int, int, int, int]:
        layers, heads, s, d = self.k_shape
        return (layers, heads, d, s) if self.v_layout == "transposed" else (layers, heads, s, d)

    @property
    def section_size(self) -> int:
        """Bytes of the K section (and of the V section)."""
        return int(np.prod(self.k_shape)) * ITEMSIZE[self.dtype]


def _header_problems(h: BlockHeader) -> list[str]:
    fp = h.fingerprint
    problems = []
    if h.dtype not in ITEMSIZE:
        problems.append(f"dtype {h.dtype!r} is not one of {tuple(ITEMSIZE)}")
    if h.v_layout not in V_LAYOUTS:
        problems.append(f"v_layout {h.v_layout!r} is not one of {V_LAYOUTS}")
    if len(fp.architecture.encode("ascii", "replace")) > _ARCH_BYTES:
        problems.append(f"architecture {fp.architecture!r} is longer than {_ARCH_BYTES} bytes")
    for name in ("num_layers", "n_kv_heads", "head_dim"):
        if not 1 <= getattr(fp, name) <= _U16_MAX:
            problems.append(f"{name} {getattr(fp, name)} is outside [1, {_U16_MAX}]")
    if not 1 <= fp.vocab_size <= _U32_MAX:
        problems.append(f"vocab_size {fp.vocab_size} is outside [1, {_U32_MAX}]")
    if len(h.rope_specs) != fp.num_layers:
        problems.append(f"{len(h.rope_specs)} RoPE specs for num_layers={fp.num_layers}")
    problems += [
        f"layer {i} RoPE head_dim {spec.head_dim} != head_dim {fp.head_dim}"
        for i, spec in enumerate(h.rope_specs)
        if spec.head_dim != fp.head_dim
    ]
    bad_context = [t for t in h.context if not _is_int(t) or not 0 <= t < fp.vocab_size]
    if bad_context:
        problems.append(f"context token id {bad_context[0]!r} is outside [0, {fp.vocab_size})")
    if not h.tokens:
        problems.append("a block needs at least one token")
    else:
        bad = [t for t in h.tokens if not _is_int(t) or not 0 <= t < fp.vocab_size]
        if bad:
            problems.append(f"token id {bad[0]!r} is outside the vocabulary [0, {fp.vocab_size})")
    if not _is_int(h.m0) or h.m0 < 0 or h.m0 + max(len(h.tokens), 1) - 1 > MAX_POSITION:
        problems.append(
            f"positions m0={h.m0!r} .. m0 + S - 1 (S={len(h.tokens)}) are outside "
            f"[0, {MAX_POSITION}]"
        )
    return problems


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, eq=False)
class CompiledBlock:
    """A block's header and its K/V, each one array over all layers."""

    header: BlockHeader
    k: mx.array  # (L, H_kv, S, D)
    v: mx.array  # (L, H_kv, S, D) row layout, (L, H_kv, D, S) transposed layout

    def __post_init__(self) -> None:
        h = self.header
        want = MX_DTYPES.get(h.dtype)
        for name, arr, shape in (("K", self.k, h.k_shape), ("V", self.v, h.v_shape)):
            if tuple(arr.shape) != shape or arr.dtype != want:
                raise FormatError(
                    f"{name} is {tuple(arr.shape)} {arr.dtype}, the header needs {shape} "
                    f"{h.dtype} (v_layout={h.v_layout!r})"
                )

    @property
    def m0(self) -> int:
        return self.header.m0

    @property
    def tokens(self) -> tuple[int, ...]:
        return self.header.tokens

    @property
    def num_tokens(self) -> int:
        return self.header.num_tokens

    def _check_layer(self, layer: int) -> None:
        if not 0 <= layer < self.header.fingerprint.num_layers:
            raise CacheError(
                f"layer {layer} is outside [0, {self.header.fingerprint.num_layers})"
            )

    def keys(self, layer: int) -> mx.array:
        """Keys of ``layer``, rotated for positions ``m0 ..``, ``(1, H_kv, S, D)``."""
        self._check_layer(layer)
        return self.k[layer][None]

    def values(self, layer: int) -> mx.array:
        """Values of ``layer`` in row-major form ``(1, H_kv, S, D)`` (a view when transposed)."""
        v = self.stored_values(layer)
        return v.swapaxes(-1, -2) if self.header.v_layout == "transposed" else v

    def stored_values(self, layer: int) -> mx.array:
        """Values of ``layer`` in their stored layout (``(1,H,S,D)`` or ``(1,H,D,S)``)."""
        self._check_layer(layer)
        return self.v[layer][None]


def block_from_cache(
    model: nn.Module,
    cache: NexusCache,
    start: int = 0,
    stop: int | None = None,
    *,
    dtype: str = "float16",
    v_layout: str | None = None,
) -> CompiledBlock:
    """The block of cache rows ``[start, stop)`` (default: to ``n_past``), which must hold
    consecutive positions and known token ids. Lazy: K/V are evaluated when written."""
    stop = cache.n_past if stop is None else stop
    if not 0 <= start < stop <= cache.n_past:
        raise CacheError(f"rows [{start}, {stop}) are not a non-empty range inside "
                         f"[0, n_past={cache.n_past})")
    plan = model_plan(model)
    if (cache.rope_specs, cache.n_kv_heads, cache.head_dim) != (
        plan.rope_specs, plan.n_kv_heads, plan.head_dim
    ):
        raise ModelMismatchError(
            f"the cache (kv_heads={cache.n_kv_heads}, head_dim={cache.head_dim}, "
            f"{len(cache.rope_specs)} RoPE specs) was not made for this {plan.architecture} model"
        )
    positions, tokens = cache.positions[start:stop], cache.tokens[start:stop]
    m0 = int(positions[0])
    if not np.array_equal(positions, np.arange(m0, m0 + positions.size)):
        raise FormatError(
            f"rows [{start}, {stop}) hold positions {positions.tolist()}, not consecutive ones"
        )
    if (tokens < 0).any():
        raise FormatError(f"rows [{start}, {stop}) include rows without token ids")
    layout = v_layout or cache.v_layout
    header = BlockHeader(model_fingerprint(model), plan.rope_specs, m0,
                         tuple(int(t) for t in tokens), dtype, layout,
                         context=_context_tokens(cache, start))
    target = MX_DTYPES[dtype]
    k = mx.stack([cache.keys(i)[0, :, start:stop, :] for i in range(plan.num_layers)])
    v = mx.stack([cache.values(i)[0, :, start:stop, :] for i in range(plan.num_layers)])
    if layout == "transposed":
        v = v.swapaxes(-1, -2)
    return CompiledBlock(header, k.astype(target), v.astype(target))  # (L, H, S, D) / stored V


def _context_tokens(cache: NexusCache, start: int) -> tuple[int, ...]:
    """Token ids of rows ``[0, start)`` if they are known and at positions ``0..start-1``."""
    positions, tokens = cache.positions[:start], cache.tokens[:start]
    if not np.array_equal(positions, np.arange(start)) or (tokens < 0).any():
        return ()
    return tuple(int(t) for t in tokens)


# ---- validation against the running model ------------------------------------------------------
def block_mismatches(block: CompiledBlock | BlockHeader, model: nn.Module) -> list[str]:
    """Every way ``block`` differs from ``model``: ``field: block value != model value``."""
    header = block.header if isinstance(block, CompiledBlock) else block
    problems = header.fingerprint.mismatches(model_fingerprint(model))
    mine, theirs = header.rope_specs, model_plan(model).rope_specs
    if len(mine) != len(theirs):
        problems.append(f"RoPE layer count: {len(mine)} != {len(theirs)}")
    for i, (a, b) in enumerate(zip(mine, theirs, strict=False)):
        problems += [f"layer {i} rope {m}" for m in a.mismatches(b)]
    return problems


def validate_block(block: CompiledBlock | BlockHeader, model: nn.Module) -> None:
    """Raise :class:`ModelMismatchError` listing every field where ``block`` and ``model``
    differ (fingerprint and per-layer RoPE); a block must pass this before any splice."""
    problems = block_mismatches(block, model)
    if problems:
        raise ModelMismatchError(
            "compiled block does not match the model (block != model): " + "; ".join(problems)
        )
