"""Benchmark: end-to-end tool-routing accuracy against registry size (paper 1, routing table).

Contract: ``python bench/routing_accuracy.py [--quick] [--registry PATH] [--queries PATH]
[--sizes 10,50,...] [--model M] [--tag T]`` (``M``, any ``nexus_mlx.load`` spec, runs the
rerankers and the oracle; recorded as ``model``) routes every query against registries of N
tools: its gold tool plus N - 1
distractors drawn from the whole pool (seed ``--seed``, query index and N; gold at a random
position), the same draw for every method; N = pool size is the whole pool in file order. The
registry is a Seal-Tools ``tool.jsonl`` or an MCP-style ``tools.json``; queries are Seal-Tools
``dev.jsonl`` rows with one gold call (the ``dev-easy`` ones; gold names through
``sanitize_name``) or ``{"query", "tool", "arguments"}`` lines (``bench/github_queries.jsonl``).

Per N it reports, over the same queries:

- ``accuracy`` (Wilson 95% ``ci``): the library ``Router`` end to end: SLB scan (INT8) fused
  with BM25 over the same tool texts (``--lexical-weight``, the library default; 0 for the
  cosine alone), top-k, margin gate with ``tau`` from ``calibrate`` on that very registry under
  the same fusion (its tools' own texts as the stand-in queries: the library default, no test
  query is looked at), and the reranker on escalated queries only;
- ``top1_recall`` / ``top3_recall``: the first stage alone (the router's fused candidates);
  ``fire_rate``: share escalated;
- ``oracle``: the concatenate-all-schemas baseline: the LLM reads all N tools' full JSON schemas
  and the request, and each tool name is scored as in ``LLMReranker`` (mean log-probability as
  the continuation of the answer, here ``{"name": "``: see :class:`ConcatAllOracle`).
  ``"overflow"`` when the prompt does not fit SmolLM2's 8,192
  token window; run on the first ``--oracle-n`` queries only (it costs minutes per query here),
  and not run (recorded with its prompt length) above ``--oracle-max-tokens``.

Rerankers (``--rerankers``, the first one gives ``accuracy``): ``ql`` is the library default,
:class:`~nexus_mlx.routing.rerank.QueryLikelihoodReranker` (the LLM's mean log-probability of the
request written after each candidate's ``"name words: description"``, plus
``--retrieval-weight`` times the candidate's SLB cosine; per-tool prompt caches are reused and
likelihoods memoised on disk); ``ql0`` is the same without the cosine (weight 0);
``listing`` is the library's :class:`~nexus_mlx.routing.rerank.LLMReranker` (pick a name from
a list of IR signatures); ``none`` is the SLB top-1. Tool text (``--text``): ``name_desc``
(``"name: description"``, the baseline's), ``params`` (the registry's
``text_for_embedding``: plus parameter names) or ``words_params`` (identifiers split into
lower-case words: ``getHealthWorkforce`` -> ``get health workforce``, plus parameter names);
``--query-prefix`` is prepended to queries before embedding. The defaults (``words_params``,
``"query: "``) were chosen on the held-out Seal-Tools ``dev-difficult`` queries, not on the
queries scored here. Without ``--quick`` a lever sweep (SLB top-1/top-3 by fp32 scan for every
text x prefix pair, same draws) is added. Pool embeddings are computed once per text and cached
on disk (``--cache``); per-N buffers are filled from them with ``SemanticLookasideBuffer.add``.

``--quick`` (about 1.5 min here): 6 queries, the pool cut to their gold tools plus random ones
(150 in all), N in {10, pool}, the oracle on one query at N = 10 if its prompt is <= 2,048
tokens. JSON:
``{"config", "pool", "n_queries", "cells": [{"N", "accuracy", "ci", "top1_recall",
"top3_recall", "fire_rate", "oracle", ...}], "levers", "timing_s"}`` in
``results/routing_accuracy[_<tag>].json`` (``--tag``; ``results/quick/`` with ``--quick``),
a PNG beside it, and the JSON as the last stdout line. Queries, tool texts, embeddings,
rerankers, the oracle and the draws are the shared ones of ``bench/routing_eval.py``.
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

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import nexus_mlx
from nexus_mlx.tools.registry import ToolRegistry, load_tools
from nexus_mlx.tools.tool import Tool
from nexus_mlx.routing.embedder import Embedder
from nexus_mlx.routing.gate import Calibration, calibrate
from nexus_mlx.routing.rerank import DEFAULT_RETRIEVAL_WEIGHT, LLMReranker
from nexus_mlx.routing.lexical import BM25Index, words
from nexus_mlx.routing.router import DEFAULT_K, DEFAULT_LEXICAL_WEIGHT, Router
from nexus_mlx.routing.slb import SemanticLookasideBuffer
from routing_eval import (
    DEFAULT_CONTEXT_WINDOW,
    DEFAULT_CACHE,
    EMBEDDER_ID,
    SEAL_DEV,
    SEAL_TOOLS,
    TEXTS,
    ConcatAllOracle,
    MemoReranker,
    PrecomputedEmbedder,
    Query,
    StoredLikelihoodReranker,
    draw,
    embed_cached,
    heldout_queries,
    load_queries,
    log,
    context_window,
    oracle_tokens,
    quick_pool,
    schema_line,
    wilson,
)

NAME = "routing_accuracy"
DEFAULT_SIZES = "10,50,100,250,500,1000,2000,4076"
QUICK_QUERIES, QUICK_POOL = 6, 150
QUICK_ORACLE_TOKENS = 2048  # --quick runs the oracle only on prompts this short


# ---------------------------------------------------------------------------------------------
# One cell: every query routed at one registry size


@dataclass
class Setup:
    """Everything the cells share: pool, vectors, queries, model and rerankers."""

    tools: list[Tool]
    index: dict[str, int]
    vectors: np.ndarray  # (P, D) pool embeddings for the main text
    queries: list[Query]
    query_vectors: dict[str, np.ndarray]
    rerankers: dict[str, Any]
    oracle: ConcatAllOracle | None
    line_tokens: dict[str, int]
    tokenizer: Any
    k: int
    seed: int
    calibration: str
    heldout_vectors: np.ndarray | None = None
    heldout_texts: list[str] | None = None
    lexical_weight: float = 0.0
    tool_texts: list[str] | None = None  # the text embedded (and BM25-indexed) per pool tool
    tool_terms: list[list[str]] | None = None  # its BM25 terms
    context_window: int = DEFAULT_CONTEXT_WINDOW  # the reranking LLM's (the oracle's overflow)


def lexical_index(setup: Setup, idx: np.ndarray) -> BM25Index | None:
    """The router's BM25 index over one drawn registry (None without fusion)."""
    if setup.lexical_weight <= 0 or setup.tool_terms is None:
        return None
    return BM25Index.from_terms([setup.tool_terms[i] for i in idx])


