"""Calibrate the depth-adaptive recompute curve for one model: the least recompute per depth at
which a spliced block gives the text prefill's next token.

Contract: ``python bench/curve_calibration.py [--model M] [--kl X] [--store] [--tag T]
[--quick]``. The workload is deep_splice_ttft's (``splice_workload``): GitHub MCP tool schemas
compiled into blocks after the system prompt (``--context system``, the default: where a
template puts tool definitions, and what the blocks of a live session see; ``--context none``:
at anchor 0 with no context, dkl_sweep's worst case), spliced after an on-topic context that
starts with that system prompt and is cut after whole turns, then the tool's user request. Tools alternate
between a *calibration* half and a *held-out* half. At every depth and for every recompute
percent of ``R_GRID`` (ascending, stopping at the first that passes) a fork of the context
receives each calibration block with that fixed percent of its trailing tokens re-decoded; the
percent *passes* when, for every calibration tool, the next token after the request is the text
prefill's (top-1), and the median over them of KL(p_prefill || p_splice) is <= ``--kl`` nats
(default 0.02; dkl_sweep's statistic). The depth's
need is the first passing percent (100 always passes: it is the text prefill). The curve is
:func:`~nexus_mlx.blocks.curve_table.fit_curve` of the needs; it is then checked on the held-out
tools at every depth (KL median and max, top-1). ``--store`` records it in the user's curve table
(``curve_for(model)`` then returns it; ``splice(curve="model")`` uses it).

JSON ``results/curve_calibration[_<tag>].json``: ``{"model", "kl_limit", "block_context", "depths": [{"n_past",
"target", "need", "tried": [{"percent", "kl_median", "kl_max", "top1"}], "heldout": {"percent", "kl_median",
"kl_max", "top1"}}], "curve": {"M", "R_base", "K"}, "paper_curve_heldout": [...],
"calibration_tools", "heldout_tools", "stored"}``; ``paper_curve_heldout`` checks the paper's
``Curve()`` on the same held-out tools, for comparison. ``--quick``: depths 128 and 512, four
tools.
"""

from __future__ import annotations

from common import ( # first: nexus_mlx + BLAS
    add_model_argument,
    add_tag_argument,
    arg_parser,
    emit,
    model_record,
    tagged_name,
)

from typing import Any

import mlx.core as mx
import numpy as np
from splice_workload import (
    REQUESTS,
    context_ids,
    load_tools,
    query_ids,
    schema_text,
    system_ids,
)

from nexus_mlx import load
from nexus_mlx.blocks.compile import compile_block
from nexus_mlx.blocks.curve import Curve
from nexus_mlx.blocks.curve_table import fit_curve, store_curve
from nexus_mlx.blocks.splicing import splice
from nexus_mlx.kv.cache import NexusCache
from nexus_mlx.metrics import next_token_kl, top1_agreement
from nexus_mlx.models.forward import forward, make_cache

NAME = "curve_calibration"
DEPTHS = (64, 128, 256, 512, 1024, 2048)  # targets; each context ends after a whole turn
QUICK_DEPTHS = (128, 512)
R_GRID = (0.0, 2.0, 5.0, 10.0, 20.0, 30.0, 50.0, 75.0, 100.0)
FLAT_M = 1 << 30  # a curve flat at R_base up to any depth: a fixed percent


def last_logits(model: Any, tokens: list[int], cache: NexusCache) -> np.ndarray:
    out = forward(model, tokens, cache, logits="last")
    mx.eval(out)
    return np.array(out[0, -1], dtype=np.float64)


def spliced_logits(model: Any, base: NexusCache, block: Any, query: list[int],
                   curve: Curve) -> np.ndarray:
    cache = base.fork()
    result = splice(model, cache, block, curve=curve, append=query)
    mx.eval(result.logits)
    return np.array(result.logits[0, -1], dtype=np.float64)


def compare(model: Any, base: NexusCache, refs: dict[str, np.ndarray], blocks: dict[str, Any],
            queries: dict[str, list[int]], curve: Curve) -> dict[str, Any]:
    kls, tops = [], []
    for name, block in blocks.items():
        got = spliced_logits(model, base, block, queries[name], curve)
        kls.append(next_token_kl(refs[name], got))
        tops.append(top1_agreement(refs[name], got))
    return {"kl_median": float(np.median(kls)), "kl_max": float(np.max(kls)),
            "top1": float(np.mean(tops)), "kls": kls}


