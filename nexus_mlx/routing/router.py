"""Route a request to a tool without reading the deep context (paper 1).

Contract: ``Router(registry, embedder, slb, gate, reranker, k).route(query)`` embeds the query,
scans the SLB for the top-k tools, and either auto-routes to the top-1 (margin >= tau) or, when
the gate fires, lets the reranker reorder the top-k. The :class:`RouteDecision` records every
step (candidates with scores, margin, tau, whether it escalated, the reranker's scores) and its
timings in seconds. The router depends only on the query text: it never reads the LLM's cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from nexus_mlx.agent.registry import ToolRegistry
from nexus_mlx.errors import NexusError
from nexus_mlx.routing.gate import MarginGate, margin
from nexus_mlx.routing.rerank import Reranker
from nexus_mlx.routing.slb import SemanticLookasideBuffer, TextEmbedder


class RoutingError(NexusError, ValueError):
    """Routing over an empty registry, or a buffer that does not match the registry."""


@dataclass
class RouteDecision:
    query: str
    candidates: list[tuple[str, float]]  # SLB top-k, best first
    margin: float
    tau: float
    escalated: bool
    chosen: str
    reranked: list[tuple[str, float]] | None = None
    timings: dict[str, float] = field(default_factory=dict)


class Router:
    def __init__(
        self,
        registry: ToolRegistry,
        embedder: TextEmbedder,
        slb: SemanticLookasideBuffer,
        gate: MarginGate,
        reranker: Reranker | None = None,
        k: int = 5,
    ) -> None:
        if len(registry) == 0:
            raise RoutingError("cannot route over an empty tool registry")
        if list(slb.names) != registry.names():
            raise RoutingError("the SLB's tools differ from the registry's; rebuild the buffer")
        if k < 1:
            raise RoutingError(f"k must be >= 1, got {k}")
        self.registry, self.embedder, self.slb = registry, embedder, slb
        self.gate, self.reranker, self.k = gate, reranker, k

    def route(self, query: str) -> RouteDecision:
        timings: dict[str, float] = {}
        start = time.perf_counter()
        vector = self.embedder.embed([query], kind="query")[0]
        timings["embed"] = time.perf_counter() - start
        start = time.perf_counter()
        candidates = self.slb.lookup(vector, self.k)
        timings["scan"] = time.perf_counter() - start
        scores = [s for _, s in candidates]
        auto = self.gate.auto_route(scores) or self.reranker is None
        decision = RouteDecision(query, candidates, margin(scores), self.gate.tau,
                                 escalated=not auto, chosen=candidates[0][0], timings=timings)
        if not auto:
            assert self.reranker is not None
            start = time.perf_counter()
            tools = [self.registry.get(name) for name, _ in candidates]
            decision.reranked = self.reranker.rerank(query, tools)
            decision.chosen = decision.reranked[0][0]
            timings["rerank"] = time.perf_counter() - start
        return decision