def calibrate_registry(setup: Setup, slb: SemanticLookasideBuffer, idx: np.ndarray,
                       index: BM25Index | None) -> Calibration:
    """tau for this registry, on the router's (fused) score: its tools' texts as queries
    (default) or held-out queries."""
    weight = setup.lexical_weight if index is not None else 0.0
    if setup.calibration == "heldout" and setup.heldout_vectors is not None:
        return calibrate(slb, setup.heldout_vectors, lexical=index, lexical_weight=weight,
                         query_texts=setup.heldout_texts)
    texts = None if setup.tool_texts is None else [setup.tool_texts[i] for i in idx]
    return calibrate(slb, lexical=index, lexical_weight=weight, query_texts=texts)


def run_cell(setup: Setup, n: int, oracle_n: int, oracle_max_tokens: int) -> dict[str, Any]:
    """Route every query at registry size ``n``; one cell of the table."""
    pool = len(setup.tools)
    dim = setup.vectors.shape[1]
    shared: tuple[ToolRegistry, SemanticLookasideBuffer, Calibration, BM25Index | None] | None
    shared = None
    rows: list[dict[str, Any]] = []
    taus, cal_fire = [], []
    oracle_rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    for qi, query in enumerate(setup.queries):
        gold = setup.index[query.tool]
        idx = draw(pool, gold, n, setup.seed, qi)
        if shared is not None:
            registry, slb, cal, index = shared
        else:
            tools = [setup.tools[i] for i in idx]
            registry = ToolRegistry(tools)
            slb = SemanticLookasideBuffer(dim, EMBEDDER_ID)
            slb.add(registry.names(), setup.vectors[idx])
            index = lexical_index(setup, idx)
            cal = calibrate_registry(setup, slb, idx, index)
            if n >= pool:
                shared = (registry, slb, cal, index)
        taus.append(cal.tau)
        cal_fire.append(cal.fire_rate)
        embedder = PrecomputedEmbedder(setup.query_vectors)
        row: dict[str, Any] = {"q": qi}
        for label, reranker in setup.rerankers.items():
            router = Router(registry, embedder, slb, cal.gate(),
                            None if label == "none" else reranker, k=setup.k,
                            lexical_weight=setup.lexical_weight if index is not None else 0.0,
                            lexical=index)
            decision = router.route(query.text)
            names = [name for name, _ in decision.candidates]
            if "rank" not in row:
                row["rank"] = names.index(query.tool) if query.tool in names else -1
                row["escalated"] = not cal.gate().auto_route([s for _, s in decision.candidates])
                row["margin"] = decision.margin
            row[label] = decision.chosen == query.tool
        rows.append(row)
        if setup.oracle is not None and qi < oracle_n:
            tools = [setup.tools[i] for i in idx]
            length = oracle_tokens(setup.tokenizer, tools, query.text, setup.line_tokens,
                                   setup.context_window)
            record: dict[str, Any] = {"q": qi, "prompt_tokens": length}
            if length > setup.context_window:
                record["status"] = "overflow"
            elif length > oracle_max_tokens:
                record["status"] = "skipped"
            else:
                t0 = time.perf_counter()
                chosen = setup.oracle.rerank(query.text, tools)[0][0]
                record.update(status="run", correct=chosen == query.tool,
                              seconds=time.perf_counter() - t0)
            oracle_rows.append(record)
    return summarize(n, rows, taus, cal_fire, oracle_rows, list(setup.rerankers),
                     time.perf_counter() - start)


