"""Splice a compiled block into a live cache: re-anchor, write, then depth-adaptive repair.

Contract: ``splice(model, cache, block, at=None, curve=Curve())``
1. validates the block against the running model (fingerprint and every layer's RoPE spec) and
   the write against the cache, before touching anything;
2. writes the block's K/V into rows ``n_past .. n_past+S-1`` at positions ``at .. at+S-1``
   (default ``at`` = the cache's next position), every key re-rotated by ``delta = at - m0``
   (by the back-end's re-anchor kernel when there is one, ``nexus_mlx.kernels``);
3. re-decodes the trailing ``curve.tokens(S, n_past)`` block tokens through all layers (they see
   the live context and the spliced rows before them), unless the splice is *anchored*
   (``at == m0`` right after exactly the block's compile-time context), which is output-exact.
   At R = 100% every block row is recomputed: exactly a text prefill.
   With ``curve="sur"`` (beyond the paper: query-directed seam repair) the same number of block
   tokens as the default curve asks for is recomputed, but chosen by Semantic-Unit Refresh
   against the next query (``query`` and ``tokenizer`` required) instead of the trailing ones.

Paths reported in :class:`SpliceResult`: ``anchored`` (exact, nothing recomputed), ``bare``
(``curve=None``: no repair), ``repaired`` (R% of the block recomputed), ``prefill`` (R = 100%),
``declined`` (the back-end cannot do the transposed-V copy safely: the block was prefilled as
text instead — never silently). Timings are per stage, in seconds (pending lazy work on the input cache is evaluated before
the clock starts).

It evaluates arrays (it is an executor). It does not choose blocks or know about routing.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from nexus_mlx.blocks.atb import CompiledBlock, validate_block
from nexus_mlx.blocks.curve import Curve
from nexus_mlx.errors import ArgumentError
from nexus_mlx.kernels.reanchor_write import reanchored_rows
from nexus_mlx.kernels.splice_v_transposed import decline_reason
from nexus_mlx.kv.cache import NexusCache
from nexus_mlx.models.forward import forward
from nexus_mlx.sur.select import sur_select

SplicePath = Literal["anchored", "bare", "repaired", "prefill", "declined"]


@dataclass
class SpliceResult:
    path: SplicePath
    at: int  # position of the block's first token
    rows: tuple[int, int]  # cache rows [r0, r1) now holding the block
    delta: int  # re-anchoring shift applied to every key
    r_pct: float  # recompute percentage the curve asked for (0 for anchored/bare)
    recomputed: int  # block tokens re-decoded
    reason: str = ""
    timings: dict[str, float] = field(default_factory=dict)


def is_anchored(cache: NexusCache, block: CompiledBlock, at: int) -> bool:
    """True when the block lands where it was compiled, right after its compile-time context."""
    context = np.asarray(block.header.context, dtype=np.int64)
    return (
        at == block.m0
        and cache.n_past == block.m0 == context.size
        and np.array_equal(cache.positions, np.arange(cache.n_past))
        and np.array_equal(cache.tokens, context)
    )


def _write_block(cache: NexusCache, block: CompiledBlock, at: int, use_kernel: bool) -> None:
    delta = at - block.m0
    keys = [
        reanchored_rows(block.keys(i), delta, spec, cache.dtype, use_kernel=use_kernel)
        for i, spec in enumerate(cache.rope_specs)
    ]
    values = [block.values(i) for i in range(cache.num_layers)]
    cache.write(np.arange(at, at + block.num_tokens), keys, values, tokens=block.tokens)
    cache.evaluate()


def _check_curve(curve: object, query: Sequence[int] | None, tokenizer: Any) -> None:
    if curve == "sur":
        if query is None or len(query) == 0 or tokenizer is None:
            raise ArgumentError("curve='sur' needs the next query's tokens and a tokenizer")
    elif curve is not None and not isinstance(curve, Curve):
        raise ArgumentError(f"curve must be a Curve, 'sur' or None, got {curve!r}")


def _query_directed(
    model: nn.Module, tokenizer: Any, block: CompiledBlock, query: Sequence[int] | None, budget: int
) -> np.ndarray:
    return sur_select(model, tokenizer, np.asarray(block.tokens), np.asarray(query), budget)


def splice(
    model: nn.Module,
    cache: NexusCache,
    block: CompiledBlock,
    *,
    at: int | None = None,
    curve: Curve | Literal["sur"] | None = Curve(),  # noqa: B008  (frozen, immutable default)
    use_kernel: bool = True,
    query: Sequence[int] | None = None,
    tokenizer: Any = None,
) -> SpliceResult:
    """Splice ``block`` at position ``at`` (default: the cursor) and repair its seam."""
    timings: dict[str, float] = {}
    cache.evaluate()  # pending lazy work on the cache is not the splice's cost
    start = time.perf_counter()
    validate_block(block, model)
    _check_curve(curve, query, tokenizer)
    at = cache.next_position if at is None else at
    n_past, s = cache.n_past, block.num_tokens
    positions = np.arange(at, at + s)
    cache.plan_write(None, positions)  # raises, cache untouched, if the write is invalid
    timings["validate"] = time.perf_counter() - start
    rows = (n_past, n_past + s)
    base = SpliceResult("bare", at, rows, at - block.m0, 0.0, 0)

    declined = decline_reason() if cache.v_layout == "transposed" else None
    if declined is not None:
        t0 = time.perf_counter()
        mx.eval(forward(model, list(block.tokens), cache, positions=positions, logits="last"))
        timings["prefill"] = time.perf_counter() - t0
        base.path, base.recomputed, base.r_pct = "declined", s, 100.0
        base.reason = declined
        base.timings = timings
        return base

    anchored = is_anchored(cache, block, at)
    t0 = time.perf_counter()
    _write_block(cache, block, at, use_kernel)
    timings["copy"] = time.perf_counter() - t0
    if anchored:
        base.path = "anchored"
    elif curve is not None:
        trailing = Curve() if curve == "sur" else curve
        assert isinstance(trailing, Curve)
        base.r_pct = trailing.percent(n_past)
        base.recomputed = trailing.tokens(s, n_past)
        t0 = time.perf_counter()
        if curve == "sur":
            picked = _query_directed(model, tokenizer, block, query, base.recomputed)
        else:
            picked = np.arange(s - base.recomputed, s)
        timings["select"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        if picked.size:
            tokens = np.asarray(block.tokens)[picked]
            out = forward(model, tokens, cache, positions=positions[picked],
                          rows=rows[0] + picked, logits="last")
            mx.eval(out)
            cache.evaluate()
        timings["repair"] = time.perf_counter() - t0
        base.path = "prefill" if base.recomputed == s else "repaired"
    base.timings = timings
    return base
