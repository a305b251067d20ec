"""Packed vs sequential refresh executors: B = 64 positions in R = 1, 4, 16 intervals (paper 2).

Setup per context length N: a real haystack (the Erasing-NIAH filler) of N + 64 tokens is
prefilled, a 64-token span at N/4 is deleted and Shift re-positions the suffix, leaving N rows
whose suffix is stale. The B = 64 rows to refresh form R equal intervals whose centres are
spread evenly over [N/2, N), so their mean position is 3N/4 for every R: the same count of
positions at the same mean causal depth (matched causal work). Correctness before timing: both
executors, from the same stale cache, give equal caches (max |diff| over every layer's K and V
<= 1e-4, fp32). Timing: warm-ups, then trials alternating the two executors on one cache (a
refresh recomputes the same rows each time, so every call does the same work); medians, and
speedups as the median of the per-round ratios with a bootstrap CI over rounds. ``--quick``:
N = 2K only, 1 warm-up and 3 trials, and the stale cache is one prefilled 256-token text tiled
to N rows (keys re-rotated to their positions): real K/V magnitudes, the same refresh cost, a
fraction of the prefill time. (Random normal K/V do not work for the equality check: their
extreme attention logits amplify rounding to ~3e-3.)
Blocked attention: a third arm, interleaved with the two, runs the packed executor with the
blocked attention kernel off (``position_attention.disabled()``: the two GEMMs around the native
position softmax every CPU used before); its cache must equal the packed one within 1e-4, and
``blocked_speedup`` (with its CI) is its time over the packed time.
Floor: each cell prints and records the packed pass's FLOP floor (its FLOPs over the fp32 GEMM
rate measured beside the cell, ``roofline.py``), ``packed_over_floor`` (target <= 2) and the ideal
packed/sequential ratio the same count predicts (R calls reading every weight once against one).
After the cells of each N, the packed pass at R = 16 is profiled per stage and per layer at
``mx.eval`` boundaries (``profile_R16``). Memory: K/V bytes per cell and the peak RSS.
JSON: {"cells": [{"N", "R", "sequential_ms", "packed_ms", "speedup", "speedup_ci",
"max_abs_diff", "packed_unfused_ms", "blocked_speedup", "blocked_speedup_ci",
"blocked_max_abs_diff", "flops", "floor_ms", "packed_over_floor", "ideal_speedup", "kv_bytes",
"peak_rss_mib"}], "B", "trials", "warmup", "context", "rates", "profile_R16", "loadavg"};
PNG: results/packed_refresh.png.
"""

from __future__ import annotations

from common import arg_parser, emit, median_ci, paired_ratio_ci  # first: loads nexus_mlx + BLAS

import os
import resource
import time

import mlx.core as mx
import numpy as np

from nexus_mlx import load
from nexus_mlx.kernels import position_attention
from nexus_mlx.kv.cache import NexusCache
from nexus_mlx.kv.rope import reanchor
from nexus_mlx.models.forward import forward, make_cache
from nexus_mlx.models.stages import StageProfile
from nexus_mlx.refresh import Edit, refresh_packed, refresh_sequential, shift
from roofline import counts, gemm_gflops, pass_flops, pass_floor_ms, stream_gbps
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


def refresh_packed_unfused(model, cache: NexusCache, rows: np.ndarray) -> None:
    """The packed executor with the blocked attention kernel off (two GEMMs around the native
    position softmax): the path every CPU took before the kernel."""
    with position_attention.disabled():
        refresh_packed(model, cache, rows)


