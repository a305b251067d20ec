"""Packed vs sequential refresh executors: B = 64 positions in R = 1, 4, 16 intervals (paper 2).

Setup per context length N: a real haystack (the Erasing-NIAH filler) of N + 64 tokens is
prefilled, a 64-token span at N/4 is deleted and Shift re-positions the suffix, leaving N rows
whose suffix is stale. The B = 64 rows to refresh form R equal intervals whose centres are
spread evenly over [N/2, N), so their mean position is 3N/4 for every R: the same count of
positions at the same mean causal depth (matched causal work). Correctness before timing: both
executors, from the same stale cache, give equal caches (max |diff| over every layer's K and V
<= 1e-4, fp32). Timing: warm-ups, then trials alternating the two executors on one cache (a
refresh recomputes the same rows each time, so every call does the same work); medians and a
bootstrap CI of the speedup. ``--quick``: N = 2K only, 1 warm-up and 3 trials, and the stale
cache is one prefilled 256-token text tiled to N rows (keys re-rotated to their positions):
real K/V magnitudes, the same refresh cost, a fraction of the prefill time. (Random normal K/V
do not work for the equality check: their extreme attention logits amplify rounding to ~3e-3.)
JSON: {"cells": [{"N", "R", "sequential_ms", "packed_ms", "speedup", "speedup_ci",
"max_abs_diff"}], "B", "trials", "warmup", "context"}; PNG: results/packed_refresh.png.
"""

from __future__ import annotations

from common import arg_parser, emit, median_ci, ratio_ci  # first: loads nexus_mlx + BLAS

import time

import mlx.core as mx
import numpy as np

from nexus_mlx import load
from nexus_mlx.kv.cache import NexusCache
from nexus_mlx.kv.rope import reanchor
from nexus_mlx.models.forward import make_cache
from nexus_mlx.refresh import Edit, refresh_packed, refresh_sequential, shift
from tasks.niah import NiahSpec, make_case
from repair_metrics import prefill

B = 64
TOL = 1e-4


def selected_rows(n: int, r: int, b: int = B) -> np.ndarray:
    """``b`` rows in ``r`` equal intervals centred evenly over ``[n/2, n)`` (mean ~ 3n/4)."""
    if b % r:
        raise ValueError(f"B={b} is not divisible by R={r}")
    width = b // r
    centres = n / 2 + (np.arange(r) + 0.5) * (n / 2) / r
    starts = np.round(centres - width / 2).astype(np.int64)
    rows = (starts[:, None] + np.arange(width)[None, :]).reshape(-1)
    if rows.max() >= n or np.any(np.diff(rows) <= 0):
        raise ValueError(f"intervals do not fit: n={n}, r={r}")
    return rows


def haystack_tokens(tokenizer, n: int) -> np.ndarray:
    """``n`` tokens of Erasing-NIAH text (its first case at a length of at least ``n``)."""
    case = make_case(tokenizer, NiahSpec(n_cases=1, lengths=(n + 256,)), 0)
    if case.n_tokens < n:
        raise ValueError(f"haystack has {case.n_tokens} tokens, need {n}")
    return case.tokens[:n]


