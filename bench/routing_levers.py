"""Benchmark: first-stage routing levers (no LLM) across registries: dense tool texts, BM25,
dense + lexical fusion and name matching, tuned on one query set and reported on the others.

Contract: ``python bench/routing_levers.py [--quick] [--n 200] [--seed 0] [--tag T]`` scores
every method on every query set by the rank of the gold tool (top-1 / top-3 / top-10, Wilson
95% CIs on top-1), fp32 scores, the same registry draws for every method:

- ``github`` (the tuning set): the 117 GitHub MCP tools and ``bench/github_queries.jsonl``
  (whole registry);
- ``seal-easy``: Seal-Tools ``dev`` single-call queries (the first ``--n``), at N = 250 (gold
  plus 249 distractors, ``routing_eval.draw``) and at the whole 4,076-tool pool;
- ``seal-difficult``: the several-call ``dev`` queries over the whole pool; a hit is the top-1
  (top-k) holding any of the query's gold tools.

Methods: ``dense:<text>`` (MiniLM cosine of the ``"query: "``-prefixed request with the tool's
``name_desc`` / ``params`` / ``words_params`` (the library's) / ``first_params`` (description
cut to its first sentence) text); ``bm25`` (BM25 over the ``words_params`` text,
:class:`~nexus_mlx.routing.lexical.BM25Index` built on each registry); ``fused:w`` (``dense +
w * BM25 / ceiling``, :func:`~nexus_mlx.routing.lexical.fuse`, the router's score);
``fused-first:w`` (both on the first-sentence text); ``rrf`` (reciprocal-rank fusion, k = 60);
``fused+name:w,v`` (plus ``v`` times the share of the tool's name words found in the request);
``hubness:b`` (cosine minus ``b`` times the tool's mean cosine to its 10 nearest tools, CSLS-style
hub correction), alone and fused. The fusion weight is chosen on ``github`` alone (best top-1;
ties to the smaller weight): its requests are the only ones written by hand; the Seal-Tools
requests are generated from the tool descriptions, so BM25 alone nearly solves them and tuning
there picks the largest weight offered. The held-out sets are never looked at for the choice.

``--quick`` (about a minute once embeddings are cached): 40 queries per set, a 500-tool pool cut
to their gold tools plus random ones. Embeddings are cached on disk (``routing_eval``'s
``embed_cached``, keyed by the embedder's fingerprint). JSON: ``{"config", "sets": {name:
{"n", "sizes"}}, "rows": [{"method", "set", "N", "top1", "top1_ci", "top3", "top10"}],
"chosen", "confusions", "timing_s"}`` in ``results/routing_levers[_<tag>].json``
(``results/quick/`` with ``--quick``), a PNG beside it, and the JSON as the last stdout line.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # 2 shared cores: one BLAS thread

from common import ( # noqa: I001  (loads nexus_mlx before mlx)
    add_tag_argument,
    arg_parser,
    emit,
    tagged_name,
)

import json
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from nexus_mlx.routing.embedder import Embedder
from nexus_mlx.routing.lexical import BM25Index, fuse, words
from nexus_mlx.routing.router import QUERY_PREFIX
from nexus_mlx.tools.registry import load_tools, split_identifier, text_for_embedding
from nexus_mlx.tools.tool import Tool, sanitize_name
from routing_eval import (
    DEFAULT_CACHE,
    GITHUB_QUERIES,
    GITHUB_TOOLS,
    SEAL_DEV,
    SEAL_TOOLS,
    TEXTS,
    draw,
    embed_cached,
    load_queries,
    log,
    quick_pool,
    wilson,
)

NAME = "routing_levers"
LEXICAL_TEXT = "words_params"
WEIGHTS = (0.1, 0.2, 0.3, 0.4, 0.6, 0.8, 1.0, 1.5)
NAME_WEIGHTS = (0.05, 0.1)
HUB_K, HUB_BETA = 10, 0.5
RRF_K = 60
TUNING_SET = "github"
QUICK_QUERIES, QUICK_POOL = 40, 500


@dataclass
class QuerySet:
    """Requests with their gold tool sets over one tool pool, and the registry sizes to draw."""

    name: str
    tools: list[Tool]
    texts: list[str]
    gold: list[set[int]]  # pool indices of each request's gold tools
    sizes: list[int]


@dataclass
class Pool:
    """What every method reads about one pool: dense vectors per text, terms, name terms."""

    vectors: dict[str, np.ndarray]  # text name -> (P, D)
    terms: list[list[str]]  # BM25 terms of each tool's lexical text
    name_terms: list[set[str]]
    first_terms: list[list[str]]  # BM25 terms of the first-sentence text


def multi_call_queries(registry_names: set[str], limit: int) -> list[tuple[str, list[str]]]:
    """Seal-Tools ``dev`` rows with several calls whose gold tools are all in the pool."""
    out = []
    for line in SEAL_DEV.read_text("utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        calls = [sanitize_name(c["api"]) for c in row.get("calling", [])]
        if len(calls) > 1 and all(c in registry_names for c in calls):
            out.append((row["query"], calls))
    return out[:limit]


def build_sets(n: int, quick: bool, seed: int) -> list[QuerySet]:
    github = load_tools(GITHUB_TOOLS)
    gh_tools = list(github)
    gh_index = {t.qualified_name: i for i, t in enumerate(gh_tools)}
    gh_queries, _ = load_queries(GITHUB_QUERIES, github)
    if quick:
        gh_queries = gh_queries[:QUICK_QUERIES]
    seal = load_tools(SEAL_TOOLS)
    seal_tools = list(seal)
    easy, _ = load_queries(SEAL_DEV, seal)
    easy = easy[: QUICK_QUERIES if quick else n]
    hard = multi_call_queries(set(seal.names()), QUICK_QUERIES if quick else 10_000)
    if quick:
        from routing_eval import Query

        stand_ins = easy + [Query(q, c) for q, calls in hard for c in calls]
        seal_tools = quick_pool(seal_tools, stand_ins, QUICK_POOL, seed)
    seal_index = {t.qualified_name: i for i, t in enumerate(seal_tools)}
    pool = len(seal_tools)
    return [
        QuerySet("github", gh_tools, [q.text for q in gh_queries],
                 [{gh_index[q.tool]} for q in gh_queries], [len(gh_tools)]),
        QuerySet("seal-easy", seal_tools, [q.text for q in easy],
                 [{seal_index[q.tool]} for q in easy], sorted({min(250, pool), pool})),
        QuerySet("seal-difficult", seal_tools, [q for q, _ in hard],
                 [{seal_index[c] for c in calls} for _, calls in hard], [pool]),
    ]


def first_sentence_text(tool: Tool) -> str:
    """``words_params`` with the description cut to its first sentence (the summary; what
    follows is usually usage notes: pagination, SHA rules, when not to use the tool)."""
    description = " ".join(tool.description.split())
    found = re.match(r"(.+?[.!?])(?:\s|$)", description)
    short = replace(tool, description=found.group(1) if found else description)
    return text_for_embedding(short)


ALL_TEXTS: dict[str, Callable[[Tool], str]] = {**TEXTS, "first_params": first_sentence_text}


def pool_features(embedder: Embedder, tools: list[Tool], cache: Any) -> Pool:
    vectors = {name: embed_cached(embedder, [fn(t) for t in tools], "document", cache)
               for name, fn in ALL_TEXTS.items()}
    terms = [words(TEXTS[LEXICAL_TEXT](t)) for t in tools]
    name_terms = [set(words(split_identifier(t.name))) for t in tools]
    return Pool(vectors, terms, name_terms, [words(first_sentence_text(t)) for t in tools])


@dataclass
class Signals:
    """Every score of one request against one registry, ``(n,)`` each."""

    dense: dict[str, np.ndarray]  # text name -> cosine
    lexical: np.ndarray  # normalized BM25 over the words_params text
    lexical_first: np.ndarray  # normalized BM25 over the first-sentence text
    name: np.ndarray  # share of the tool's name words found in the request
    hub: np.ndarray  # mean cosine of each tool to its HUB_K nearest tools (words_params)


Scorer = Callable[[Signals], np.ndarray]


def ranks_of(scores: np.ndarray) -> np.ndarray:
    """Rank (0 = best) of every entry, ties broken by position."""
    order = np.argsort(-scores, kind="stable")
    out = np.empty_like(order)
    out[order] = np.arange(order.size)
    return out


def methods() -> dict[str, Scorer]:
    """Method name -> scorer (see the module docstring)."""
    table: dict[str, Scorer] = {
        f"dense:{text}": (lambda g, text=text: g.dense[text]) for text in ALL_TEXTS
    }
    table["bm25"] = lambda g: g.lexical
    for w in WEIGHTS:
        table[f"fused:{w:g}"] = lambda g, w=w: fuse(g.dense[LEXICAL_TEXT], g.lexical, w)
    for w in (0.4, 0.6):
        table[f"fused-first:{w:g}"] = lambda g, w=w: fuse(g.dense["first_params"],
                                                          g.lexical_first, w)
    table["rrf"] = lambda g: (1.0 / (RRF_K + ranks_of(g.dense[LEXICAL_TEXT]))
                              + 1.0 / (RRF_K + ranks_of(g.lexical)))
    for w in (0.2, 0.4):
        for v in NAME_WEIGHTS:
            table[f"fused+name:{w:g},{v:g}"] = (
                lambda g, w=w, v=v: fuse(g.dense[LEXICAL_TEXT], g.lexical, w) + v * g.name)
    table[f"hubness:{HUB_BETA:g}"] = lambda g: g.dense[LEXICAL_TEXT] - HUB_BETA * g.hub
    table[f"hubness:{HUB_BETA:g}+fused:0.4"] = lambda g: fuse(
        g.dense[LEXICAL_TEXT] - HUB_BETA * g.hub, g.lexical, 0.4)
    return table


def gold_rank(scores: np.ndarray, gold_rows: list[int]) -> int:
    """Rank of the best-placed gold row (ties count against it, as the SLB's lower-index rule
    would place an earlier distractor first only when its score is strictly higher)."""
    return min(int((scores > scores[g]).sum()) for g in gold_rows)


@dataclass
class Registry:
    """One drawn registry: pool rows, its BM25 indices and hubness (built once per draw)."""

    idx: np.ndarray
    lexical: BM25Index
    lexical_first: BM25Index
    hub: np.ndarray  # (n,)


def registry_of(feats: Pool, idx: np.ndarray) -> Registry:
    base = feats.vectors[LEXICAL_TEXT][idx]  # (n, D)
    sims = base @ base.T  # (n, n)
    np.fill_diagonal(sims, -np.inf)
    k = min(HUB_K, len(idx) - 1)
    hub = np.sort(sims, axis=1)[:, -k:].mean(axis=1) if k > 0 else np.zeros(len(idx))
    return Registry(idx, BM25Index.from_terms([feats.terms[i] for i in idx]),
                    BM25Index.from_terms([feats.first_terms[i] for i in idx]),
                    hub.astype(np.float32))


def signals(feats: Pool, reg: Registry, qvec: np.ndarray, text: str) -> Signals:
    """Every signal of one request over one registry."""
    query_terms = set(words(text))
    return Signals(
        dense={t: feats.vectors[t][reg.idx] @ qvec for t in ALL_TEXTS},  # (n,) each
        lexical=reg.lexical.normalized(text),
        lexical_first=reg.lexical_first.normalized(text),
        name=np.asarray([len(feats.name_terms[i] & query_terms) / max(len(feats.name_terms[i]), 1)
                         for i in reg.idx], dtype=np.float32),
        hub=reg.hub,
    )


def evaluate(qs: QuerySet, feats: Pool, qv: np.ndarray, n: int, seed: int,
             table: dict[str, Scorer]) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """Gold ranks of every query under every method at registry size ``n``, and on a
    whole-registry set the top-1 row each method picked."""
    pool = len(qs.tools)
    whole = registry_of(feats, np.arange(pool)) if n >= pool else None
    ranks: dict[str, list[int]] = {name: [] for name in table}
    picks: dict[str, list[int]] = {name: [] for name in table}
    for qi, text in enumerate(qs.texts):
        gold = sorted(qs.gold[qi])
        reg = whole if whole is not None else registry_of(feats, draw(pool, gold[0], n, seed, qi))
        idx = reg.idx
        present = set(idx.tolist())
        rows = [int(np.flatnonzero(idx == g)[0]) for g in gold if g in present]
        found = signals(feats, reg, qv[qi], text)
        for method, scorer in table.items():
            scores = np.asarray(scorer(found), dtype=np.float64)
            ranks[method].append(gold_rank(scores, rows))
            picks[method].append(int(idx[int(np.argmax(scores))]))
    return ranks, picks


def confusions(qs: QuerySet, ranks: list[int], picks: list[int]) -> list[dict[str, Any]]:
    """Every missed top-1 of one method on a whole-registry set: gold, winner, gold's rank."""
    return [{"query": text, "gold": qs.tools[sorted(qs.gold[qi])[0]].qualified_name,
             "chosen": qs.tools[picks[qi]].qualified_name, "rank": ranks[qi]}
            for qi, text in enumerate(qs.texts) if ranks[qi] > 0]


