"""Deep-splice time-to-first-token: splice + depth-adaptive repair vs re-prefill (paper 1, Table III).

Contract: ``python bench/deep_splice_ttft.py [--quick] [--model M] [--tag T]`` (``M``: any ``nexus_mlx.load`` spec, default SmolLM2; the result records the model run and goes
to ``results/deep_splice_ttft[_<tag>].json``). A history of ``n_past`` tokens (system
prompt + GitHub conversation) is prefilled once per depth; every trial forks it, outside the timed
region, once per arm. Then one GitHub MCP tool schema (``add_sub_issue``, 235 tokens) and a user
request for it go on top:
- prefill arm: prefill schema + request as text, take the argmax of the last logits;
- splice arms (one per entry of ``REPAIRS``): splice the compiled block (compiled once, outside
  timing, after the same system prompt, so ``m0`` = its length) with the request appended, so the
  seam repair rows the arm's curve asks for and the request advance through each layer together
  in one forward pass (``splice(..., append=request)``), take the argmax of its logits;
- request arm (the limit no splice can beat): the schema's exact KV is already in place (prefilled
  outside timing), only the request is computed; ``limit_speedup`` = prefill / request.
TTFT stops when the first generated token is evaluated. Arms are interleaved trial by trial (their
order rotates) because the machine is shared, and every ratio (``speedup``, ``limit_speedup``) is
the median of the per-round ratios with a bootstrap CI over rounds (``paired_ratio_ci``). Before
timing, each depth runs every arm once untimed, compares its first-token distribution with the
prefill arm's (KL in nats, top-1 agreement) and checks the cache holds history + schema + request;
an arm that recomputes 100% of the block must match the prefill, or the script stops. Then one more
warm-up round. The JSON records the load average at start and end: the machine is shared, so read
the ratios.

JSON ``{"cells": [{"n_past", "K", "curve", "R_pct", "recomputed", "prefill_ms", "splice_ms",
"speedup", "speedup_ci", "top1_ok", "kl", "splice_stage_ms" (validate / select / copy / repair =
the one forward pass of repair rows + request), "request_ms", "limit_speedup", "limit_speedup_ci",
"kv_bytes", "peak_rss_mib", ...}]}``; PNG:
speedup with 95% CIs and TTFT per depth.
``--quick``: n_past {256, 512}, K = 4 only, 3 trials.
"""

from __future__ import annotations

from common import (  # first: loads nexus_mlx + fast BLAS
    add_model_argument,
    add_tag_argument,
    arg_parser,
    emit,
    median_ci,
    model_record,
    paired_ratio_ci,
    paper_reference,
    tagged_name,
)

import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import plots
from splice_workload import (
    REQUESTS,
    context_ids,
    load_tools,
    query_ids,
    schema_text,
    system_ids,
)

from nexus_mlx import NexusCache, forward, load, make_cache
from nexus_mlx.blocks.block import CompiledBlock
from nexus_mlx.blocks.compile import compile_block
from nexus_mlx.blocks.curve import Curve
from nexus_mlx.blocks.splicing import SpliceResult, splice
from nexus_mlx.metrics import next_token_kl, top1_agreement

NAME = "deep_splice_ttft"
TOOL = "add_sub_issue"
DEPTHS = [256, 512, 1024, 2048]
QUICK_DEPTHS = [256, 512]
TRIALS, QUICK_TRIALS = 30, 3
WARMUP_ROUNDS = 1  # after the untimed correctness round
EXACT_TOL = 1e-3  # max |logit difference| when an arm recomputes the whole block
REQUEST_ARM = "request"  # the limit arm: the request alone over the schema's exact KV
PAPER: dict[str, dict[str, Any]] = paper_reference()[NAME]["values"]  # speedups by K and n_past


@dataclass(frozen=True)
class Repair:
    """A named way to put a block into the cache and repair its seam; ``K`` for the paper's
    curves, None for policies that are not a depth curve."""

    name: str
    run: Callable[[nn.Module, NexusCache, CompiledBlock, list[int]], SpliceResult]
    K: float | None = None


def curve_repair(name: str, curve: Curve) -> Repair:
    def run(model: nn.Module, cache: NexusCache, block: CompiledBlock, query: list[int]) -> SpliceResult:
        return splice(model, cache, block, curve=curve, append=query)

    return Repair(name, run, curve.K)


def sur_repair(tokenizer: Any) -> Repair:
    """Query-directed seam repair: the K=4 curve's budget spent on SUR-chosen block tokens."""

    def run(model: nn.Module, cache: NexusCache, block: CompiledBlock, query: list[int]) -> SpliceResult:
        return splice(model, cache, block, curve="sur", query=query, tokenizer=tokenizer,
                      append=query)

    return Repair("sur", run, None)


# The splice arms by name; main() adds the query-directed "sur" arm (it needs the tokenizer).
REPAIRS: list[Repair] = [
    curve_repair("K=4", Curve(K=4)),
    curve_repair("K=16", Curve.flat()),
]


