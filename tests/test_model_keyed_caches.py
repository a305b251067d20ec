"""Caches keyed by content include the model: the benchmarks' stored query-likelihood scores
and cached embeddings are never shared between two models (other weights, other tokenizer),
and are shared by two loads of the same one. Tiny random models and a character tokenizer for
the likelihoods, the real MiniLM (and a nudged copy of it) for the embeddings."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
from routing_eval import StoredLikelihoodReranker, embed_cached
from tiny_models import tiny_model

from nexus_mlx.routing.rerank import QueryLikelihoodReranker
from nexus_mlx.tools.tool import Tool


class CharTokenizer:
    """One token per character, below the tiny vocabulary (no chat template)."""

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset

    def encode(self, text, add_special_tokens=False):
        return [(ord(c) + self.offset) % 100 for c in text]


TOOLS = [Tool("create_repository", "Create a new GitHub repository"),
         Tool("list_issues", "List issues in a GitHub repository")]
QUERY = "make a repo called demo"


def _scores(model, tokenizer, store: Path) -> tuple[list[float], int]:
    reranker = StoredLikelihoodReranker(model, tokenizer, store=store)
    scores = [reranker.likelihood(QUERY, t) for t in TOOLS]
    reranker.flush()
    return scores, reranker.scored


def test_stored_likelihoods_are_per_model(tmp_path: Path):
    store = tmp_path / "ql-scores.json"
    tok = CharTokenizer()
    first, scored = _scores(tiny_model("llama", seed=0), tok, store)
    assert scored == 2 and len(json.loads(store.read_text())) == 2
    # the same weights loaded again: every score is read back, none recomputed
    again, scored = _scores(tiny_model("llama", seed=0), tok, store)
    assert scored == 0 and again == first
    # other weights, same architecture and shapes: computed afresh, and they differ
    other_model = tiny_model("llama", seed=1)
    other, scored = _scores(other_model, tok, store)
    assert scored == 2 and other != first
    plain = QueryLikelihoodReranker(other_model, tok)
    assert other == [plain.likelihood(QUERY, t) for t in TOOLS]
    # the same model read through another tokenizer: other token ids, other entries
    _, scored = _scores(tiny_model("llama", seed=0), CharTokenizer(offset=7), store)
    assert scored == 2 and len(json.loads(store.read_text())) == 6


def test_cached_embeddings_are_per_encoder(tmp_path: Path):
    from nexus_mlx.routing.embedder import Embedder

    embedder = Embedder.load()
    nudged = Embedder(embedder.config,
                      dataclasses.replace(embedder.weights, word=embedder.weights.word * 1.01),
                      embedder.tokenizer, max_length=embedder.max_length)
    texts = ["list issues: List issues in a GitHub repository", "star repository: Star it"]
    first = embed_cached(embedder, texts, "document", tmp_path)
    assert len(list(tmp_path.glob("emb-*.npy"))) == 1
    np.testing.assert_array_equal(embed_cached(embedder, texts, "document", tmp_path), first)
    second = embed_cached(nudged, texts, "document", tmp_path)
    assert len(list(tmp_path.glob("emb-*.npy"))) == 2
    np.testing.assert_allclose(second, nudged.embed(texts), atol=1e-5)
    assert not np.allclose(second, first, atol=1e-4)