def summarize(n: int, rows: list[dict[str, Any]], taus: list[float], cal_fire: list[float],
              oracle_rows: list[dict[str, Any]], labels: list[str],
              seconds: float) -> dict[str, Any]:
    """The cell's JSON: accuracies with Wilson CIs, recalls, gate and reranker behaviour."""
    total = len(rows)
    main = labels[0]
    correct = sum(r[main] for r in rows)
    esc = [r for r in rows if r["escalated"]]
    cell: dict[str, Any] = {
        "N": n,
        "n": total,
        "accuracy": correct / total,
        "ci": wilson(correct, total),
        "top1_recall": sum(r["rank"] == 0 for r in rows) / total,
        "top3_recall": sum(0 <= r["rank"] < 3 for r in rows) / total,
        "topk_recall": sum(r["rank"] >= 0 for r in rows) / total,
        "fire_rate": len(esc) / total,
        "oracle": oracle_summary(oracle_rows),
        "by_reranker": {},
        "tau_median": float(np.median(taus)),
        "tau_range": [float(min(taus)), float(max(taus))],
        "calibration_fire_rate_median": float(np.median(cal_fire)),
        "slb_errors_escalated": (
            sum(r["rank"] != 0 for r in esc) / max(sum(r["rank"] != 0 for r in rows), 1)),
        "seconds": seconds,
        "rows": [[r["q"], r["rank"], int(r["escalated"]), round(r["margin"], 5)]
                 + [int(r[label]) for label in labels] for r in rows],
        "rows_columns": ["query", "gold_rank_in_topk", "escalated", "margin", *labels],
    }
    for label in labels:
        k = sum(r[label] for r in rows)
        fixed = sum(r[label] and r["rank"] != 0 for r in esc)
        broke = sum((not r[label]) and r["rank"] == 0 for r in esc)
        cell["by_reranker"][label] = {
            "accuracy": k / total, "ci": wilson(k, total),
            "escalated_correct": sum(r[label] for r in esc) / max(len(esc), 1),
            "fixed": fixed, "broke": broke,
        }
    return cell


