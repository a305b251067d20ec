"""Benchmark: margin-gate calibration (tau) and fire rate per registry (paper 1, gate table).

Contract: ``python bench/calibration.py [--quick] [--lexical-weight W]`` calibrates the
top-1/top-2 margin gate with the library's ``calibrate`` (tau = 20th percentile of the margins
of adversarial queries, the registry's own tool texts standing in for queries) on the router's
score (the SLB cosine fused with BM25 over the same texts, weight ``W``: the library default;
0 for the cosine alone) on three registries, with the tool text and query prefix of
``bench/routing_accuracy.py`` (``words_params``, ``"query: "``):

- ``github-mcp``: the 117 GitHub MCP tools; test queries ``bench/github_queries.jsonl``;
- ``seal-250``: a seeded random 250-tool sample of Seal-Tools (its calibration is the saved
  one), and, as ``routing_accuracy`` builds them, 250-tool registries of each ``dev-easy``
  query's gold tool plus 249 distractors (per-query tau; fire rate and error capture measured
  on those);
- ``seal-4076``: the whole Seal-Tools pool; test queries the 200 ``dev-easy`` ones.

Per registry: tau, the calibration's own fire rate (share of calibration queries escalating),
the fire rate on the test queries, ``errors_escalated`` (share of SLB top-1 errors the gate
escalates), the first-stage (fused) top-1 accuracy, and the same with ``calibrate(slb, held-out queries)`` as
an alternative (Seal-Tools ``dev-difficult`` queries for Seal; for GitHub, where no held-out
set exists, the test queries themselves: label-free but transductive, for reference only).
Each saved calibration is ``Calibration.save`` JSON (tools digest and embedder id included):
``results/calibration_<registry>.json``. The summary goes to ``results/calibration.json`` with
a PNG of the test-query margins (SLB right vs wrong) and both taus; ``--quick`` (< 1 min) uses
40 queries and a 600-tool Seal subset in place of the whole pool.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # 2 shared cores: one BLAS thread

from common import arg_parser, emit, result_path  # noqa: I001  (loads nexus_mlx before mlx)

import time
from pathlib import Path
from typing import Any

import numpy as np

from nexus_mlx.tools.registry import ToolRegistry, load_tools
from nexus_mlx.routing.embedder import Embedder
from nexus_mlx.routing.gate import Calibration, calibrate, margin, top_scores
from nexus_mlx.routing.lexical import BM25Index
from nexus_mlx.routing.router import DEFAULT_LEXICAL_WEIGHT
from nexus_mlx.routing.slb import SemanticLookasideBuffer
from routing_eval import (
    DEFAULT_CACHE,
    EMBEDDER_ID,
    GITHUB_QUERIES,
    GITHUB_TOOLS,
    SEAL_DEV,
    SEAL_TOOLS,
    TEXTS,
    Query,
    draw,
    embed_cached,
    heldout_queries,
    load_queries,
    log,
    quick_pool,
)

NAME = "calibration"
TEXT = "words_params"
PREFIX = "query: "
SEAL_SAMPLE = 250
QUICK_QUERIES, QUICK_POOL = 40, 600


def build_slb(registry: ToolRegistry, vectors: np.ndarray) -> SemanticLookasideBuffer:
    slb = SemanticLookasideBuffer(vectors.shape[1], f"{EMBEDDER_ID}/{TEXT}",
                                  tools_digest=registry.digest())
    slb.add(registry.names(), vectors)
    return slb


class Scoring:
    """The router's score over one registry: cosine, fused with BM25 when ``weight > 0``."""

    def __init__(self, registry: ToolRegistry, weight: float) -> None:
        self.texts = [TEXTS[TEXT](t) for t in registry]
        self.weight = weight
        self.index = BM25Index(self.texts) if weight > 0 else None

    def calibrate(self, slb: SemanticLookasideBuffer, vectors: np.ndarray | None = None,
                  texts: list[str] | None = None) -> Calibration:
        """``calibrate`` on the tools' texts (no ``vectors``) or on the given queries."""
        return calibrate(slb, vectors, lexical=self.index, lexical_weight=self.weight,
                         query_texts=self.texts if vectors is None else texts)

    def top2(self, slb: SemanticLookasideBuffer, vector: np.ndarray,
             text: str) -> tuple[np.ndarray, np.ndarray]:
        lexical = None if self.index is None else self.index.normalized(text)
        return top_scores(slb, vector, 2, lexical, self.weight)


def gate_stats(slb: SemanticLookasideBuffer, scoring: Scoring, cal: Calibration,
               qv: np.ndarray, queries: list[Query]) -> dict[str, Any]:
    """Fire rate and error capture of ``cal`` on test queries over this buffer."""
    margins, right = [], []
    for q, vec in zip(queries, qv, strict=True):
        idx, scores = scoring.top2(slb, vec, q.text)
        margins.append(margin(scores))
        right.append(slb.names[int(idx[0])] == q.tool)
    m, ok = np.asarray(margins), np.asarray(right)
    fire = m < cal.tau
    return {"fire_rate_test": float(fire.mean()),
            "errors_escalated": float((fire & ~ok).sum() / max((~ok).sum(), 1)),
            "slb_top1": float(ok.mean()), "margins": m.tolist(), "slb_correct": ok.tolist()}


