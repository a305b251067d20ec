"""Splice a compiled block into a live cache: re-anchor, write, then depth-adaptive repair.

Contract: ``splice(model, cache, block, at=None, curve=Curve())`` is ``plan_splice`` then
``apply_splice``:
1. ``plan_splice`` validates everything before touching anything: the block against the running
   model (fingerprint and every layer's RoPE spec), the cache against the model (layers, RoPE
   specs, K/V head shape), ``at`` (an integer, not a bool), the block's positions
   ``at .. at+S-1`` against the model's ``max_position_embeddings``, the write against the
   cache (rows, capacity, no position already held by a live row), the curve, and the whole
   seam repair it will run (which block tokens, at which positions and rows; for
   ``curve="sur"`` the selection itself is computed here). It returns a :class:`SplicePlan`.
   A refused splice raises (``ModelMismatchError``, ``PositionError``, ``CacheError``,
   ``ArgumentError``) and the cache is exactly as it was.
2. ``apply_splice`` places the block in rows ``n_past .. n_past+S-1`` at positions
   ``at .. at+S-1`` (default ``at`` = the cache's next position): the K/V of the rows it keeps
   are copied from the block, every key re-rotated by ``delta = at - m0`` (by the back-end's
   re-anchor kernel when there is one, ``nexus_mlx.kernels``), and the planned block tokens are
   re-decoded through all layers (written once, by that pass): the
   trailing ``curve.tokens(S, n_past)`` ones (they see the live context and the spliced rows
   before them), unless the splice is *anchored* (``at == m0`` right after exactly the block's
   compile-time context), which is output-exact. At R = 100% every block row is recomputed:
   exactly a text prefill. With ``curve="sur"`` (beyond the paper: query-directed seam repair)
   the same number of block tokens as the default curve asks for is recomputed, but chosen by
   Semantic-Unit Refresh against the next query (``query`` and ``tokenizer`` required) instead
   of the trailing ones; when that number is the whole block nothing is scored (a choice of
   all rows is no choice). ``curve="model"`` is the curve calibrated for this model
   (:func:`~nexus_mlx.blocks.curve_table.curve_for`; the paper's ``Curve()`` when it has none).
   It runs inside ``cache.transaction()``: should anything fail there
   (nothing a plan can foresee), the live rows, positions, token ids and ``n_past`` are put back.

One pass per turn: ``append`` (e.g. the next request's tokens, at positions right after the
block) is run in the same forward call as the seam repair, so the repaired block rows and the
appended tokens advance through each layer together, and ``SpliceResult.logits`` holds the last
appended token's logits ``(1, 1, vocab)``. Only the block rows that are *not* recomputed are
copied from the block (every row's position and token id is committed first, so the recomputed
rows are written once, by the forward pass): at R = 100% nothing is copied and the splice is one
text prefill of block + appended tokens.

Paths reported in :class:`SpliceResult`: ``anchored`` (exact, nothing recomputed), ``bare``
(``curve=None``: no repair), ``repaired`` (R% of the block recomputed), ``prefill`` (R = 100%),
``declined`` (the back-end cannot do the transposed-V copy safely: the block was prefilled as
text instead — never silently). Timings are per stage, in seconds (pending lazy work on the
input cache is evaluated before the clock starts).

Exactness: ``anchored``, ``prefill`` and ``declined`` equal a text prefill (within float32
rounding) when the rows before the block do. ``bare`` and ``repaired`` are not exact: layer 0's
K/V of the block (which depend on token and position only) equal a prefill's within one
re-anchor's rounding, V bit for bit from the block, but deeper layers still encode the block's
compile-time context; the recomputed rows are exact only when everything before them is.

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

from nexus_mlx.blocks.block import CompiledBlock, validate_block
from nexus_mlx.blocks.curve import Curve
from nexus_mlx.blocks.curve_table import curve_for
from nexus_mlx.errors import ArgumentError, CacheError, PositionError
from nexus_mlx.kernels.reanchor_write import reanchored_rows
from nexus_mlx.kernels.splice_v_transposed import decline_reason
from nexus_mlx.kv.cache import NexusCache, WritePlan
from nexus_mlx.kv.checks import is_int
from nexus_mlx.models.arch import model_plan
from nexus_mlx.models.forward import forward, token_ids
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
    logits: mx.array | None = None  # (1, 1, vocab) of the last appended token, if any


@dataclass(frozen=True)
class SplicePlan:
    """A validated splice: where the block goes and what the seam repair recomputes."""

    path: SplicePath
    at: int
    positions: np.ndarray  # (S,) positions of the block's tokens
    rows: tuple[int, int]  # cache rows [r0, r1) the block will occupy
    delta: int  # re-anchoring shift of every key
    r_pct: float
    picked: np.ndarray  # (R,) sorted block indices re-decoded after the write
    keys: tuple[mx.array, ...] = ()  # re-anchored block keys per layer (lazy); empty if declined
    reason: str = ""
    append: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (Q,) token ids


def is_anchored(cache: NexusCache, block: CompiledBlock, at: int) -> bool:
    """True when the block lands where it was compiled, right after its compile-time context."""
    context = np.asarray(block.header.context, dtype=np.int64)
    return (
        at == block.m0
        and cache.n_past == block.m0 == context.size
        and np.array_equal(cache.positions, np.arange(cache.n_past))
        and np.array_equal(cache.tokens, context)
    )


def _check_curve(curve: object, query: Sequence[int] | None, tokenizer: Any) -> None:
    if isinstance(curve, str) and curve == "sur":
        if query is None or len(query) == 0 or tokenizer is None:
            raise ArgumentError("curve='sur' needs the next query's tokens and a tokenizer")
    elif curve is not None and not isinstance(curve, Curve) and curve != "model":
        raise ArgumentError(f"curve must be a Curve, 'sur', 'model' or None, got {curve!r}")


def _check_at(at: object, cache: NexusCache) -> int:
    if at is None:
        return cache.next_position
    if not is_int(at):
        raise ArgumentError(f"at must be an integer position (not bool) or None, got {at!r}")
    if at < 0:
        raise PositionError(f"at={at} is negative")
    return int(at)


def _query_directed(
    model: nn.Module, tokenizer: Any, block: CompiledBlock, query: Sequence[int] | None, budget: int
) -> np.ndarray:
    return sur_select(model, tokenizer, np.asarray(block.tokens), np.asarray(query), budget)


def _checked_pick(picked: np.ndarray, size: int, s: int) -> np.ndarray:
    arr = np.asarray(picked, dtype=np.int64).reshape(-1)
    if (arr.size != size or (arr.size and (arr.min() < 0 or arr.max() >= s))
            or (arr.size > 1 and not np.all(np.diff(arr) > 0))):
        raise ArgumentError(
            f"seam selection must be {size} sorted, distinct block indices in [0, {s}), "
            f"got {arr.tolist()}"
        )
    return arr


def plan_splice(
    model: nn.Module,
    cache: NexusCache,
    block: CompiledBlock,
    *,
    at: int | None = None,
    curve: Curve | Literal["sur", "model"] | None = Curve(),  # noqa: B008  (frozen, immutable)
    use_kernel: bool = True,
    query: Sequence[int] | None = None,
    tokenizer: Any = None,
    timings: dict[str, float] | None = None,
    append: Sequence[int] | np.ndarray | None = None,
) -> SplicePlan:
    """Validate a splice completely (see the module docstring); nothing is modified."""
    timings = {} if timings is None else timings
    start = time.perf_counter()
    if not isinstance(block, CompiledBlock):
        raise ArgumentError(f"block must be a CompiledBlock, got {type(block).__name__}")
    validate_block(block, model)
    _check_curve(curve, query, tokenizer)
    if isinstance(curve, str) and curve == "model":
        curve = curve_for(model)
    mplan = model_plan(model)
    cache.check_compatible(mplan.rope_specs, mplan.n_kv_heads, mplan.head_dim)
    at = _check_at(at, cache)
    n_past, s = cache.n_past, block.num_tokens
    extra = (np.zeros(0, np.int64) if append is None or len(append) == 0
             else token_ids(append, mplan.vocab_size))
    total = s + extra.size
    if mplan.max_position is not None and at + total > mplan.max_position:
        raise PositionError(
            f"splicing {s} tokens (and appending {extra.size}) at {at} needs positions up to "
            f"{at + total - 1}, beyond the model's max_position_embeddings={mplan.max_position}"
        )
    positions = np.arange(at, at + s, dtype=np.int64)
    cache.plan_write(None, np.arange(at, at + total))  # rows, capacity, live collisions
    rows = (n_past, n_past + s)
    delta = at - block.m0
    if cache.v_layout == "transposed" and (declined := decline_reason()) is not None:
        timings["validate"] = time.perf_counter() - start
        return SplicePlan("declined", at, positions, rows, delta, 100.0,
                          np.arange(s, dtype=np.int64), reason=declined, append=extra)
    keys = tuple(  # lazy; never evaluated when every row is recomputed
        reanchored_rows(block.keys(i), delta, spec, cache.dtype, use_kernel=use_kernel)
        for i, spec in enumerate(cache.rope_specs)
    )
    timings["validate"] = time.perf_counter() - start
    none = np.zeros(0, np.int64)
    if is_anchored(cache, block, at):
        return SplicePlan("anchored", at, positions, rows, delta, 0.0, none, keys, append=extra)
    if curve is None:
        return SplicePlan("bare", at, positions, rows, delta, 0.0, none, keys, append=extra)
    trailing = curve if isinstance(curve, Curve) else Curve()
    r_pct, count = trailing.percent(n_past), trailing.tokens(s, n_past)
    t0 = time.perf_counter()
    if isinstance(curve, str) and 0 < count < s:  # "sur" choosing a part of the block
        picked = _query_directed(model, tokenizer, block, query, count)
    elif isinstance(curve, str):  # nothing or everything: no choice to score
        picked = np.arange(count, dtype=np.int64)
    else:
        picked = np.arange(s - count, s, dtype=np.int64)
    timings["select"] = time.perf_counter() - t0
    path: SplicePath = "prefill" if count == s else "repaired"
    return SplicePlan(path, at, positions, rows, delta, r_pct, _checked_pick(picked, count, s), keys,
                      append=extra)


def _kept_rows(a: mx.array, kept: np.ndarray, size: int) -> mx.array:
    """The rows ``kept`` (sorted) of a block tensor ``(1, H, S, D)``: a slice when they are a
    leading run, else a gather."""
    if kept.size == size:
        return a
    if kept[-1] == kept.size - 1:
        return a[:, :, : kept.size, :]
    return mx.take(a, mx.array(kept.astype(np.int32)), axis=2)


def apply_splice(
    model: nn.Module,
    cache: NexusCache,
    block: CompiledBlock,
    plan: SplicePlan,
    timings: dict[str, float] | None = None,
) -> SpliceResult:
    """Carry out a plan from :func:`plan_splice` on the cache it was made for, unchanged since:
    commit every row, copy the block rows that are kept, then one forward pass over the
    recomputed block rows and the appended tokens (timed as ``repair``)."""
    timings = {} if timings is None else timings
    if cache.n_past != plan.rows[0]:
        raise CacheError(f"stale splice plan: made at n_past={plan.rows[0]}, now {cache.n_past}")
    result = SpliceResult(plan.path, plan.at, plan.rows, plan.delta, plan.r_pct,
                          int(plan.picked.size), plan.reason, timings)
    s, extra = block.num_tokens, plan.append
    tokens = np.concatenate([np.asarray(block.tokens, dtype=np.int64), extra])  # (S + Q,)
    positions = np.arange(plan.at, plan.at + tokens.size, dtype=np.int64)
    r0 = plan.rows[0]
    run = np.concatenate([plan.picked, np.arange(s, tokens.size)])  # forwarded indices
    with cache.transaction():  # only rows past n_past are written: metadata restores it all
        t0 = time.perf_counter()
        if plan.path != "declined":
            write = cache.plan_write(None, positions)
            cache.commit_positions(write, tokens)
            kept = np.setdiff1d(np.arange(s), plan.picked)
            if kept.size:
                kept_plan = WritePlan(r0 + kept, positions[kept], write.n_past_after)
                for i in range(cache.num_layers):
                    cache.write_layer(i, kept_plan, _kept_rows(plan.keys[i], kept, s),
                                      _kept_rows(block.values(i), kept, s))
                cache.evaluate()
            timings["copy"] = time.perf_counter() - t0
            t0 = time.perf_counter()
        if run.size:
            out = forward(model, tokens[run], cache, positions=positions[run], rows=r0 + run,
                          logits="last")
            mx.eval(out)
            cache.evaluate()
            result.logits = out if extra.size else None
        timings["prefill" if plan.path == "declined" else "repair"] = time.perf_counter() - t0
    return result


def splice(
    model: nn.Module,
    cache: NexusCache,
    block: CompiledBlock,
    *,
    at: int | None = None,
    curve: Curve | Literal["sur", "model"] | None = Curve(),  # noqa: B008  (frozen, immutable)
    use_kernel: bool = True,
    query: Sequence[int] | None = None,
    tokenizer: Any = None,
    append: Sequence[int] | np.ndarray | None = None,
) -> SpliceResult:
    """Splice ``block`` at position ``at`` (default: the cursor) and repair its seam; tokens in
    ``append`` go after the block in the same forward pass (their logits in ``result.logits``)."""
    timings: dict[str, float] = {}
    cache.evaluate()  # pending lazy work on the cache is not the splice's cost
    plan = plan_splice(model, cache, block, at=at, curve=curve, use_kernel=use_kernel,
                       query=query, tokenizer=tokenizer, timings=timings, append=append)
    return apply_splice(model, cache, block, plan, timings)