def peak_rss_mib() -> float:
    """Peak resident set of this process so far (MiB; Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def floors(n: int, r: int, gflops: float, gbps: float) -> dict[str, float]:
    """The packed pass's FLOP floor and the roofline ratio to sequential the same count gives:
    sequential runs R calls of B/R tokens, each reading every weight once."""
    c = counts(MODEL)
    flops = pass_flops(c, B, n)
    packed_roof = pass_floor_ms(c, B, n, gflops, gbps)
    seq_roof = r * pass_floor_ms(c, B // r, n, gflops, gbps)
    return {"flops": flops, "floor_ms": flops / (gflops * 1e9) * 1e3,
            "packed_roofline_ms": packed_roof, "sequential_roofline_ms": seq_roof,
            "ideal_speedup": seq_roof / packed_roof}


def profile_packed(stale: NexusCache, rows: np.ndarray, repeats: int = 2) -> dict[str, object]:
    """Per-stage, per-layer times of the packed pass (the executor's one forward call) at
    ``mx.eval`` boundaries, averaged over ``repeats`` calls after one untimed call."""
    cache = stale.copy()
    prof = StageProfile()
    for i in range(repeats + 1):
        target = prof if i else None
        out = forward(MODEL, cache.tokens[rows], cache, positions=cache.positions[rows],
                      rows=rows, logits="last", profile=target)
        mx.eval(out)
        cache.evaluate()
    return prof.as_dict()


def run_cell(stale: NexusCache, n: int, r: int, warmup: int, trials: int) -> dict[str, object]:
    rows = selected_rows(n, r)
    seq_cache, packed_cache = stale.copy(), stale.copy()
    refresh_sequential(MODEL, seq_cache, rows)
    refresh_packed(MODEL, packed_cache, rows)
    diff = max_cache_diff(seq_cache, packed_cache)
    if diff > TOL:
        raise SystemExit(f"N={n} R={r}: packed and sequential caches differ by {diff:.3g} > {TOL}")
    unfused_cache = stale.copy()
    refresh_packed_unfused(MODEL, unfused_cache, rows)
    unfused_diff = max_cache_diff(unfused_cache, packed_cache)
    if unfused_diff > TOL:
        raise SystemExit(f"N={n} R={r}: blocked and unfused attention differ by "
                         f"{unfused_diff:.3g} > {TOL}")
    del seq_cache, unfused_cache
    work = packed_cache  # every executor recomputes the same rows of one cache
    arms = [refresh_sequential, refresh_packed, refresh_packed_unfused]
    for _ in range(warmup):
        for fn in arms:
            fn(MODEL, work, rows)
    times: list[list[float]] = [[], [], []]
    for t in range(trials):  # interleaved, rotating which arm goes first
        for k in range(len(arms)):
            i = (k + t) % len(arms)
            times[i].append(_timed(arms[i], work, rows))
    seq_ms, packed_ms, unfused_ms = times
    speedup, lo, hi = paired_ratio_ci(seq_ms, packed_ms)
    blocked, blo, bhi = paired_ratio_ci(unfused_ms, packed_ms)
    return {
        "packed_unfused_ms": median_ci(unfused_ms)[0],
        "packed_unfused_ms_ci": list(median_ci(unfused_ms)[1:]),
        "blocked_speedup": blocked, "blocked_speedup_ci": [blo, bhi],
        "blocked_max_abs_diff": unfused_diff,
        "N": n, "R": r, "B": B, "sequential_ms": median_ci(seq_ms)[0],
        "sequential_ms_ci": list(median_ci(seq_ms)[1:]), "packed_ms": median_ci(packed_ms)[0],
        "packed_ms_ci": list(median_ci(packed_ms)[1:]), "speedup": speedup, "speedup_ci": [lo, hi],
        "max_abs_diff": diff, "interval_width": B // r,
        "kv_bytes": stale.nbytes, "kv_live_bytes": stale.nbytes * stale.n_past // max(stale.capacity, 1),
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
    load_start = os.getloadavg()
    MODEL, tokenizer = load("default")
    cells, profiles, rates = [], {}, []
    for n in lengths:
        build = stale_cache_tiled if args.quick else stale_cache_prefill
        stale = build(MODEL, tokenizer, n)
        for r in (1, 4, 16):
            gflops, gbps = gemm_gflops(), stream_gbps()  # measured beside every cell
            rates.append({"N": n, "R": r, "gemm_gflops": gflops, "stream_gbps": gbps})
            cell = run_cell(stale, n, r, warmup, trials)
            cell.update(floors(n, r, gflops, gbps))
            cell["packed_over_floor"] = cell["packed_ms"] / cell["floor_ms"]
            cell["peak_rss_mib"] = peak_rss_mib()
            cells.append(cell)
            print(f"N {n:5d} R {r:2d}: packed {cell['packed_ms']:7.1f} ms (unfused attention "
                  f"{cell['packed_unfused_ms']:7.1f} ms, {cell['blocked_speedup']:.2f}x), floor "
                  f"{cell['floor_ms']:6.1f} ms ({cell['packed_over_floor']:.2f}x floor), "
                  f"sequential {cell['sequential_ms']:7.1f} ms, speedup {cell['speedup']:.2f}x "
                  f"(ideal {cell['ideal_speedup']:.2f}x) at {gflops:.0f} GFLOP/s, "
                  f"{gbps:.1f} GB/s", flush=True)
        profiles[str(n)] = profile_packed(stale, selected_rows(n, 16))
        del stale
    plot(cells, args.quick)
    emit("packed_refresh", {
        "model": "default (SmolLM2-135M-Instruct, float32)", "B": B, "warmup": warmup,
        "trials": trials, "context": "one prefilled 256-token text tiled (keys re-rotated)" if args.quick else "prefilled, Shift after a 64-token deletion",
        "floor": "FLOPs (2 x non-embedding params x B + 4 x B x N x head_dim x heads x layers) "
                 "over the fp32 GEMM rate measured beside each cell; ideal_speedup: R calls of "
                 "B/R tokens vs one of B, each call max(FLOPs / GEMM rate, (weights + K/V) / "
                 "streaming rate)",
        "rates": rates, "profile_R16": profiles, "peak_rss_mib": peak_rss_mib(),
        "loadavg": {"start": list(load_start), "end": list(os.getloadavg())},
        "cells": cells,
    }, args.quick)


if __name__ == "__main__":
    main()
