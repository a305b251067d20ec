"""Bare-splice fidelity against the re-anchoring offset (paper 1, the bare-splice KL sweep).

Contract: ``python bench/dkl_sweep.py [--quick] [--model M] [--tag T]`` (``M``: any
``nexus_mlx.load`` spec, default SmolLM2; the result records the model run and goes to
``results/dkl_sweep[_<tag>].json``). Ten GitHub MCP tool schemas are compiled once
into blocks at anchor 0 with no context. For every target offset in {0, 16, 64, 128, 256, 512, 1024,
2048}, a live on-topic context (system prompt + GitHub conversation, deterministic) is prefilled:
by default (``--cut turn``) the longest run of whole turns of at most that many tokens, so the
context ends where a chat template really puts a tool definition, and the row's ``offset`` is its
actual length (``target_offset`` the grid value; a target no new whole turn fits is skipped);
``--cut token``: exactly ``offset`` tokens, possibly ending inside an open turn. Then, per tool,
a fork of it receives the block by a bare splice
(``curve=None``: re-anchored by ``delta = offset``, nothing recomputed) followed by a user request
for that tool, and another fork receives a text prefill of schema + request. The next-token
distributions after the request are compared: KL(p_prefill || p_splice) in nats and top-1
agreement. Offset 0 (empty context) is the anchored case and must match the prefill exactly; the
script stops if it does not. The reference prefill is chunked (context, then schema + request,
through the same engine), which is a text prefill of context + schema + request.

JSON ``{"cut", "rows": [{"offset", "target_offset", "kl_median", "kl_ci", "top1", "kl_mean", "kl_max", "path",
"kls"}], ...}``; PNG: KL per offset (medians, 95% bootstrap CIs, every query) and top-1.
``--quick``: offsets {0, 64, 256}, the three shortest schemas. Nothing here is timed.
"""

from __future__ import annotations

from common import (  # first: loads nexus_mlx + fast BLAS
    add_model_argument,
    add_tag_argument,
    arg_parser,
    emit,
    median_ci,
    model_record,
    paper_reference,
    tagged_name,
)

from typing import Any

import mlx.core as mx
import numpy as np
import plots
from splice_workload import (
    REQUESTS,
    context_ids,
    load_tools,
    query_ids,
    schema_text,
)

from nexus_mlx import NexusCache, forward, load, make_cache
from nexus_mlx.blocks.compile import compile_block
from nexus_mlx.blocks.splicing import splice
from nexus_mlx.metrics import next_token_kl, top1_agreement

NAME = "dkl_sweep"
OFFSETS = [0, 16, 64, 128, 256, 512, 1024, 2048]
QUICK_OFFSETS = [0, 64, 256]
QUICK_TOOLS = ["create_issue", "create_branch", "list_branches"]  # the shortest schemas
PAPER = paper_reference()[NAME]["values"]  # kl_range [lo, hi] (nats), top1
PAPER_KL = tuple(PAPER["kl_range"])
ANCHORED_TOL = 1e-3  # max |logit difference| allowed for the anchored (offset 0) splice


def last_logits(model, tokens: list[int], cache: NexusCache) -> np.ndarray:
    """Next-token logits after running ``tokens`` on top of ``cache`` ``(vocab,)`` float64."""
    out = forward(model, tokens, cache, logits="last")  # (1, 1, vocab)
    mx.eval(out)
    return np.array(out[0, -1], dtype=np.float64)


def sweep_offset(model, tokenizer, blocks, queries, target: int, whole_turns: bool
                 ) -> dict[str, Any]:
    ctx = context_ids(tokenizer, "on", target, whole_turns=whole_turns)
    offset = len(ctx)
    base = make_cache(model)
    if ctx:
        mx.eval(forward(model, ctx, base, logits="last"))
        base.evaluate()
    kls, agree, paths, max_diff = [], [], set(), 0.0
    for name, block in blocks.items():
        ref = last_logits(model, list(block.tokens) + queries[name], base.fork())
        cache = base.fork()
        result = splice(model, cache, block, curve=None)
        paths.add(result.path)
        got = last_logits(model, queries[name], cache)
        kls.append(next_token_kl(ref, got))
        agree.append(top1_agreement(ref, got))
        max_diff = max(max_diff, float(np.abs(ref - got).max()))
    want = "anchored" if offset == 0 else "bare"
    if paths != {want}:
        raise SystemExit(f"offset {offset}: splice paths {sorted(paths)}, expected {want!r}")
    if offset == 0 and max_diff > ANCHORED_TOL:
        raise SystemExit(f"anchored splice differs from the prefill by {max_diff:.3g} logits")
    med, lo, hi = median_ci(kls)
    return {
        "offset": offset, "target_offset": target, "kl_median": med, "kl_ci": [lo, hi], "top1": float(np.mean(agree)),
        "kl_mean": float(np.mean(kls)), "kl_max": float(np.max(kls)), "path": want,
        "max_logit_diff": max_diff, "kls": kls,
    }