def summarize(method: str, set_name: str, n: int, ranks: list[int]) -> dict[str, Any]:
    r = np.asarray(ranks)
    hits = int((r < 1).sum())
    return {"method": method, "set": set_name, "N": n, "n": int(r.size),
            "top1": hits / r.size, "top1_ci": wilson(hits, int(r.size)),
            "top3": float((r < 3).mean()), "top10": float((r < 10).mean())}


def draw_figure(result: dict[str, Any], name: str, quick: bool) -> None:
    """Top-1 of the dense baseline, BM25 and every fusion weight, one line per set and N."""
    import plots

    fig, ax = plots.figure(1)
    rows = result["rows"]
    keys = sorted({(r["set"], r["N"]) for r in rows})
    xs = [0.0, *WEIGHTS]
    for set_name, n in keys:
        by = {r["method"]: r["top1"] for r in rows if r["set"] == set_name and r["N"] == n}
        ys = [by["dense:words_params"], *[by[f"fused:{w:g}"] for w in WEIGHTS]]
        ax.plot(xs, ys, "o-", label=f"{set_name} N={n}")
    ax.axvline(result["chosen"]["weight"], color="k", ls=":", lw=1,
               label=f"chosen on {TUNING_SET}")
    ax.set_xlabel("lexical weight w (score = cosine + w * BM25 / ceiling)")
    ax.set_ylabel("top-1 (first stage, no reranker)")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=7)
    ax.set_title("dense + lexical fusion")
    plots.save(fig, name, quick)


