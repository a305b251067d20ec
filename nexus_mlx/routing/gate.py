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
- :class:`Calibration` round-trips through JSON together with the registry digest and embedder
  identity it was computed for, so a stale calibration is detected, not silently used.

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

    def gate(self) -> MarginGate:
        return MarginGate(self.tau)

    def describe(self) -> str:
        """One line stating what tau is and on which queries the fire rate was measured."""
        fired = round(self.fire_rate * self.n_queries)
        head = (f"tau {self.tau:.4f} ({self.percentile:g}th percentile of {self.n_adversarial} "
                f"adversarial margins)")
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

    def check(self, slb: SemanticLookasideBuffer) -> None:
        """Raise unless this calibration was computed for ``slb``'s tools and embedder."""
        problems = []
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


def calibrate(
    slb: SemanticLookasideBuffer,
    query_vectors: np.ndarray | None = None,
    *,
    percentile: float = DEFAULT_PERCENTILE,
    duplicate_quantile: float = DEFAULT_DUPLICATE_QUANTILE,
    query_source: str = "given query vectors",
) -> Calibration:
    """Calibrate ``tau`` on adversarial queries (see the module docstring); ``query_source``
    names ``query_vectors`` in :meth:`Calibration.describe` (ignored without them)."""
    tools = slb.vectors  # (N, D) float32
    if tools.shape[0] < 2:
        raise ArgumentError(f"calibration needs at least 2 tools, the buffer has {tools.shape[0]}")
    queries = tools if query_vectors is None else np.asarray(query_vectors, dtype=np.float32)
    if queries.ndim != 2 or queries.shape[0] == 0:
        raise ArgumentError(f"query vectors must be a non-empty (Q, D) array, got {queries.shape}")
    threshold = float(np.quantile(nearest_neighbour_cosines(tools), duplicate_quantile))
    margins, adversarial = [], []
    for q in queries:
        idx, scores = slb.scan(q, 2)
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
                       TOOL_TEXTS if query_vectors is None else query_source)