def oracle_summary(rows: list[dict[str, Any]]) -> Any:
    """``None`` (not asked), ``"overflow"``, or accuracy over the queries it ran on."""
    if not rows:
        return None
    lengths = [r["prompt_tokens"] for r in rows]
    ran = [r for r in rows if r["status"] == "run"]
    if all(r["status"] == "overflow" for r in rows):
        return "overflow"
    summary: dict[str, Any] = {
        "prompt_tokens_median": float(np.median(lengths)),
        "overflow": sum(r["status"] == "overflow" for r in rows),
        "skipped": sum(r["status"] == "skipped" for r in rows),
        "n": len(ran),
    }
    if ran:
        k = sum(r["correct"] for r in ran)
        summary.update(accuracy=k / len(ran), ci=wilson(k, len(ran)),
                       seconds_median=float(np.median([r["seconds"] for r in ran])))
    return summary


def lever_sweep(embedder: Embedder, tools: list[Tool], queries: list[Query], sizes: list[int],
                prefixes: list[str], seed: int, cache: Path | None) -> list[dict[str, Any]]:
    """SLB-only top-1/top-3 (fp32 scan) for each tool text x query prefix, the same draws."""
    index = {t.qualified_name: i for i, t in enumerate(tools)}
    out = []
    for text_name, text_fn in TEXTS.items():
        pool = embed_cached(embedder, [text_fn(t) for t in tools], "document", cache)
        for prefix in prefixes:
            qv = embed_cached(embedder, [prefix + q.text for q in queries], "query", cache)
            for n in sizes:
                ranks = []
                for qi, q in enumerate(queries):
                    gold = index[q.tool]
                    idx = draw(len(tools), gold, n, seed, qi)
                    scores = pool[idx] @ qv[qi]  # (n,)
                    ranks.append(int((scores > scores[int(np.flatnonzero(idx == gold)[0])]).sum()))
                r = np.asarray(ranks)
                out.append({"text": text_name, "query_prefix": prefix, "N": n,
                            "top1": float((r < 1).mean()), "top3": float((r < 3).mean())})
            log(f"levers {text_name} {prefix!r}: "
                + " ".join(f"{c['N']}:{c['top1']:.3f}" for c in out[-len(sizes):]))
    return out


# ---------------------------------------------------------------------------------------------
# Figure


def draw_figure(result: dict[str, Any], name: str, quick: bool) -> None:
    """Accuracy (Wilson CIs), SLB recalls and oracle against N; fire rate on a second panel."""
    import plots

    cells = result["cells"]
    ns = [c["N"] for c in cells]
    fig, (ax, ax2) = plots.figure(2)
    acc = [c["accuracy"] for c in cells]
    ax.errorbar(ns, acc, yerr=plots.error_bars(acc, [c["ci"] for c in cells]), marker="o",
                capsize=3, label=f"SLB + gate + {result['config']['rerankers'][0]} (end to end)")
    ax.plot(ns, [c["top1_recall"] for c in cells], "s--", label="SLB top-1")
    ax.plot(ns, [c["top3_recall"] for c in cells], "^:", label="SLB top-3")
    oracle = [(c["N"], c["oracle"]) for c in cells if isinstance(c["oracle"], dict)
              and "accuracy" in c["oracle"]]
    if oracle:
        acc_o = [o["accuracy"] for _, o in oracle]
        ax.errorbar([n for n, _ in oracle], acc_o,
                    yerr=plots.error_bars(acc_o, [o["ci"] for _, o in oracle]), fmt="kx",
                    capsize=3, label="concatenate-all oracle")
    for c in cells:
        if c["oracle"] == "overflow":
            ax.annotate("overflow", (c["N"], 0.02), rotation=90, fontsize=7, ha="center")
    ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("registry size N (tools)")
    ax.set_ylabel("accuracy")
    ax.set_title(f"{result['pool']['name']}: routing accuracy (n={result['n_queries']})")
    ax.legend(fontsize=7, loc="lower left")
    ax2.plot(ns, [c["fire_rate"] for c in cells], "o-", label="gate fire rate (test queries)")
    ax2.plot(ns, [c["calibration_fire_rate_median"] for c in cells], "s--",
             label="fire rate on calibration queries")
    ax2.set_xscale("log")
    ax2.set_ylim(0, 1)
    ax2.set_xlabel("registry size N (tools)")
    ax2.set_ylabel("share escalated")
    ax2.legend(fontsize=7)
    plots.save(fig, name, quick)