def stale_cache_prefill(model, tokenizer, n: int) -> NexusCache:
    """``n`` rows after deleting 64 tokens at ``n/4`` from a prefilled ``n + 64``-token text."""
    cache = prefill(model, haystack_tokens(tokenizer, n + 64))
    out = shift(cache, Edit(n // 4, n // 4 + 64))
    out.evaluate()
    return out


def stale_cache_tiled(model, tokenizer, n: int, tile: int = 256) -> NexusCache:
    """``n`` rows built from one prefilled ``tile``-token text repeated, each copy's keys
    re-rotated to its positions (realistic K/V magnitudes at a fraction of a prefill's cost;
    every copy attended only to itself, so the whole suffix is stale)."""
    if n % tile:
        raise ValueError(f"n={n} is not a multiple of tile={tile}")
    base = prefill(model, haystack_tokens(tokenizer, tile))
    cache = make_cache(model)
    for copy in range(n // tile):
        keys = [reanchor(base.keys(layer), copy * tile, base.rope_specs[layer])
                for layer in range(base.num_layers)]
        values = [base.values(layer) for layer in range(base.num_layers)]
        cache.write(np.arange(tile) + copy * tile, keys, values, tokens=base.tokens)
    cache.evaluate()
    return cache


def max_cache_diff(a: NexusCache, b: NexusCache) -> float:
    worst = 0.0
    for layer in range(a.num_layers):
        worst = max(worst, float(mx.abs(a.keys(layer) - b.keys(layer)).max().item()),
                    float(mx.abs(a.values(layer) - b.values(layer)).max().item()))
    return worst


MODEL = None  # set by main()


def _timed(fn, cache: NexusCache, rows: np.ndarray) -> float:
    start = time.perf_counter()
    fn(MODEL, cache, rows)  # executors evaluate the cache before returning
    return (time.perf_counter() - start) * 1e3


def run_cell(stale: NexusCache, n: int, r: int, warmup: int, trials: int) -> dict[str, object]:
    rows = selected_rows(n, r)
    seq_cache, packed_cache = stale.copy(), stale.copy()
    refresh_sequential(MODEL, seq_cache, rows)
    refresh_packed(MODEL, packed_cache, rows)
    diff = max_cache_diff(seq_cache, packed_cache)
    if diff > TOL:
        raise SystemExit(f"N={n} R={r}: packed and sequential caches differ by {diff:.3g} > {TOL}")
    del seq_cache
    work = packed_cache  # both executors recompute the same rows of one cache
    for _ in range(warmup):
        refresh_sequential(MODEL, work, rows)
        refresh_packed(MODEL, work, rows)
    seq_ms, packed_ms = [], []
    for t in range(trials):  # interleaved, alternating which arm goes first
        arms = [(refresh_sequential, seq_ms), (refresh_packed, packed_ms)]
        for fn, sink in arms if t % 2 == 0 else arms[::-1]:
            sink.append(_timed(fn, work, rows))
    speedup, lo, hi = ratio_ci(seq_ms, packed_ms)
    return {
        "N": n, "R": r, "B": B, "sequential_ms": median_ci(seq_ms)[0],
        "sequential_ms_ci": list(median_ci(seq_ms)[1:]), "packed_ms": median_ci(packed_ms)[0],
        "packed_ms_ci": list(median_ci(packed_ms)[1:]), "speedup": speedup, "speedup_ci": [lo, hi],
        "max_abs_diff": diff, "interval_width": B // r,
    }


def plot(cells: list[dict[str, object]], quick: bool):
    """Times and speedups against R; None when matplotlib is missing (the JSON is the result)."""
    try:
        from plots import error_bars, figure, save
    except ImportError:
        return None
    fig, axes = figure(2)
    for n in sorted({c["N"] for c in cells}):
        sub = [c for c in cells if c["N"] == n]
        rs = [c["R"] for c in sub]
        axes[0].plot(rs, [c["sequential_ms"] for c in sub], "o--", label=f"sequential N={n}")
        axes[0].plot(rs, [c["packed_ms"] for c in sub], "s-", label=f"packed N={n}")
        speedups = [c["speedup"] for c in sub]
        axes[1].errorbar(rs, speedups, yerr=error_bars(speedups, [c["speedup_ci"] for c in sub]),
                         marker="o", capsize=3, label=f"N={n}")
    axes[0].set(xscale="log", yscale="log", xlabel="intervals R", ylabel="refresh time (ms)",
                title=f"B={B} positions, median")
    axes[1].set(xscale="log", xlabel="intervals R", ylabel="sequential / packed",
                title="packed speedup (95% CI)")
    for ax in axes:
        ax.set_xticks([1, 4, 16], ["1", "4", "16"])
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    return save(fig, "packed_refresh", quick)


def main() -> None:
    global MODEL
    parser = arg_parser(__doc__.splitlines()[0])
    parser.add_argument("--lengths", default=None, help="comma-separated N (default 2048,8000)")
    args = parser.parse_args()
    lengths = [2048] if args.quick else [2048, 8000]
    if args.lengths:
        lengths = [int(x) for x in args.lengths.split(",")]
    warmup, trials = (1, 3) if args.quick else (10, 20)
    MODEL, tokenizer = load("default")
    cells = []
    for n in lengths:
        build = stale_cache_tiled if args.quick else stale_cache_prefill
        stale = build(MODEL, tokenizer, n)
        for r in (1, 4, 16):
            cells.append(run_cell(stale, n, r, warmup, trials))
        del stale
    plot(cells, args.quick)
    emit("packed_refresh", {
        "model": "default (SmolLM2-135M-Instruct, float32)", "B": B, "warmup": warmup,
        "trials": trials, "context": "one prefilled 256-token text tiled (keys re-rotated)" if args.quick else "prefilled, Shift after a 64-token deletion",
        "cells": cells,
    }, args.quick)


if __name__ == "__main__":
    main()