def summary(cal: Calibration) -> dict[str, Any]:
    return {"tau": cal.tau, "fire_rate_calibration": cal.fire_rate, "n_queries": cal.n_queries,
            "n_adversarial": cal.n_adversarial, "duplicate_cosine": cal.duplicate_cosine}


def whole_registry(name: str, registry: ToolRegistry, vectors: np.ndarray, qv: np.ndarray,
                   queries: list[Query], heldout: np.ndarray, heldout_texts: list[str],
                   heldout_note: str, quick: bool, weight: float) -> dict[str, Any]:
    """Calibrate one registry (tools and held-out), save the tools calibration, measure."""
    slb = build_slb(registry, vectors)
    scoring = Scoring(registry, weight)
    t0 = time.perf_counter()
    cal = scoring.calibrate(slb)
    seconds = time.perf_counter() - t0
    alt = scoring.calibrate(slb, heldout, heldout_texts)
    path = result_path(f"calibration_{name}", quick)
    path.parent.mkdir(parents=True, exist_ok=True)
    cal.save(path)
    if Calibration.load(path) != cal:
        raise SystemExit(f"{path} does not round-trip")
    tools_stats = gate_stats(slb, scoring, cal, qv, queries)
    alt_stats = gate_stats(slb, scoring, alt, qv, queries)
    log(f"{name}: tau {cal.tau:.4f} cal-fire {cal.fire_rate:.3f} test-fire "
        f"{tools_stats['fire_rate_test']:.3f} caught {tools_stats['errors_escalated']:.3f} | "
        f"held-out tau {alt.tau:.4f} test-fire {alt_stats['fire_rate_test']:.3f}")
    margins = tools_stats.pop("margins")
    correct = tools_stats.pop("slb_correct")
    for key in ("margins", "slb_correct", "slb_top1"):
        alt_stats.pop(key)
    return {"registry": name, "n_tools": len(registry), "n_test_queries": len(queries),
            "calibration_file": str(path), "calibrate_seconds": seconds,
            "tools": {**summary(cal), **tools_stats},
            "heldout": {**summary(alt), **alt_stats, "source": heldout_note},
            "test_margins": margins, "test_slb_correct": correct}


def per_query_250(tools: list[Any], vectors: np.ndarray, qv: np.ndarray,
                  queries: list[Query], heldout: np.ndarray, heldout_texts: list[str],
                  seed: int, weight: float) -> dict[str, Any]:
    """routing_accuracy's N = 250 registries: per-query tau, fire rate, error capture."""
    index = {t.qualified_name: i for i, t in enumerate(tools)}
    taus, alt_taus, cal_fire, fire, alt_fire, wrong, caught, alt_caught = ([] for _ in range(8))
    margins = []
    for qi, q in enumerate(queries):
        idx = draw(len(tools), index[q.tool], SEAL_SAMPLE, seed, qi)
        registry = ToolRegistry([tools[i] for i in idx])
        slb = build_slb(registry, vectors[idx])
        scoring = Scoring(registry, weight)
        cal, alt = scoring.calibrate(slb), scoring.calibrate(slb, heldout, heldout_texts)
        top, scores = scoring.top2(slb, qv[qi], q.text)
        m = margin(scores)
        bad = slb.names[int(top[0])] != q.tool
        taus.append(cal.tau)
        alt_taus.append(alt.tau)
        cal_fire.append(cal.fire_rate)
        fire.append(m < cal.tau)
        alt_fire.append(m < alt.tau)
        wrong.append(bad)
        caught.append(bad and m < cal.tau)
        alt_caught.append(bad and m < alt.tau)
        margins.append(m)
    n_wrong = max(sum(wrong), 1)
    return {"n_registries": len(queries),
            "tools": {"tau_median": float(np.median(taus)),
                      "tau_range": [float(min(taus)), float(max(taus))],
                      "fire_rate_calibration_median": float(np.median(cal_fire)),
                      "fire_rate_test": float(np.mean(fire)),
                      "errors_escalated": sum(caught) / n_wrong},
            "heldout": {"tau_median": float(np.median(alt_taus)),
                        "fire_rate_test": float(np.mean(alt_fire)),
                        "errors_escalated": sum(alt_caught) / n_wrong},
            "slb_top1": 1.0 - float(np.mean(wrong)),
            "test_margins": margins, "test_slb_correct": [not w for w in wrong]}