def parse_args() -> Any:
    parser = arg_parser("first-stage routing levers (dense, BM25, fusion) across registries")
    parser.add_argument("--n", type=int, default=200, help="Seal-Tools dev-easy queries")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", default=str(DEFAULT_CACHE), help="embedding cache dir")
    add_tag_argument(parser)
    return parser.parse_args()


def main() -> dict[str, Any]:
    from pathlib import Path

    args = parse_args()
    cache = Path(args.cache) if args.cache else None
    wall = time.perf_counter()
    sets = build_sets(args.n, args.quick, args.seed)
    embedder = Embedder.load()
    table = methods()
    rows: list[dict[str, Any]] = []
    features: dict[int, Pool] = {}
    per_set: dict[str, Any] = {}
    timing: dict[str, float] = {}
    github_misses: dict[str, Any] = {}
    for qs in sets:
        t0 = time.perf_counter()
        key = id(qs.tools)
        if key not in features:
            features[key] = pool_features(embedder, qs.tools, cache)
        qv = embed_cached(embedder, [QUERY_PREFIX + t for t in qs.texts], "query", cache)
        timing[f"embed_{qs.name}_s"] = time.perf_counter() - t0
        per_set[qs.name] = {"n": len(qs.texts), "pool": len(qs.tools), "sizes": qs.sizes}
        for n in qs.sizes:
            t0 = time.perf_counter()
            ranks, picks = evaluate(qs, features[key], qv, n, args.seed, table)
            cell = [summarize(m, qs.name, n, r) for m, r in ranks.items()]
            rows.extend(cell)
            if qs.name == "github":
                github_misses = {m: confusions(qs, ranks[m], picks[m]) for m in table}
            timing[f"score_{qs.name}_{n}_s"] = time.perf_counter() - t0
            dense = next(r for r in cell if r["method"] == f"dense:{LEXICAL_TEXT}")
            best = max(cell, key=lambda r: r["top1"])
            log(f"{qs.name} N={n} n={len(qs.texts)}: dense {dense['top1']:.3f}, "
                f"best {best['method']} {best['top1']:.3f}")
    tuning = [r for r in rows if r["set"] == TUNING_SET and r["method"].startswith("fused:")]
    chosen = max(tuning, key=lambda r: (r["top1"], -float(r["method"].split(":")[1])))
    weight = float(chosen["method"].split(":")[1])
    baseline = f"dense:{LEXICAL_TEXT}"
    pairs = Counter((c["gold"], c["chosen"]) for c in github_misses.get(baseline, []))
    timing["total_s"] = time.perf_counter() - wall
    name = tagged_name(NAME, args.tag)
    result = {
        "config": {"embedder": "all-MiniLM-L6-v2", "query_prefix": QUERY_PREFIX,
                   "lexical_text": LEXICAL_TEXT, "weights": list(WEIGHTS), "rrf_k": RRF_K,
                   "hubness": {"k": HUB_K, "beta": HUB_BETA},
                   "tuning_set": TUNING_SET, "seed": args.seed, "scan": "fp32",
                   "registries": {"github": str(GITHUB_TOOLS), "seal": str(SEAL_TOOLS)}},
        "sets": per_set,
        "rows": rows,
        "chosen": {"method": chosen["method"], "weight": weight, "on": TUNING_SET,
                   "tuning_top1": chosen["top1"],
                   "held_out": {f"{r['set']}@{r['N']}": r["top1"] for r in rows
                                if r["method"] == chosen["method"] and r["set"] != TUNING_SET},
                   "held_out_dense": {f"{r['set']}@{r['N']}": r["top1"] for r in rows
                                      if r["method"] == baseline and r["set"] != TUNING_SET}},
        "confusions": {"github": {m: github_misses[m] for m in (baseline, chosen["method"])}
                       if github_misses else {},
                       "github_pairs": [[g, c, k] for (g, c), k in pairs.most_common()]},
        "timing_s": timing,
        "loadavg": list(os.getloadavg()),
    }
    draw_figure(result, name, args.quick)
    return emit(name, result, args.quick)


if __name__ == "__main__":
    main()
