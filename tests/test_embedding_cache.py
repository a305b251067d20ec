"""The registry-embedding disk cache: a second build of the same registry reads the vectors back
(no embedder call) bit-identical, any changed text misses, another encoder (other weights under
the same id) never shares an entry, an embedder without a fingerprint is not cached, corrupt
files are ignored and rebuilt, writes are atomic and best effort, and the cache sits under
``$NEXUS_MLX_CACHE``."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import numpy as np
import pytest

from nexus_mlx.routing.embedding_cache import (
    CachedDocumentEmbedder,
    EmbeddingCache,
    default_folder,
    embedding_key,
)
from nexus_mlx.routing.router import build_router
from nexus_mlx.tools.registry import ToolRegistry
from nexus_mlx.tools.tool import Tool

DIM = 24


class CountingEmbedder:
    """Deterministic unit vectors from each text's hash; counts document texts embedded."""

    document_prefix = ""
    max_length = 256

    def __init__(self, fingerprint: str | None = "counting-1") -> None:
        self.document_texts = 0
        self.calls = 0
        self.fingerprint = fingerprint

    def embed(self, texts, *, kind="document"):
        if kind == "document":
            self.document_texts += len(texts)
            self.calls += 1
        rows = []
        for text in texts:
            key = f"{self.fingerprint}:{kind}:{text}".encode()
            seed = int.from_bytes(hashlib.sha256(key).digest()[:4], "little")
            rows.append(np.random.default_rng(seed).standard_normal(DIM))
        arr = np.asarray(rows, np.float32).reshape(len(texts), DIM)
        return arr / np.linalg.norm(arr, axis=1, keepdims=True)


class NoReranker:
    def rerank(self, query, tools, retrieval_scores=None):
        return [(t.qualified_name, 0.0) for t in tools]


def _registry(n: int = 12, changed: int | None = None) -> ToolRegistry:
    return ToolRegistry([
        Tool(f"tool_{i}", f"does thing number {i}" + (" differently" if i == changed else ""))
        for i in range(n)
    ])


@pytest.fixture()
def cache_root(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("NEXUS_MLX_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "embeddings"


def _build(registry: ToolRegistry, embedder: CountingEmbedder, **kwargs):
    return build_router(registry, None, None, embedder=embedder, reranker=NoReranker(), **kwargs)


def test_second_build_reads_the_cache_with_identical_vectors(cache_root: Path):
    assert default_folder() == cache_root
    embedder = CountingEmbedder()
    first = _build(_registry(), embedder)
    assert embedder.document_texts == 12 and first.embeddings_cached is False
    assert len(list(cache_root.glob("*.npz"))) == 1
    second = _build(_registry(), embedder)
    assert embedder.document_texts == 12 and embedder.calls == 1  # no call on the second build
    assert second.embeddings_cached is True
    assert np.array_equal(first.slb.vectors, second.slb.vectors)
    assert np.array_equal(first.slb.codes, second.slb.codes)
    assert second.slb.tools_digest == first.slb.tools_digest
    assert [p.suffix for p in cache_root.iterdir()] == [".npz"]  # no temporary file left


def test_a_changed_tool_text_misses(cache_root: Path):
    embedder = CountingEmbedder()
    _build(_registry(), embedder)
    changed = _build(_registry(changed=3), embedder)
    assert changed.embeddings_cached is False and embedder.document_texts == 24
    assert len(list(cache_root.glob("*.npz"))) == 2
    fresh = CountingEmbedder().embed(_registry(changed=3).texts_for_embedding())
    assert np.array_equal(changed.slb.vectors, fresh)


def test_key_covers_embedder_prefix_order_and_every_text():
    texts = ["a: b", "c: d"]
    key = embedding_key("e", texts)
    assert key == embedding_key("e", list(texts))
    assert len({key, embedding_key("f", texts), embedding_key("e", texts[::-1]),
                embedding_key("e", ["a: b", "c: d "]), embedding_key("e", ["a: bc: d"]),
                embedding_key("e", texts, salt="query: ")}) == 6


def test_document_prefix_is_part_of_the_key(tmp_path: Path):
    plain, prefixed = CountingEmbedder(), CountingEmbedder()
    prefixed.document_prefix = "passage: "
    cache = EmbeddingCache(tmp_path)
    CachedDocumentEmbedder(plain, "e", cache).embed(["x", "y"])
    wrapped = CachedDocumentEmbedder(prefixed, "e", cache)
    wrapped.embed(["x", "y"])
    assert wrapped.hit is False and prefixed.document_texts == 2


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty", "wrong-count", "nan"])
def test_a_corrupt_file_is_ignored_and_rebuilt(damage: str, cache_root: Path):
    embedder = CountingEmbedder()
    good = _build(_registry(), embedder).slb.vectors.copy()
    (path,) = cache_root.glob("*.npz")
    key = path.stem
    if damage == "garbage":
        path.write_bytes(b"not a zip file at all")
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:100])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "wrong-count":
        EmbeddingCache(cache_root).write(key, good[:5])
    else:
        bad = good.copy()
        bad[2, 3] = np.nan
        EmbeddingCache(cache_root).write(key, bad)
    assert EmbeddingCache(cache_root).read(key, 12) is None
    rebuilt = _build(_registry(), embedder)
    assert rebuilt.embeddings_cached is False and embedder.document_texts == 24
    assert np.array_equal(rebuilt.slb.vectors, good)
    assert np.array_equal(EmbeddingCache(cache_root).read(key, 12), good)  # rewritten whole