def first_token(logits: mx.array) -> mx.array:
    token = mx.argmax(logits[0, -1])
    mx.eval(token)  # TTFT ends here
    return token


def request_turn(model, cache, query: list[int]) -> tuple[mx.array, None]:
    """The limit: only the request is computed, over the schema's exact KV already in place."""
    logits = forward(model, query, cache, logits="last")  # (1, 1, vocab)
    first_token(logits)
    return logits, None


def prefill_turn(model, cache, schema: list[int], query: list[int]) -> tuple[mx.array, None]:
    logits = forward(model, schema + query, cache, logits="last")  # (1, 1, vocab)
    first_token(logits)
    return logits, None


def splice_turn(model, cache, repair: Repair, block: CompiledBlock,
                query: list[int]) -> tuple[mx.array, SpliceResult]:
    result = repair.run(model, cache, block, query)  # the request runs in the repair's pass
    assert result.logits is not None
    first_token(result.logits)  # (1, 1, vocab)
    return result.logits, result


def run_depth(model, tokenizer, block, query, n_past, repairs, trials) -> list[dict[str, Any]]:
    history = context_ids(tokenizer, "on", n_past)
    base = make_cache(model)
    mx.eval(forward(model, history, base, logits="last"))
    base.evaluate()
    schema = list(block.tokens)
    Arm = Callable[[NexusCache], tuple[mx.array, SpliceResult | None]]

    def splice_arm(rep: Repair) -> Arm:
        return lambda c: splice_turn(model, c, rep, block, query)

    arms: dict[str, Arm] = {"prefill": lambda c: prefill_turn(model, c, schema, query),
                            REQUEST_ARM: lambda c: request_turn(model, c, query)}
    arms.update({rep.name: splice_arm(rep) for rep in repairs})
    with_schema = base.fork()  # the limit arm's start: the schema's KV already exact in place
    mx.eval(forward(model, schema, with_schema, logits="last"))
    with_schema.evaluate()
    bases = {name: with_schema if name == REQUEST_ARM else base for name in arms}

    # Correctness round (untimed, doubles as the first warm-up).
    expected = np.array(history + schema + query)
    logits: dict[str, np.ndarray] = {}
    results: dict[str, SpliceResult | None] = {}
    for name, arm in arms.items():
        cache = bases[name].fork()
        out, results[name] = arm(cache)
        logits[name] = np.array(out[0, -1], dtype=np.float64)
        if not np.array_equal(cache.tokens, expected):
            raise SystemExit(f"n_past {n_past}, arm {name}: cache does not hold "
                             "history + schema + request")
    if float(np.abs(logits[REQUEST_ARM] - logits["prefill"]).max()) > EXACT_TOL:
        raise SystemExit(f"n_past {n_past}: the request over the schema's exact KV differs "
                         "from the prefill")
    for rep in repairs:
        res = results[rep.name]
        assert res is not None
        diff = float(np.abs(logits[rep.name] - logits["prefill"]).max())
        if res.recomputed == block.num_tokens and diff > EXACT_TOL:
            raise SystemExit(f"n_past {n_past}, {rep.name}: full recompute differs from the "
                             f"prefill by {diff:.3g} logits")
    for _ in range(WARMUP_ROUNDS):
        for name, arm in arms.items():
            arm(bases[name].fork())

    times: dict[str, list[float]] = {name: [] for name in arms}
    stages: dict[str, list[dict[str, float]]] = {rep.name: [] for rep in repairs}
    names = list(arms)
    for trial in range(trials):
        order = names[trial % len(names):] + names[:trial % len(names)]
        for name in order:
            cache = bases[name].fork()  # outside the timed region (fork evaluates its copy)
            start = time.perf_counter()
            _, res = arms[name](cache)
            times[name].append((time.perf_counter() - start) * 1e3)
            if res is not None:
                stages[name].append(res.timings)

    cells = []
    pre_med, pre_lo, pre_hi = median_ci(times["prefill"])
    req_med, _, _ = median_ci(times[REQUEST_ARM])
    limit, l_lo, l_hi = paired_ratio_ci(times["prefill"], times[REQUEST_ARM])
    for rep in repairs:
        res = results[rep.name]
        assert res is not None
        kl = next_token_kl(logits["prefill"], logits[rep.name])
        same = top1_agreement(logits["prefill"], logits[rep.name])
        med, lo, hi = median_ci(times[rep.name])
        speedup, s_lo, s_hi = paired_ratio_ci(times["prefill"], times[rep.name])
        stage_ms = {k: float(np.median([t.get(k, 0.0) for t in stages[rep.name]]) * 1e3)
                    for k in ("validate", "select", "copy", "repair")}
        cells.append({
            "n_past": n_past, "K": rep.K, "curve": rep.name, "R_pct": res.r_pct,
            "recomputed": res.recomputed, "path": res.path, "delta": res.delta,
            "prefill_ms": pre_med, "prefill_ci": [pre_lo, pre_hi],
            "splice_ms": med, "splice_ci": [lo, hi],
            "speedup": speedup, "speedup_ci": [s_lo, s_hi],
            "top1_ok": same, "kl": kl, "splice_stage_ms": stage_ms,
            "request_ms": req_med, "limit_speedup": limit, "limit_speedup_ci": [l_lo, l_hi],
            "kv_bytes": base.nbytes, "peak_rss_mib": resource.getrusage(
                resource.RUSAGE_SELF).ru_maxrss / 1024,
            "prefill_trials_ms": times["prefill"], "splice_trials_ms": times[rep.name],
        })
        print(f"n_past {n_past:5d} {rep.name:5s}: R {res.r_pct:6.2f}% prefill {pre_med:7.1f} ms "
              f"splice {med:7.1f} ms speedup {speedup:.2f}x [{s_lo:.2f}, {s_hi:.2f}] "
              f"top-1 {same} KL {kl:.4f} (limit {limit:.2f}x)", flush=True)
    return cells


