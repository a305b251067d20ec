"""Benchmark: the tool-choice reranker against the query-likelihood reranker and the SLB alone,
tuned on one query set and reported on the others.

Contract: ``python bench/rerank_choice.py [--model M] [--k K] [--tag T] [--quick]``. Three
query sets, each routed over its whole registry by the library router (``build_router``:
MiniLM, INT8 SLB, BM25 fusion, calibrated gate, top-``K`` candidates) with the
query-likelihood reranker on model ``M`` for escalated queries (the default before this
benchmark):

- ``seal-tune``: Seal-Tools dev single-call rows 60-159 over the 4,076-tool pool: the only set
  the choice reranker's settings are chosen on;
- ``github``: the 78 GitHub MCP queries (``bench/github_queries.jsonl``) over its 117 tools;
- ``seal-test``: Seal-Tools dev single-call rows 0-59 (the ones ``bench/function_calling.py
  --n 60`` scores) over the same pool.

For every query and every candidate it records the fused retrieval score and the
:class:`~nexus_mlx.routing.rerank.ToolChoiceReranker`'s call log-probability (retrieval weight
0), so the settings grid (retrieval weight x gated or always) is scored without rerunning the
model. The setting with the best ``seal-tune`` accuracy (ties: the smaller weight, gated) is the
one reported for every set, beside the SLB top-1 and the query-likelihood reranker (gated, as
the router runs it). Accuracies have Wilson 95% intervals; ``fixed`` / ``broke`` count queries
the reranker turned right / wrong against the SLB top-1. Latency: median wall clock of the
route (SLB + gate + query likelihood) and of the choice scoring, machine not idle-checked.

Writes ``results/rerank_choice[_T].json`` (``results/quick/`` with ``--quick``: 4 queries per
set) and a PNG; the last stdout line is the JSON, with ``sets[name]`` = ``{"n", "slb",
"query_likelihood", "choice", ...}`` and ``chosen`` = the setting.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # 2 shared cores: one BLAS thread

from common import (
    add_model_argument,
    add_tag_argument,
    arg_parser,
    emit,
    median_ci,
    model_record,
    shared_data,
    tagged_name,
)

import time
from pathlib import Path
from typing import Any

import numpy as np

import nexus_mlx
from function_calling import load_gold
from nexus_mlx.routing.rerank import QueryLikelihoodReranker, ToolChoiceReranker
from nexus_mlx.routing.router import build_router
from nexus_mlx.tools.registry import load_tools
from routing_eval import GITHUB_QUERIES, GITHUB_TOOLS, log, wilson

NAME = "rerank_choice"
SEAL_TOOLS = shared_data("seal-tools", "tool.jsonl")
SEAL_DEV = shared_data("seal-tools", "dev.jsonl")
SETS: dict[str, tuple[Path, Path, slice]] = {
    "seal-tune": (SEAL_TOOLS, SEAL_DEV, slice(60, 160)),
    "github": (GITHUB_TOOLS, GITHUB_QUERIES, slice(0, None)),
    "seal-test": (SEAL_TOOLS, SEAL_DEV, slice(0, 60)),
}
TUNE_SET = "seal-tune"
WEIGHTS = (0.0, 1.0, 2.0, 5.0, 10.0, 20.0)
QUICK_QUERIES = 4


def score_set(name: str, model: Any, tokenizer: Any, k: int, quick: bool) -> list[dict[str, Any]]:
    """Route every query of set ``name`` and score its candidates with the choice reranker."""
    tools_path, queries_path, rows = SETS[name]
    registry = load_tools(tools_path)
    gold, _ = load_gold(queries_path, registry)
    gold = gold[rows][: QUICK_QUERIES if quick else None]
    router = build_router(registry, model, tokenizer, k=k,
                          reranker=QueryLikelihoodReranker(model, tokenizer))
    choice = ToolChoiceReranker(model, tokenizer, retrieval_weight=0.0)
    out = []
    for call in gold:
        start = time.perf_counter()
        decision = router.route(call.query)
        routed = time.perf_counter()
        tools = [registry.get(n) for n, _ in decision.candidates]
        logprob = dict(choice.rerank(call.query, tools))
        out.append({
            "id": call.id, "gold": call.tool,
            "candidates": [n for n, _ in decision.candidates],
            "retrieval": [s for _, s in decision.candidates],
            "choice_logprob": [logprob[n] for n, _ in decision.candidates],
            "escalated": decision.escalated, "query_likelihood": decision.chosen,
            "route_ms": (routed - start) * 1e3, "choice_ms": (time.perf_counter() - routed) * 1e3,
        })
        log(f"{name} {call.id}: gold {call.tool}, slb {out[-1]['candidates'][0]}, "
            f"ql {decision.chosen}, choice {pick(out[-1], 0.0, False)}")
    return out


def pick(row: dict[str, Any], weight: float, gated: bool) -> str:
    """The tool chosen under one setting: the SLB top-1 where gated and not escalated."""
    if gated and not row["escalated"]:
        return row["candidates"][0]
    scores = np.asarray(row["choice_logprob"]) + weight * np.asarray(row["retrieval"])
    return row["candidates"][int(np.argmax(scores))]


def accuracy(rows: list[dict[str, Any]], chosen: list[str]) -> dict[str, Any]:
    k = sum(c == r["gold"] for c, r in zip(chosen, rows, strict=True))
    return {"accuracy": k / len(rows), "ci": wilson(k, len(rows)), "count": [k, len(rows)]}


def summarize(rows: list[dict[str, Any]], weight: float, gated: bool) -> dict[str, Any]:
    slb = [r["candidates"][0] for r in rows]
    ql = [r["query_likelihood"] for r in rows]
    choice = [pick(r, weight, gated) for r in rows]
    right = [r["gold"] for r in rows]
    return {
        "n": len(rows), "slb": accuracy(rows, slb), "query_likelihood": accuracy(rows, ql),
        "choice": accuracy(rows, choice),
        "choice_fixed": sum(c == g != s for c, g, s in zip(choice, right, slb, strict=True)),
        "choice_broke": sum(s == g != c for c, g, s in zip(choice, right, slb, strict=True)),
        "topk_recall": sum(r["gold"] in r["candidates"] for r in rows) / len(rows),
        "escalated": sum(r["escalated"] for r in rows) / len(rows),
        "route_ms": median_ci([r["route_ms"] for r in rows])[0],
        "choice_ms": median_ci([r["choice_ms"] for r in rows])[0],
        "grid": [{"weight": w, "gated": g, **accuracy(rows, [pick(r, w, g) for r in rows])}
                 for w in WEIGHTS for g in (True, False)],
    }


def choose(rows: list[dict[str, Any]]) -> tuple[float, bool]:
    """The best setting on the tuning rows (ties: smaller weight, then gated)."""
    best = max(((w, g) for w in WEIGHTS for g in (True, False)),
               key=lambda s: (accuracy(rows, [pick(r, *s) for r in rows])["accuracy"],
                              -s[0], s[1]))
    return best


def draw_figure(result: dict[str, Any], name: str, quick: bool) -> None:
    import plots

    fig, ax = plots.figure(1, width=7.0)
    names = list(result["sets"])
    arms = [("slb", "SLB top-1"), ("query_likelihood", "query likelihood (gated)"),
            ("choice", "tool choice (chosen setting)")]
    width = 0.8 / len(arms)
    for j, (key, label) in enumerate(arms):
        values = [result["sets"][s][key]["accuracy"] for s in names]
        cis = [result["sets"][s][key]["ci"] for s in names]
        xs = np.arange(len(names)) + (j - 1) * width
        ax.bar(xs, values, width, yerr=plots.error_bars(values, cis), capsize=3, label=label)
        for x, v in zip(xs, values, strict=True):
            ax.annotate(f"{v:.2f}", (x, v + 0.02), ha="center", fontsize=7)
    ax.set_xticks(range(len(names)), [f"{s}\n(n={result['sets'][s]['n']})" for s in names])
    ax.set_ylim(0, 1.25)
    ax.set_ylabel("routing accuracy")
    chosen = result["chosen"]
    ax.set_title(f"{result['model_info']['spec']}: choice tuned on {TUNE_SET} (weight "
                 f"{chosen['weight']}, {'gated' if chosen['gated'] else 'always'})", fontsize=9)
    ax.legend(fontsize=8, loc="upper center", ncols=3)
    plots.save(fig, name, quick)


def main() -> dict[str, Any]:
    parser = arg_parser("tool-choice reranker vs query likelihood, tuned on one set")
    add_model_argument(parser, default="qwen2.5-coder-0.5b")
    parser.add_argument("--k", type=int, default=10, help="router candidates (top-k)")
    add_tag_argument(parser)
    args = parser.parse_args()
    wall = time.perf_counter()
    model, tokenizer = nexus_mlx.load(args.model)
    rows = {name: score_set(name, model, tokenizer, args.k, args.quick) for name in SETS}
    weight, gated = choose(rows[TUNE_SET])
    result: dict[str, Any] = {
        **model_record(args.model, model), "k": args.k, "tune_set": TUNE_SET,
        "chosen": {"weight": weight, "gated": gated},
        "sets": {name: summarize(r, weight, gated) for name, r in rows.items()},
        "config": {"sets": {n: [str(t), str(q), f"{s.start}:{s.stop}"]
                            for n, (t, q, s) in SETS.items()},
                   "weights": list(WEIGHTS), "reranker": "ToolChoiceReranker (sum log-prob "
                   "of name + glue after the template's tools and an opened call)",
                   "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS")},
        "rows": rows, "seconds": time.perf_counter() - wall, "loadavg": list(os.getloadavg()),
    }
    name = tagged_name(NAME, args.tag)
    draw_figure(result, name, args.quick)
    return emit(name, result, args.quick)


if __name__ == "__main__":
    main()