def test_an_unwritable_cache_is_skipped(tmp_path: Path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    cache = EmbeddingCache(blocker / "embeddings")
    assert cache.write("k" * 64, np.ones((2, 3), np.float32)) is False
    embedder = CountingEmbedder()
    router = _build(_registry(), embedder, embedding_cache=cache)
    assert router.embeddings_cached is False and len(router.slb) == 12


def test_cache_off_and_queries_pass_through(cache_root: Path):
    embedder = CountingEmbedder()
    router = _build(_registry(), embedder, embedding_cache=False)
    assert router.embeddings_cached is None and not cache_root.exists()
    wrapped = CachedDocumentEmbedder(embedder, "e", EmbeddingCache(cache_root))
    assert np.array_equal(wrapped.embed(["hi"], kind="query"), embedder.embed(["hi"], kind="query"))
    assert wrapped.hit is None and not cache_root.exists()


def test_progress_reports_a_miss_only_in_chunks(tmp_path: Path):
    made: list[int] = []
    steps: list[int] = []

    class Bar:
        def update(self, n: int) -> None:
            steps.append(n)

        def close(self) -> None:
            steps.append(-1)

    def factory(total: int) -> Bar:
        made.append(total)
        return Bar()

    embedder = CountingEmbedder()
    texts = [f"text {i} " + "x" * (i % 7) for i in range(600)]
    wrapped = CachedDocumentEmbedder(embedder, "e", EmbeddingCache(tmp_path), progress=factory)
    vectors = wrapped.embed(texts)
    assert made == [600] and steps == [256, 256, 88, -1]
    assert np.array_equal(vectors, embedder.embed(texts))  # rows back in input order
    wrapped.embed(texts)
    assert made == [600] and wrapped.hit is True


def test_real_embedder_round_trip(tmp_path: Path):
    from nexus_mlx.routing.embedder import Embedder

    embedder = Embedder.load(query_prefix="query: ")
    texts = _registry(6).texts_for_embedding()
    cache = EmbeddingCache(tmp_path)
    first = CachedDocumentEmbedder(embedder, "all-MiniLM-L6-v2", cache).embed(texts)
    again = CachedDocumentEmbedder(embedder, "all-MiniLM-L6-v2", cache)
    assert np.array_equal(again.embed(texts), first) and again.hit is True
    np.testing.assert_allclose(first, embedder.embed(texts, kind="document"), atol=1e-5)


def test_two_encoders_under_one_id_never_share_entries(tmp_path: Path):
    cache = EmbeddingCache(tmp_path)
    first, second = CountingEmbedder("weights-a"), CountingEmbedder("weights-b")
    texts = _registry(4).texts_for_embedding()
    a = CachedDocumentEmbedder(first, "same-name", cache).embed(texts)
    wrapped = CachedDocumentEmbedder(second, "same-name", cache)
    b = wrapped.embed(texts)
    assert wrapped.hit is False and second.document_texts == 4  # embedded, not read back
    assert not np.array_equal(a, b) and np.array_equal(b, second.embed(texts))
    assert len(list(tmp_path.glob("*.npz"))) == 2
    again = CachedDocumentEmbedder(CountingEmbedder("weights-a"), "same-name", cache)
    assert np.array_equal(again.embed(texts), a) and again.hit is True


def test_an_embedder_without_a_fingerprint_is_never_cached(tmp_path: Path):
    anonymous = CountingEmbedder(None)
    wrapped = CachedDocumentEmbedder(anonymous, "e", EmbeddingCache(tmp_path))
    texts = ["x", "y", "z"]
    assert np.array_equal(wrapped.embed(texts), anonymous.embed(texts))
    wrapped.embed(texts)
    assert wrapped.hit is None and anonymous.document_texts == 9  # embedded every time
    assert not tmp_path.exists() or not list(tmp_path.iterdir())


def test_real_encoders_with_other_weights_miss(tmp_path: Path):
    from nexus_mlx.routing.embedder import Embedder

    embedder = Embedder.load()
    assert embedder.fingerprint == Embedder.load().fingerprint  # same files, same identity
    nudged_weights = dataclasses.replace(embedder.weights, word=embedder.weights.word * 1.01)
    nudged = Embedder(embedder.config, nudged_weights, embedder.tokenizer,
                      max_length=embedder.max_length)
    shorter = Embedder.load(max_length=64)
    assert len({embedder.fingerprint, nudged.fingerprint, shorter.fingerprint}) == 3
    texts = _registry(3).texts_for_embedding()
    cache = EmbeddingCache(tmp_path)
    CachedDocumentEmbedder(embedder, "all-MiniLM-L6-v2", cache).embed(texts)
    wrapped = CachedDocumentEmbedder(nudged, "all-MiniLM-L6-v2", cache)
    vectors = wrapped.embed(texts)
    assert wrapped.hit is False
    np.testing.assert_allclose(vectors, nudged.embed(texts), atol=1e-5)
