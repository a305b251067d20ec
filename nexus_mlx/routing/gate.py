"""The top-1/top-2 margin gate and its calibration (paper 1).

Contract:
- ``MarginGate(tau).auto_route(scores)`` is True when ``scores[0] - scores[1] >= tau`` (a lone
  candidate always auto-routes): the SLB's top-1 is trusted; otherwise the decision escalates to
  a reranker over the top-k.
- ``calibrate(slb, query_vectors)`` sets ``tau`` to the 20th percentile of the margins of
  *adversarial* queries — those whose top-2 candidates are near-duplicate tools (the cosine
  between the two tools' vectors is at least the registry's ``duplicate_quantile`` of
  nearest-neighbour cosines) — and reports the fire rate (share of all calibration queries that
  would escalate). Without a query set, each tool's own text embedded as a query stands in.
  That stand-in's fire rate is *not* the rate on real requests: a tool text retrieves itself
  with a large margin, so it escalates rarely (GitHub MCP: 3% of the 117 tool texts vs 77% of
  78 real requests, ``results/calibration.json``). :meth:`Calibration.describe` says which set
  was measured; print it rather than a bare "fire rate".
- With ``lexical`` (a :class:`~nexus_mlx.routing.lexical.BM25Index` over the same tools) and
  ``lexical_weight > 0``, margins are taken on the router's fused score
  (:func:`~nexus_mlx.routing.lexical.fuse`: cosine + weight x normalized BM25), the score the
  gate then judges; ``query_texts`` (the calibration queries' text, one per vector; the tools'
  own texts for the stand-in) are required for it. Near-duplicates are still judged by the
  tools' vectors.
- :class:`Calibration` round-trips through JSON together with the registry digest and embedder
  identity it was computed for (and the lexical weight it assumed), so a stale calibration is
  detected, not silently used.

It does not embed text, rerank, or know about the LLM.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from nexus_mlx.errors import ArgumentError
from nexus_mlx.routing.lexical import BM25Index, fuse
from nexus_mlx.routing.slb import SemanticLookasideBuffer

DEFAULT_PERCENTILE = 20.0
DEFAULT_DUPLICATE_QUANTILE = 0.9
TOOL_TEXTS = "the registry's own tool texts"


def margin(scores: Sequence[float] | np.ndarray) -> float:
    """Top-1 minus top-2 score (``inf`` with a single candidate)."""
    arr = np.asarray(scores, dtype=np.float64)
    if arr.size == 0:
        raise ArgumentError("no candidate scores to take a margin of")
    return float("inf") if arr.size == 1 else float(arr[0] - arr[1])


@dataclass(frozen=True)
class MarginGate:
    tau: float

    def auto_route(self, scores: Sequence[float] | np.ndarray) -> bool:
        """True: take the top-1; False: escalate to the reranker."""
        return margin(scores) >= self.tau


@dataclass(frozen=True)
class Calibration:
    tau: float
    fire_rate: float  # share of calibration queries whose margin < tau
    percentile: float
    n_queries: int
    n_adversarial: int
    duplicate_cosine: float  # the near-duplicate threshold that was used
    tools_digest: str
    embedder_id: str
    query_source: str = TOOL_TEXTS  # what the calibration queries were
    lexical_weight: float = 0.0  # the fusion the margins were taken under (0: cosine alone)

    def gate(self) -> MarginGate:
        return MarginGate(self.tau)

    def describe(self) -> str:
        """One line stating what tau is and on which queries the fire rate was measured."""
        fired = round(self.fire_rate * self.n_queries)
        score = ("cosine" if not self.lexical_weight
                 else f"cosine + {self.lexical_weight:g} x BM25")
        head = (f"tau {self.tau:.4f} ({self.percentile:g}th percentile of {self.n_adversarial} "
                f"adversarial margins of the {score} score)")
        if self.query_source == TOOL_TEXTS:
            return (f"{head}; calibration-set fire rate {self.fire_rate:.0%}: {fired} of the "
                    f"registry's {self.n_queries} own tool texts, embedded as stand-in queries, "
                    "fall below tau; not the rate on real requests (their margins are smaller, "
                    "so they escalate more often)")
        return (f"{head}; fire rate {self.fire_rate:.0%} on the {self.n_queries} calibration "
                f"queries ({self.query_source}): {fired} fall below tau")

    def save(self, path: str | os.PathLike[str]) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Calibration:
        try:
            return cls(**json.loads(Path(path).read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise ArgumentError(f"cannot read calibration {path}: {exc}") from exc

    def check(self, slb: SemanticLookasideBuffer, lexical_weight: float | None = None) -> None:
        """Raise unless this calibration was computed for ``slb``'s tools and embedder (and,
        when given, for a router fusing BM25 with ``lexical_weight``)."""
        problems = []
        if lexical_weight is not None and lexical_weight != self.lexical_weight:
            problems.append(f"lexical weight {self.lexical_weight:g} != {lexical_weight:g}")
        if slb.tools_digest and self.tools_digest != slb.tools_digest:
            problems.append(f"tools digest {self.tools_digest!r} != {slb.tools_digest!r}")
        if self.embedder_id != slb.embedder_id:
            problems.append(f"embedder {self.embedder_id!r} != {slb.embedder_id!r}")
        if problems:
            raise ArgumentError("stale calibration: " + "; ".join(problems))


def nearest_neighbour_cosines(vectors: np.ndarray) -> np.ndarray:
    """For each row, the cosine to its most similar other row ``(N,)``."""
    v = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    sims = v @ v.T  # (N, N)
    np.fill_diagonal(sims, -np.inf)
    return sims.max(axis=1)


def top_scores(
    slb: SemanticLookasideBuffer,
    query: np.ndarray,
    k: int,
    lexical: np.ndarray | None = None,
    lexical_weight: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """The router's top-``k`` ``(rows, scores)``: the SLB's INT8 scan, or, with ``lexical``
    scores ``(N,)`` and a positive weight, every row's cosine fused with them (ties to the lower
    row, as the scan)."""
    if lexical is None or lexical_weight <= 0:
        return slb.scan(query, k)
    rows, cosines = slb.scan(query, len(slb))  # every row, best first
    dense = np.empty(len(slb), dtype=np.float32)  # (N,) in row order
    dense[rows] = cosines
    fused = fuse(dense, lexical, lexical_weight)  # (N,)
    top = np.argsort(-fused, kind="stable")[: min(k, len(slb))]
    return top.astype(np.int64), fused[top]


def calibrate(
    slb: SemanticLookasideBuffer,
    query_vectors: np.ndarray | None = None,
    *,
    percentile: float = DEFAULT_PERCENTILE,
    duplicate_quantile: float = DEFAULT_DUPLICATE_QUANTILE,
    query_source: str = "given query vectors",
    lexical: BM25Index | None = None,
    lexical_weight: float = 0.0,
    query_texts: Sequence[str] | None = None,
) -> Calibration:
    """Calibrate ``tau`` on adversarial queries (see the module docstring); ``query_source``
    names ``query_vectors`` in :meth:`Calibration.describe` (ignored without them)."""
    tools = slb.vectors  # (N, D) float32
    if tools.shape[0] < 2:
        raise ArgumentError(f"calibration needs at least 2 tools, the buffer has {tools.shape[0]}")
    queries = tools if query_vectors is None else np.asarray(query_vectors, dtype=np.float32)
    if queries.ndim != 2 or queries.shape[0] == 0:
        raise ArgumentError(f"query vectors must be a non-empty (Q, D) array, got {queries.shape}")
    fused = lexical is not None and lexical_weight > 0
    if fused:
        assert lexical is not None
        if len(lexical) != tools.shape[0]:
            raise ArgumentError(f"the lexical index has {len(lexical)} tools, the SLB "
                                f"{tools.shape[0]}")
        if query_texts is None or len(query_texts) != queries.shape[0]:
            raise ArgumentError(f"fused calibration needs one query text per query vector "
                                f"({queries.shape[0]}), got "
                                f"{None if query_texts is None else len(query_texts)}")
    threshold = float(np.quantile(nearest_neighbour_cosines(tools), duplicate_quantile))
    margins, adversarial = [], []
    for i, q in enumerate(queries):
        lexical_scores = None
        if fused:
            assert lexical is not None and query_texts is not None
            lexical_scores = lexical.normalized(query_texts[i])
        idx, scores = top_scores(slb, q, 2, lexical_scores, lexical_weight if fused else 0.0)
        margins.append(margin(scores))
        a, b = tools[idx[0]], tools[idx[1]]
        cos = float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-12))
        if cos >= threshold - 1e-6:  # tolerance: the same cosine computed two ways
            adversarial.append(margins[-1])
    if not adversarial:
        raise ArgumentError("no adversarial queries (top-2 near-duplicates) in the calibration set")
    tau = float(np.percentile(adversarial, percentile))
    fire = float(np.mean(np.asarray(margins) < tau))
    return Calibration(tau, fire, percentile, len(margins), len(adversarial), threshold,
                       slb.tools_digest or "", slb.embedder_id,
                       TOOL_TEXTS if query_vectors is None else query_source,
                       float(lexical_weight) if fused else 0.0)