def depth_row(model: Any, tokenizer: Any, target: int, calib: dict[str, Any],
              held: dict[str, Any], queries: dict[str, list[int]], kl_limit: float) -> dict[str, Any]:
    ctx = context_ids(tokenizer, "on", target, whole_turns=True)
    base = make_cache(model)
    if ctx:
        mx.eval(forward(model, ctx, base, logits="last"))
        base.evaluate()
    refs = {n: last_logits(model, list(b.tokens) + queries[n], base.fork())
            for n, b in {**calib, **held}.items()}
    tried, need = [], 100.0
    for percent in R_GRID:
        r = compare(model, base, refs, calib, queries, Curve(M=FLAT_M, R_base=percent))
        tried.append({"percent": percent, "kl_median": r["kl_median"], "kl_max": r["kl_max"],
                      "top1": r["top1"]})
        if r["top1"] == 1.0 and r["kl_median"] <= kl_limit:
            need = percent
            break
    return {"n_past": len(ctx), "target": target, "need": need, "tried": tried,
            "base": base, "refs": refs}


def main() -> dict[str, Any]:
    parser = arg_parser(__doc__.splitlines()[0] if __doc__ else "")
    add_model_argument(parser)
    parser.add_argument("--kl", type=float, default=0.02, help="KL limit in nats")
    parser.add_argument("--store", action="store_true",
                        help="record the fitted curve in the user's curve table")
    parser.add_argument("--context", choices=("system", "none"), default="system",
                        help="what the blocks are compiled after")
    add_tag_argument(parser)
    args = parser.parse_args()
    model, tokenizer = load(args.model)
    names = list(REQUESTS)[:4] if args.quick else list(REQUESTS)
    tools = load_tools()
    context = system_ids(tokenizer) if args.context == "system" else None
    blocks = {n: compile_block(model, tokenizer, schema_text(tools[n]), context=context)
              for n in names}
    queries = {n: query_ids(tokenizer, REQUESTS[n]) for n in names}
    calib = {n: blocks[n] for n in names[0::2]}
    held = {n: blocks[n] for n in names[1::2]}
    rows = []
    for target in QUICK_DEPTHS if args.quick else DEPTHS:
        row = depth_row(model, tokenizer, target, calib, held, queries, args.kl)
        if rows and row["n_past"] == rows[-1]["n_past"]:
            continue
        rows.append(row)
        print(f"n_past {row['n_past']:5d}: need {row['need']:g}% "
              f"(tried {[t['percent'] for t in row['tried']]})", flush=True)
    curve = fit_curve({r["n_past"]: r["need"] for r in rows})
    print(f"fitted curve: M={curve.M} R_base={curve.R_base:g} K={curve.K:g}", flush=True)
    paper = []
    for row in rows:
        for label, c in (("heldout", curve), ("paper", Curve())):
            check = compare(model, row["base"], row["refs"], held, queries, c)
            entry = {"n_past": row["n_past"], "percent": c.percent(row["n_past"]),
                     **{k: check[k] for k in ("kl_median", "kl_max", "top1")}}
            if label == "heldout":
                row["heldout"] = entry
            else:
                paper.append(entry)
        print(f"n_past {row['n_past']:5d}: held-out at {row['heldout']['percent']:.1f}%: KL median "
              f"{row['heldout']['kl_median']:.4f} (max {row['heldout']['kl_max']:.4f}), top-1 "
              f"{row['heldout']['top1']:.2f}", flush=True)
        del row["base"], row["refs"]
    name = tagged_name(NAME, args.tag)
    stored = None
    if args.store and not args.quick:
        stored = str(store_curve(model, curve, source=f"bench/curve_calibration.py ({name})"))
    return emit(name, {
        **model_record(args.model, model), "kl_limit": args.kl, "block_context": args.context,
        "depths": rows,
        "curve": {"M": curve.M, "R_base": curve.R_base, "K": curve.K},
        "paper_curve_heldout": paper, "calibration_tools": list(calib),
        "heldout_tools": list(held), "stored": stored,
    }, args.quick)


if __name__ == "__main__":
    main()