# ---------------------------------------------------------------------------------------------
# Main


def parse_args() -> Any:
    parser = arg_parser("end-to-end routing accuracy (SLB + gate + reranker) against registry size")
    parser.add_argument("--registry", type=Path, default=SEAL_TOOLS)
    parser.add_argument("--queries", type=Path, default=SEAL_DEV)
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="comma-separated N (capped at pool)")
    parser.add_argument("--n", type=int, default=200, help="queries (file order)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--k", type=int, default=DEFAULT_K,
                        help="SLB candidates handed to the reranker (the library default)")
    parser.add_argument("--text", choices=sorted(TEXTS), default="words_params")
    parser.add_argument("--query-prefix", default="query: ")
    parser.add_argument("--rerankers", default="ql,ql0,none",
                        help="ql, ql0, listing, none; the first is the main one")
    parser.add_argument("--retrieval-weight", type=float, default=DEFAULT_RETRIEVAL_WEIGHT,
                        help="ql's weight on the SLB cosine (the library default)")
    parser.add_argument("--calibration", choices=("tools", "heldout"), default="tools")
    parser.add_argument("--lexical-weight", type=float, default=DEFAULT_LEXICAL_WEIGHT,
                        help="BM25 fusion weight of the router (the library default; 0: the "
                             "SLB cosine alone)")
    parser.add_argument("--oracle-n", type=int, default=10)
    parser.add_argument("--oracle-max-tokens", type=int, default=DEFAULT_CONTEXT_WINDOW,
                        help="longest concat-all prompt run (a time bound; longer ones that fit "
                             "the model's window are 'skipped', those beyond it 'overflow')")
    parser.add_argument("--no-levers", action="store_true")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="embedding cache dir")
    add_tag_argument(parser)
    add_model_argument(parser)
    return parser.parse_args()