def draw(rows: list[dict[str, Any]], name: str, quick: bool) -> None:
    fig, (ax_kl, ax_top) = plots.figure(2)
    offsets = [r["offset"] for r in rows]
    meds = [r["kl_median"] for r in rows]
    ax_kl.axhspan(*PAPER_KL, color="tab:green", alpha=0.15, label="paper 1 range")
    for r in rows:
        ax_kl.scatter([r["offset"]] * len(r["kls"]), r["kls"], s=10, color="gray", alpha=0.5)
    ax_kl.errorbar(offsets, meds, yerr=plots.error_bars(meds, [r["kl_ci"] for r in rows]),
                   marker="o", capsize=3, color="tab:blue", label="median, 95% CI")
    ax_kl.set_xscale("symlog", linthresh=16)
    ax_kl.set_xticks(offsets, [str(o) for o in offsets])
    ax_kl.set_xlabel("splice offset from the block's anchor (tokens)")
    ax_kl.set_ylabel("KL(prefill || bare splice), nats")
    ax_kl.set_title("Bare-splice fidelity (next token after the request)")
    ax_kl.legend()
    ax_top.plot(offsets, [r["top1"] for r in rows], marker="o")
    ax_top.set_xscale("symlog", linthresh=16)
    ax_top.set_xticks(offsets, [str(o) for o in offsets])
    ax_top.set_ylim(-0.05, 1.05)
    ax_top.set_xlabel("splice offset from the block's anchor (tokens)")
    ax_top.set_ylabel("top-1 agreement with the prefill")
    ax_top.set_title("Top-1 agreement")
    plots.save(fig, name, quick)


def main() -> dict[str, object]:
    parser = arg_parser(__doc__.splitlines()[0])
    add_model_argument(parser)
    add_tag_argument(parser)
    parser.add_argument("--cut", choices=("turn", "token"), default="turn",
                        help="context ends after its last whole turn at most OFFSET tokens long "
                             "(where a template puts a tool definition; the default) or at "
                             "exactly OFFSET tokens, possibly inside an open turn")
    args = parser.parse_args()
    offsets = QUICK_OFFSETS if args.quick else OFFSETS
    names = QUICK_TOOLS if args.quick else list(REQUESTS)
    model, tokenizer = load(args.model)
    tools = load_tools()
    blocks = {n: compile_block(model, tokenizer, schema_text(tools[n]), anchor=0) for n in names}
    queries = {n: query_ids(tokenizer, REQUESTS[n]) for n in names}
    rows: list[dict[str, Any]] = []
    for target in offsets:
        r = sweep_offset(model, tokenizer, blocks, queries, target, args.cut == "turn")
        if rows and r["offset"] == rows[-1]["offset"]:
            continue  # no whole turn fits between this target and the last one
        rows.append(r)
        print(f"offset {r['offset']:5d} (target {target}): KL median {r['kl_median']:.4f} "
              f"[{r['kl_ci'][0]:.4f}, {r['kl_ci'][1]:.4f}] top-1 {r['top1']:.2f}", flush=True)
    name = tagged_name(NAME, args.tag)
    draw(rows, name, args.quick)
    return emit(name, {
        **model_record(args.model, model),
        "blocks": {n: {"tokens": b.num_tokens, "anchor": b.m0} for n, b in blocks.items()},
        "queries": len(names), "context": "on-topic: system prompt + GitHub conversation",
        "cut": ("after the last whole turn within each target offset" if args.cut == "turn"
                else "exactly at each offset"),
        "metric": "KL(p_prefill || p_splice), nats, next token after the request",
        "paper": {"kl_range": list(PAPER_KL), "top1": PAPER["top1"]},
        "rows": rows,
    }, args.quick)


if __name__ == "__main__":
    main()
