"""Benchmark: choose the reranker's retrieval weight and k on held-out queries (paper 1, routing).

Contract: ``python bench/rerank_fusion.py [--quick] [--n 240] [--k-max 10] [--model M]
[--tag T]`` (``M``: any ``nexus_mlx.load`` spec, recorded as ``model``) tunes the two settings
of the library's default reranker,
:class:`~nexus_mlx.routing.rerank.QueryLikelihoodReranker`: ``retrieval_weight`` (score = mean
log-likelihood of the request after the tool's prompt + weight x SLB cosine) and the number of
SLB candidates ``k`` it reorders. It uses only Seal-Tools ``dev-difficult`` queries (several gold
calls each; a route is right when it picks any of them), never the ``dev-easy`` queries that
``bench/routing_accuracy.py`` scores, over the whole 4,076-tool pool (the hardest registry).

For each query: the library's first stage (INT8 SLB of ``words_params`` texts, ``"query: "``
prefix, fused with BM25 over the same texts at ``--lexical-weight``, the library default; 0 for
the cosine alone) gives the top ``--k-max`` candidates with their retrieval scores; the LLM likelihood of each is computed once (memoised on
disk, shared with ``routing_accuracy``). Then every (k, weight) pair is scored without further
LLM work: accuracy over all queries (every query reranked) and over the queries the calibrated
gate escalates (margin < tau = ``calibrate(slb)``), with Wilson CIs. The choice maximises the
escalated accuracy, ties to the smaller k and then the smaller weight. JSON: ``{"grid": [{"k",
"weight", "accuracy_all", "accuracy_escalated", ...}], "chosen": {"k", "weight", ...},
"slb_only", "tau", "fire_rate"}`` in ``results/rerank_fusion.json`` (``results/quick/`` with
``--quick``: 12 queries), a PNG, and the JSON as the last stdout line.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # 2 shared cores: one BLAS thread

from common import ( # nexus_mlx first
    add_model_argument,
    add_tag_argument,
    arg_parser,
    emit,
    model_record,
    tagged_name,
)

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import nexus_mlx
from nexus_mlx.tools.registry import load_tools
from nexus_mlx.tools.tool import sanitize_name
from nexus_mlx.routing.embedder import Embedder
from nexus_mlx.routing.gate import calibrate, top_scores
from nexus_mlx.routing.lexical import BM25Index
from nexus_mlx.routing.router import DEFAULT_LEXICAL_WEIGHT, QUERY_PREFIX
from nexus_mlx.routing.slb import SemanticLookasideBuffer
from routing_eval import (
    DEFAULT_CACHE,
    EMBEDDER_ID,
    SEAL_DEV,
    SEAL_TOOLS,
    TEXTS,
    StoredLikelihoodReranker,
    embed_cached,
    log,
    wilson,
)

NAME = "rerank_fusion"
WEIGHTS = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 32.0)
QUICK_QUERIES = 12


@dataclass(frozen=True)
class Candidates:
    """One held-out query: gold names, first-stage top-k (names, retrieval scores: cosines, fused
    with BM25 when the lexical weight is positive), LLM likelihoods, margin."""

    query: str
    gold: frozenset[str]
    names: list[str]
    cosines: np.ndarray  # (k,) retrieval scores
    likelihoods: np.ndarray  # (k,)
    escalated: bool


def heldout_rows(path: Path, limit: int) -> list[tuple[str, frozenset[str]]]:
    """The first ``limit`` multi-call (``dev-difficult``) queries with their gold tool names."""
    rows = []
    for line in path.read_text("utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            if len(row.get("calling", [])) > 1:
                rows.append((row["query"], frozenset(sanitize_name(c["api"])
                                                     for c in row["calling"])))
    return rows[:limit]


def pick(item: Candidates, k: int, weight: float | None) -> str:
    """The reranked top-1 among the first ``k`` candidates (``weight=None``: the SLB's)."""
    if weight is None:
        return item.names[0]
    score = item.likelihoods[:k] + weight * item.cosines[:k]
    return item.names[int(np.argmax(score))]  # first maximum: SLB order breaks ties


def accuracy(items: list[Candidates], k: int, weight: float | None) -> tuple[float, list[float]]:
    right = sum(pick(item, k, weight) in item.gold for item in items)
    return right / max(len(items), 1), wilson(right, len(items))


def grid(items: list[Candidates], ks: list[int]) -> list[dict[str, Any]]:
    """Accuracy over all queries and over the escalated ones, for every (k, weight)."""
    escalated = [item for item in items if item.escalated]
    out = []
    for k in ks:
        for weight in WEIGHTS:
            acc_all, ci_all = accuracy(items, k, weight)
            acc_esc, ci_esc = accuracy(escalated, k, weight)
            # end to end: the gate's auto-routed queries keep the SLB top-1
            right = sum(pick(item, k, weight if item.escalated else None) in item.gold
                        for item in items)
            out.append({"k": k, "weight": weight, "accuracy_all": acc_all, "ci_all": ci_all,
                        "accuracy_escalated": acc_esc, "ci_escalated": ci_esc,
                        "accuracy_end_to_end": right / len(items),
                        "ci_end_to_end": wilson(right, len(items))})
    return out


def choose(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Best escalated accuracy; ties to the smaller k, then the smaller weight."""
    return max(cells, key=lambda c: (round(c["accuracy_escalated"], 9), -c["k"], -c["weight"]))


def draw_figure(result: dict[str, Any], name: str, quick: bool) -> None:
    import plots

    fig, (ax, ax2) = plots.figure(2)
    for k in result["config"]["ks"]:
        cells = [c for c in result["grid"] if c["k"] == k]
        x = [c["weight"] for c in cells]
        ax.plot(x, [c["accuracy_escalated"] for c in cells], "o-", label=f"k = {k}")
        ax2.plot(x, [c["accuracy_all"] for c in cells], "o-", label=f"k = {k}")
    for axis, key in ((ax, "escalated"), (ax2, "all")):
        axis.axhline(result["slb_only"][f"accuracy_{key}"], color="grey", ls="--",
                     label="SLB top-1 (no reranker)")
        axis.set_xscale("symlog", linthresh=1.0)
        axis.set_xlim(0.0, max(WEIGHTS) * 1.2)
        axis.set_xlabel("retrieval weight (x SLB cosine, added to mean log-likelihood)")
        axis.set_ylabel("accuracy (route in the gold set)")
        axis.legend(fontsize=7)
    chosen = result["chosen"]
    ax.set_title(f"escalated queries (n={result['n_escalated']}); chosen k={chosen['k']}, "
                 f"w={chosen['weight']:g}", fontsize=9)
    ax2.set_title(f"all held-out queries (n={result['n_queries']}), 4,076 tools", fontsize=9)
    plots.save(fig, name, quick)


def main() -> dict[str, Any]:
    parser = arg_parser("tune the reranker's retrieval weight and k on held-out queries")
    parser.add_argument("--n", type=int, default=240, help="held-out queries (file order)")
    parser.add_argument("--k-max", type=int, default=10)
    parser.add_argument("--lexical-weight", type=float, default=DEFAULT_LEXICAL_WEIGHT,
                        help="the first stage's BM25 fusion weight (library default)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    add_tag_argument(parser)
    add_model_argument(parser)
    args = parser.parse_args()
    wall = time.perf_counter()
    rows = heldout_rows(SEAL_DEV, QUICK_QUERIES if args.quick else args.n)
    registry = load_tools(SEAL_TOOLS)
    tools = list(registry)
    embedder = Embedder.load(query_prefix=QUERY_PREFIX)
    texts = [TEXTS["words_params"](t) for t in tools]
    vectors = embed_cached(embedder, texts, "document", args.cache)
    queries = embed_cached(embedder, [QUERY_PREFIX + q for q, _ in rows], "query", args.cache)
    slb = SemanticLookasideBuffer(vectors.shape[1], EMBEDDER_ID)
    slb.add(registry.names(), vectors)
    weight = args.lexical_weight
    lexical = BM25Index(texts) if weight > 0 else None
    cal = calibrate(slb, lexical=lexical, lexical_weight=weight, query_texts=texts)
    model, tokenizer = nexus_mlx.load(args.model)
    llm = StoredLikelihoodReranker(model, tokenizer, store=args.cache / "ql-scores.json")
    items = []
    for i, (text, gold) in enumerate(rows):
        rows, cosines = top_scores(slb, queries[i], args.k_max,
                                   None if lexical is None else lexical.normalized(text), weight)
        names = [slb.names[int(r)] for r in rows]
        likelihoods = np.array([llm.likelihood(text, registry.get(name)) for name in names])
        items.append(Candidates(text, gold, names, cosines, likelihoods,
                                escalated=not cal.gate().auto_route(cosines)))
        if i % 20 == 19:
            llm.flush()
            log(f"{i + 1}/{len(rows)} queries scored")
    llm.flush()
    ks = sorted({k for k in (3, 5, args.k_max) if k <= args.k_max})
    cells = grid(items, ks)
    escalated = [item for item in items if item.escalated]
    slb_all, slb_all_ci = accuracy(items, 1, None)
    slb_esc, slb_esc_ci = accuracy(escalated, 1, None)
    result = {
        "config": {"queries": str(SEAL_DEV), "split": "dev-difficult (multi-call), any gold",
                   "pool": str(SEAL_TOOLS), "pool_size": len(tools), "ks": ks,
                   "weights": list(WEIGHTS), "text": "words_params",
                   "query_prefix": QUERY_PREFIX, "embedder": EMBEDDER_ID,
                   "lexical_weight": args.lexical_weight,
                   "llm": model_record(args.model, model)["model"],
                   "selection": "max escalated accuracy; ties: smaller k, smaller weight"},
        **model_record(args.model, model),
        "n_queries": len(items),
        "n_escalated": len(escalated),
        "tau": cal.tau,
        "fire_rate": len(escalated) / max(len(items), 1),
        "topk_recall": {str(k): sum(bool(item.gold & set(item.names[:k])) for item in items)
                        / max(len(items), 1) for k in ks},
        "slb_only": {"accuracy_all": slb_all, "ci_all": slb_all_ci,
                     "accuracy_escalated": slb_esc, "ci_escalated": slb_esc_ci},
        "grid": cells,
        "chosen": choose(cells),
        "llm_likelihoods_computed": llm.scored,
        "seconds": time.perf_counter() - wall,
    }
    chosen = result["chosen"]
    log(f"chosen k={chosen['k']} weight={chosen['weight']}: escalated "
        f"{chosen['accuracy_escalated']:.3f} (SLB {slb_esc:.3f}), all {chosen['accuracy_all']:.3f}")
    name = tagged_name(NAME, args.tag)
    draw_figure(result, name, args.quick)
    return emit(name, result, args.quick)


if __name__ == "__main__":
    main()