def main() -> dict[str, Any]:
    args = parse_args()
    wall = time.perf_counter()
    timing: dict[str, float] = {}
    registry = load_tools(args.registry)
    pool_tools = list(registry)
    queries, skipped = load_queries(args.queries, registry)
    n_queries = QUICK_QUERIES if args.quick else args.n
    queries = queries[:n_queries]
    if args.quick and len(pool_tools) > QUICK_POOL:
        pool_tools = quick_pool(pool_tools, queries, QUICK_POOL, args.seed)
    pool = len(pool_tools)
    sizes = sorted({min(int(s), pool) for s in args.sizes.split(",")})
    if args.quick:
        sizes = sorted({min(10, pool), pool})
    oracle_n = 1 if args.quick else args.oracle_n
    oracle_max = min(args.oracle_max_tokens, QUICK_ORACLE_TOKENS) if args.quick else \
        args.oracle_max_tokens
    labels = [s.strip() for s in args.rerankers.split(",") if s.strip()]
    log(f"pool {pool} tools, {len(queries)} queries ({skipped} skipped), sizes {sizes}")

    t0 = time.perf_counter()
    embedder = Embedder.load()
    text_fn = TEXTS[args.text]
    vectors = embed_cached(embedder, [text_fn(t) for t in pool_tools], "document", args.cache)
    qv = embed_cached(embedder, [args.query_prefix + q.text for q in queries], "query", args.cache)
    heldout = heldout_text = None
    if args.calibration == "heldout":
        heldout_text = heldout_queries(SEAL_DEV)
        heldout = embed_cached(embedder, [args.query_prefix + t for t in heldout_text],
                               "query", args.cache)
    tool_texts = [text_fn(t) for t in pool_tools]
    timing["embed_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    model, tokenizer = nexus_mlx.load(args.model)
    timing["load_llm_s"] = time.perf_counter() - t0
    store = None if args.cache is None else args.cache / "ql-scores.json"
    available = {"ql": lambda: MemoReranker(StoredLikelihoodReranker(
                     model, tokenizer, store=store, retrieval_weight=args.retrieval_weight)),
                 "ql0": lambda: MemoReranker(StoredLikelihoodReranker(
                     model, tokenizer, store=store, retrieval_weight=0.0)),
                 "listing": lambda: MemoReranker(LLMReranker(model, tokenizer)),
                 "none": lambda: None}
    rerankers = {label: available[label]() for label in labels}
    line_tokens = {t.qualified_name: len(tokenizer.encode(f"- {schema_line(t)}\n",
                                                          add_special_tokens=False))
                   for t in pool_tools}
    setup = Setup(
        tools=pool_tools,
        index={t.qualified_name: i for i, t in enumerate(pool_tools)},
        vectors=vectors,
        queries=queries,
        query_vectors={q.text: qv[i] for i, q in enumerate(queries)},
        rerankers=rerankers,
        oracle=ConcatAllOracle(model, tokenizer) if oracle_n > 0 else None,
        line_tokens=line_tokens,
        tokenizer=tokenizer,
        k=args.k,
        seed=args.seed,
        calibration=args.calibration,
        heldout_vectors=heldout,
        heldout_texts=heldout_text,
        lexical_weight=args.lexical_weight,
        tool_texts=tool_texts,
        tool_terms=[words(t) for t in tool_texts],
        context_window=context_window(model),
    )
    # Correctness before measuring: the cached vectors are the embedder's, and the
    # precomputed query path equals embedding the query afresh.
    probe = embedder.embed([text_fn(pool_tools[0]), args.query_prefix + queries[0].text])
    if not (np.allclose(probe[0], vectors[0], atol=1e-5) and np.allclose(probe[1], qv[0],
                                                                          atol=1e-5)):
        raise SystemExit("cached embeddings differ from the embedder's output; clear --cache")

    cells = []
    for n in sizes:
        cell = run_cell(setup, n, oracle_n, oracle_max)
        cells.append(cell)
        for reranker in rerankers.values():
            if isinstance(reranker, MemoReranker) and hasattr(reranker.inner, "flush"):
                reranker.inner.flush()
        oracle = cell["oracle"]
        oracle_text = oracle if not isinstance(oracle, dict) else oracle.get("accuracy", "skipped")
        log(f"N={n}: acc {cell['accuracy']:.3f} {cell['ci']} top1 {cell['top1_recall']:.3f} "
            f"top3 {cell['top3_recall']:.3f} fire {cell['fire_rate']:.3f} "
            f"tau {cell['tau_median']:.4f} oracle {oracle_text} ({cell['seconds']:.0f}s)")
    levers = []
    if not args.quick and not args.no_levers:
        t0 = time.perf_counter()
        levers = lever_sweep(embedder, pool_tools, queries, sizes, ["", args.query_prefix],
                             args.seed, args.cache)
        timing["levers_s"] = time.perf_counter() - t0
    timing["total_s"] = time.perf_counter() - wall
    stats = {label: {"calls": r.calls, "candidate_sets": len(r._memo),
                     "scored_now": getattr(r.inner, "scored", None)}
             for label, r in rerankers.items() if isinstance(r, MemoReranker)}
    name = tagged_name(NAME, args.tag)
    result = {
        "config": {
            "registry": str(args.registry), "queries": str(args.queries), "seed": args.seed,
            "text": args.text, "query_prefix": args.query_prefix, "k": args.k,
            "rerankers": labels, "retrieval_weight": args.retrieval_weight,
            "calibration": args.calibration, "lexical_weight": args.lexical_weight,
            "calibration_note": "tau = calibrate(slb) per registry (20th percentile of "
                                "adversarial margins of the router's fused score; the tools' own "
                                "texts stand in for queries)" if args.calibration == "tools" else
                                "tau = calibrate(slb, held-out dev-difficult query vectors)",
            "embedder": EMBEDDER_ID, "llm": model_record(args.model, model)["model"],
            "oracle_n": oracle_n, "oracle_max_tokens": oracle_max,
            "context_window": setup.context_window,
            "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        },
        **model_record(args.model, model),
        "pool": {"name": args.registry.parent.name, "size": pool,
                 "quick_subset": bool(args.quick and pool < len(registry))},
        "n_queries": len(queries),
        "skipped_queries": skipped,
        "cells": cells,
        "levers": levers,
        "reranker_calls": stats,
        "timing_s": timing,
        "loadavg": list(os.getloadavg()),
    }
    draw_figure(result, name, args.quick)
    return emit(name, result, args.quick)


if __name__ == "__main__":
    main()