def draw(cells: list[dict[str, Any]], repairs: list[Repair], name: str, quick: bool) -> None:
    fig, (ax_s, ax_t) = plots.figure(2)
    depths = sorted({c["n_past"] for c in cells})
    width = 0.8 / max(len(repairs), 1)
    x = np.arange(len(depths))
    for i, rep in enumerate(repairs):
        mine = [next(c for c in cells if c["curve"] == rep.name and c["n_past"] == d)
                for d in depths]
        speed = [c["speedup"] for c in mine]
        ax_s.bar(x + (i - (len(repairs) - 1) / 2) * width, speed, width,
                 yerr=plots.error_bars(speed, [c["speedup_ci"] for c in mine]), capsize=3,
                 label=f"splice {rep.name}")
        ax_t.errorbar(depths, [c["splice_ms"] for c in mine],
                      yerr=plots.error_bars([c["splice_ms"] for c in mine],
                                            [c["splice_ci"] for c in mine]),
                      marker="o", capsize=3, label=f"splice {rep.name}")
    paper = [PAPER["K=4"].get(str(d)) for d in depths]
    ax_s.scatter([xi for xi, p in zip(x, paper, strict=True) if p],
                 [p for p in paper if p], marker="x", color="black", zorder=3,
                 label="paper 1, K=4")
    ax_s.axhline(1.0, color="gray", linestyle="--", linewidth=1)
    ax_s.set_xticks(x, [str(d) for d in depths])
    ax_s.set_xlabel("history depth n_past (tokens)")
    ax_s.set_ylabel("TTFT speedup over re-prefill (x)")
    ax_s.set_title("Deep splice: speedup, 95% bootstrap CI")
    ax_s.legend()
    pre = [next(c for c in cells if c["n_past"] == d) for d in depths]
    ax_t.errorbar(depths, [c["prefill_ms"] for c in pre],
                  yerr=plots.error_bars([c["prefill_ms"] for c in pre],
                                        [c["prefill_ci"] for c in pre]),
                  marker="s", capsize=3, color="black", label="re-prefill")
    ax_t.set_xscale("log", base=2)
    ax_t.set_xticks(depths, [str(d) for d in depths])
    ax_t.set_xlabel("history depth n_past (tokens)")
    ax_t.set_ylabel("time to first token (ms, median)")
    ax_t.set_title("TTFT")
    ax_t.legend()
    plots.save(fig, name, quick)


def main() -> dict[str, object]:
    parser = arg_parser(__doc__.splitlines()[0])
    add_model_argument(parser)
    add_tag_argument(parser)
    args = parser.parse_args()
    depths = QUICK_DEPTHS if args.quick else DEPTHS
    trials = QUICK_TRIALS if args.quick else TRIALS
    load_start = os.getloadavg()
    model, tokenizer = load(args.model)
    repairs = (REPAIRS[:1] if args.quick else REPAIRS) + [sur_repair(tokenizer)]
    tool = load_tools()[TOOL]
    block = compile_block(model, tokenizer, schema_text(tool), context=system_ids(tokenizer))
    query = query_ids(tokenizer, REQUESTS[TOOL])
    cells = []
    for n_past in depths:
        cells += run_depth(model, tokenizer, block, query, n_past, repairs, trials)
    name = tagged_name(NAME, args.tag)
    draw(cells, repairs, name, args.quick)
    return emit(name, {
        **model_record(args.model, model),
        "tool": TOOL, "block_tokens": block.num_tokens, "block_m0": block.m0,
        "query_tokens": len(query), "trials": trials, "warmup_rounds": 1 + WARMUP_ROUNDS,
        "ttft": "fork outside timing; splice + repair + request prefill + argmax evaluated",
        "loadavg": {"start": list(load_start), "end": list(os.getloadavg())},
        "paper": PAPER, "cells": cells,
    }, args.quick)


if __name__ == "__main__":
    main()
