"""Route a request to a tool without reading the deep context (paper 1).

Contract: ``Router(registry, embedder, slb, gate, reranker, k).route(query)`` embeds the query,
scores every tool by its SLB cosine fused with BM25 over the tools' texts (``cosine +
lexical_weight x BM25 / ceiling``, :mod:`~nexus_mlx.routing.lexical`; ``lexical_weight=0`` is
the SLB scan alone, as before), keeps the top-k, and either auto-routes to the top-1 (margin >=
tau) or, when the gate fires, lets the reranker reorder the top-k (it is given their retrieval
scores too). The gate judges the same scores the router ranks by, so give it a tau calibrated
under the same fusion (``calibrate(..., lexical=router.lexical, lexical_weight=...)``;
:func:`build_router` does). The BM25 index is built from ``registry.texts_for_embedding()``
(the texts the SLB embeds by default) unless ``lexical`` is given. The :class:`RouteDecision`
records every step (candidates with scores, margin, tau, whether it escalated, the reranker's
scores, the lexical weight) and its timings in seconds. The router depends only on the query
text: it never reads the LLM's cache.

:func:`build_router` assembles the tuned defaults from a registry and the LLM: MiniLM embedder
with the ``"query: "`` query prefix, INT8 SLB of the tools' word-split texts, gate calibrated on
the registry under the router's fusion (tau 0, i.e. never escalate, when the registry is too
small to calibrate), and the reranker :func:`~nexus_mlx.routing.rerank.default_reranker` picks
for the model (the tool-choice reranker for a model whose template shows tools, else query
likelihood fused with the retrieval score). Every
default was chosen on held-out queries (``bench/routing_accuracy.py``'s lever sweep,
``bench/rerank_fusion.py``, ``bench/routing_levers.py`` for the lexical weight). The tools'
embeddings go through the on-disk :mod:`~nexus_mlx.routing.embedding_cache` (keyed by the
embedder's fingerprint and the exact texts), so a registry is embedded once, not on every run.
:func:`rebuilt_router` carries a router's settings over to a changed registry (a server's tool
list changed), embedding only the tools the cache has not seen.

An empty or whitespace-only request raises :class:`ArgumentError`: there is nothing to route.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nexus_mlx._platform.mlx_thread import on_mlx_thread
from nexus_mlx.errors import ArgumentError
from nexus_mlx.routing.embedding_cache import (
    CachedDocumentEmbedder,
    EmbeddingCache,
    ProgressFactory,
)
from nexus_mlx.routing.gate import Calibration, MarginGate, calibrate, margin, top_scores
from nexus_mlx.routing.lexical import BM25Index
from nexus_mlx.routing.rerank import Reranker, default_reranker
from nexus_mlx.routing.slb import SemanticLookasideBuffer, TextEmbedder
from nexus_mlx.tools.registry import ToolRegistry

EMBEDDER_ID = "all-MiniLM-L6-v2"
QUERY_PREFIX = "query: "
"""Prepended to requests before embedding (chosen on held-out queries; the lever sweep in
``results/routing_accuracy.json`` shows its effect on the scored ones)."""
DEFAULT_K = 10
"""Candidates the reranker reorders: held-out top-10 recall 0.971 vs 0.938 at k = 5 (4,076 tools),
escalated accuracy 0.842 vs 0.791 (``bench/rerank_fusion.py``)."""
DEFAULT_LEXICAL_WEIGHT = 0.4
"""Weight of the normalized BM25 score added to the cosine, chosen on the 78 hand-written GitHub
MCP requests (``bench/routing_levers.py``: first-stage top-1 0.603 -> 0.731; any weight in
0.1-1.0 beats the cosine alone) and held out on Seal-Tools: ``dev-easy`` 0.810 -> 0.895 over
4,076 tools, 0.945 -> 0.970 over 250, ``dev-difficult`` 0.730 -> 0.810. Seal-Tools requests are
generated from the tool descriptions, so tuned there BM25 would take every weight offered."""


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
    lexical_weight: float = 0.0  # 0: the candidates' scores are SLB cosines alone


class Router:
    def __init__(
        self,
        registry: ToolRegistry,
        embedder: TextEmbedder,
        slb: SemanticLookasideBuffer,
        gate: MarginGate,
        reranker: Reranker | None = None,
        k: int = DEFAULT_K,
        *,
        calibration: Calibration | None = None,
        embeddings_cached: bool | None = None,
        lexical_weight: float = DEFAULT_LEXICAL_WEIGHT,
        lexical: BM25Index | None = None,
    ) -> None:
        if len(registry) == 0:
            raise ArgumentError("cannot route over an empty tool registry")
        if list(slb.names) != registry.names():
            raise ArgumentError("the SLB's tools differ from the registry's; rebuild the buffer")
        if k < 1:
            raise ArgumentError(f"k must be >= 1, got {k}")
        if not isinstance(lexical_weight, int | float) or not 0 <= lexical_weight < float("inf"):
            raise ArgumentError(f"lexical_weight must be finite and >= 0, got {lexical_weight!r}")
        if lexical is not None and len(lexical) != len(registry):
            raise ArgumentError(f"the lexical index has {len(lexical)} tools, the registry "
                                f"{len(registry)}")
        self.registry, self.embedder, self.slb = registry, embedder, slb
        self.gate, self.reranker, self.k = gate, reranker, k
        self.calibration = calibration  # how ``gate`` was set, when known
        self.embeddings_cached = embeddings_cached  # tool vectors read from the disk cache?
        self.lexical_weight = float(lexical_weight)
        if lexical is None and self.lexical_weight > 0:
            lexical = BM25Index(registry.texts_for_embedding())
        self.lexical = lexical

    @on_mlx_thread  # shareable between threads: its MLX work runs on the one MLX thread
    def route(self, query: str, *, on_stage: Callable[[str], None] | None = None) -> RouteDecision:
        """Route ``query``; ``on_stage`` (e.g. a progress bar) hears each stage as it starts."""
        if not isinstance(query, str) or not query.strip():
            raise ArgumentError(f"the request is empty ({query!r}); give the text to route")
        stage = on_stage or (lambda _: None)
        timings: dict[str, float] = {}
        stage("embedding the request and scanning the SLB")
        start = time.perf_counter()
        vector = self.embedder.embed([query], kind="query")[0]
        timings["embed"] = time.perf_counter() - start
        start = time.perf_counter()
        weight = self.lexical_weight if self.lexical is not None else 0.0
        lexical = self.lexical.normalized(query) if self.lexical is not None and weight else None
        rows, found = top_scores(self.slb, vector, self.k, lexical, weight)
        names = self.slb.names
        candidates = [(names[int(i)], float(s)) for i, s in zip(rows, found, strict=True)]
        timings["scan"] = time.perf_counter() - start
        scores = [s for _, s in candidates]
        auto = self.gate.auto_route(scores) or self.reranker is None
        decision = RouteDecision(query, candidates, margin(scores), self.gate.tau,
                                 escalated=not auto, chosen=candidates[0][0], timings=timings,
                                 lexical_weight=weight)
        if not auto:
            assert self.reranker is not None
            stage(f"gate fired: reranking {len(candidates)} candidates")
            start = time.perf_counter()
            tools = [self.registry.get(name) for name, _ in candidates]
            decision.reranked = self.reranker.rerank(query, tools, scores)
            decision.chosen = decision.reranked[0][0]
            timings["rerank"] = time.perf_counter() - start
        return decision


def build_router(
    registry: ToolRegistry,
    model: Any,
    tokenizer: Any,
    *,
    embedder: Any = None,
    embedder_id: str = EMBEDDER_ID,
    reranker: Reranker | None = None,
    k: int = DEFAULT_K,
    embedding_cache: EmbeddingCache | bool = True,
    progress: ProgressFactory | None = None,
    lexical_weight: float = DEFAULT_LEXICAL_WEIGHT,
) -> Router:
    """A :class:`Router` with the library's defaults (module docstring); ``embedder`` (an
    :class:`~nexus_mlx.routing.embedder.Embedder`, loaded with ``QUERY_PREFIX`` when omitted;
    ``embedder_id`` names it in the SLB, the calibration and the embedding cache) and
    ``reranker`` (default: :func:`~nexus_mlx.routing.rerank.default_reranker` on ``model``)
    can be given.
    ``embedding_cache``: True for the user cache folder, False to embed without one, or an
    :class:`EmbeddingCache`; ``progress`` makes a progress bar for the tools a cache miss embeds;
    ``lexical_weight`` is the BM25 fusion (0: the SLB cosine alone, the router before fusion)."""
    if len(registry) == 0:
        raise ArgumentError("cannot route over an empty tool registry")
    if embedder is None:
        from nexus_mlx.routing.embedder import Embedder

        embedder = Embedder.load(query_prefix=QUERY_PREFIX)
    if reranker is None:
        reranker = default_reranker(model, tokenizer)
    return _assemble(registry, embedder, embedder_id, reranker, k, embedding_cache, progress,
                     lexical_weight)


def rebuilt_router(router: Router, registry: ToolRegistry, *,
                   embedding_cache: EmbeddingCache | bool = True) -> Router:
    """A router like ``router`` (its embedder, reranker, k and lexical weight) over another
    ``registry``, as when a server's tool list changed: the SLB is built again through the
    embedding cache (only tools not embedded before are embedded) and the gate is calibrated
    again on the new registry, as :func:`build_router` does (a calibration ``router`` was given
    by hand is not carried over)."""
    if len(registry) == 0:
        raise ArgumentError("cannot route over an empty tool registry")
    return _assemble(registry, router.embedder, router.slb.embedder_id, router.reranker,
                     router.k, embedding_cache, None, router.lexical_weight)


def _assemble(registry: ToolRegistry, embedder: Any, embedder_id: str, reranker: Reranker | None,
              k: int, embedding_cache: EmbeddingCache | bool, progress: ProgressFactory | None,
              lexical_weight: float) -> Router:
    """The SLB, BM25 index and calibrated gate over ``registry``, joined into a router."""
    documents: Any = embedder
    if embedding_cache is not False:
        cache = embedding_cache if isinstance(embedding_cache, EmbeddingCache) else None
        documents = CachedDocumentEmbedder(embedder, embedder_id, cache, progress=progress)
    slb = SemanticLookasideBuffer.from_registry(registry, documents, embedder_id=embedder_id)
    texts = registry.texts_for_embedding()
    lexical = BM25Index(texts) if lexical_weight > 0 else None
    calibration: Calibration | None
    try:
        calibration = calibrate(slb, lexical=lexical, lexical_weight=lexical_weight,
                                query_texts=texts)
        gate = calibration.gate()
    except ArgumentError:
        calibration, gate = None, MarginGate(0.0)
    cached = documents.hit if isinstance(documents, CachedDocumentEmbedder) else None
    return Router(registry, embedder, slb, gate, reranker, k=k, calibration=calibration,
                  embeddings_cached=cached, lexical_weight=lexical_weight, lexical=lexical)