def draw_figure(entries: list[dict[str, Any]], quick: bool) -> None:
    import plots

    fig, axes = plots.figure(len(entries), width=4.5)
    for ax, entry in zip(np.atleast_1d(axes), entries, strict=True):
        m = np.asarray(entry["test_margins"])
        ok = np.asarray(entry["test_slb_correct"], dtype=bool)
        bins = np.linspace(0, max(float(m.max()), 0.05), 30)
        ax.hist(m[ok], bins=bins, alpha=0.6, label="SLB top-1 right")
        ax.hist(m[~ok], bins=bins, alpha=0.6, label="SLB top-1 wrong")
        tools_tau = entry["tools"].get("tau", entry["tools"].get("tau_median"))
        held_tau = entry["heldout"].get("tau", entry["heldout"].get("tau_median"))
        ax.axvline(tools_tau, color="k", ls="--",
                   label=f"tau (tools) {tools_tau:.3f}: fire {entry['tools']['fire_rate_test']:.2f}")
        ax.axvline(held_tau, color="r", ls=":",
                   label=f"tau (held-out) {held_tau:.3f}: fire "
                         f"{entry['heldout']['fire_rate_test']:.2f}")
        ax.set_title(entry["registry"])
        ax.set_xlabel("top-1 minus top-2 score (test queries)")
        ax.set_ylabel("queries")
        ax.legend(fontsize=6)
    plots.save(fig, NAME, quick)


def main() -> dict[str, Any]:
    parser = arg_parser("margin-gate tau and fire rate per registry")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--lexical-weight", type=float, default=DEFAULT_LEXICAL_WEIGHT,
                        help="the router's BM25 fusion weight (library default; 0: cosine only)")
    args = parser.parse_args()
    weight = args.lexical_weight
    wall = time.perf_counter()
    embedder = Embedder.load()
    text_fn = TEXTS[TEXT]

    def vectors_of(tools: list[Any]) -> np.ndarray:
        return embed_cached(embedder, [text_fn(t) for t in tools], "document", args.cache)

    def queries_of(queries: list[Query]) -> np.ndarray:
        return embed_cached(embedder, [PREFIX + q.text for q in queries], "query", args.cache)

    entries = []
    github = load_tools(GITHUB_TOOLS)
    gq = load_queries(GITHUB_QUERIES, github)[0]
    gqv = queries_of(gq)
    entries.append(whole_registry("github-mcp", github, vectors_of(list(github)), gqv, gq, gqv,
                                  [q.text for q in gq],
                                  "the GitHub test queries themselves (transductive, label-free)",
                                  args.quick, weight))

    seal = load_tools(SEAL_TOOLS)
    sq = load_queries(SEAL_DEV, seal)[0][: QUICK_QUERIES if args.quick else None]
    pool = list(seal)
    if args.quick:
        pool = quick_pool(pool, sq, QUICK_POOL, args.seed)
    pool_vectors = vectors_of(pool)
    sqv = queries_of(sq)
    held = heldout_queries(SEAL_DEV)
    hv = embed_cached(embedder, [PREFIX + t for t in held], "query", args.cache)
    note = f"{len(held)} Seal-Tools dev-difficult queries (held out from the test set)"

    rng = np.random.default_rng([args.seed, SEAL_SAMPLE])
    sample = sorted(rng.choice(len(pool), size=SEAL_SAMPLE, replace=False).tolist())
    sample_reg = ToolRegistry([pool[i] for i in sample])
    inside = [q for q in sq if q.tool in sample_reg]  # test queries whose gold it holds
    fixed = None
    if inside:
        fixed = whole_registry("seal-250", sample_reg, pool_vectors[sample], queries_of(inside),
                               inside, hv, held, note, args.quick, weight)
    per_query = per_query_250(pool, pool_vectors, sqv, sq, hv, held, args.seed, weight)
    log(f"seal-250 per-query draws: tau median {per_query['tools']['tau_median']:.4f} "
        f"test-fire {per_query['tools']['fire_rate_test']:.3f} "
        f"caught {per_query['tools']['errors_escalated']:.3f}")
    seal_250 = {"registry": "seal-250", "fixed_sample": fixed, **per_query}
    entries.append(seal_250)
    whole_name = "seal-4076" if not args.quick else f"seal-{len(pool)}"
    entries.append(whole_registry(whole_name, ToolRegistry(pool), pool_vectors, sqv, sq, hv, held,
                                  note, args.quick, weight))

    result = {
        "config": {"text": TEXT, "query_prefix": PREFIX, "embedder": EMBEDDER_ID,
                   "lexical_weight": weight,
                   "percentile": 20.0, "duplicate_quantile": 0.9, "seed": args.seed,
                   "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS")},
        "registries": entries,
        "seconds": time.perf_counter() - wall,
        "loadavg": list(os.getloadavg()),
    }
    draw_figure(entries, args.quick)
    for entry in entries:  # per-query margins are in the PNG; keep the JSON small
        entry.pop("test_margins", None)
        entry.pop("test_slb_correct", None)
        if isinstance(entry.get("fixed_sample"), dict):
            entry["fixed_sample"].pop("test_margins", None)
            entry["fixed_sample"].pop("test_slb_correct", None)
    return emit(NAME, result, args.quick)


if __name__ == "__main__":
    main()
