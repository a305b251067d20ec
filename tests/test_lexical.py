"""Lexical retrieval: match terms, the stemmer, BM25 against the Okapi formula computed by hand,
its normalization, and the fusion with the dense score."""

from __future__ import annotations

import math

import numpy as np
import pytest

from nexus_mlx.errors import ArgumentError
from nexus_mlx.routing.lexical import BM25Index, fuse, stem, words


@pytest.mark.parametrize(("word", "expected"), [
    ("issues", "issu"), ("issue", "issu"), ("created", "creat"), ("create", "creat"),
    ("starred", "star"), ("stars", "star"), ("branches", "branch"),
    ("repositories", "repository"), ("listing", "list"), ("status", "status"),
    ("analysis", "analysis"), ("string", "string"), ("get", "get"), ("v2", "v2"),
])
def test_stem(word: str, expected: str) -> None:
    assert stem(word) == expected


def test_words_split_identifiers_and_drop_function_words() -> None:
    assert words("listPullRequests: List the pull requests of a repo") == [
        "list", "pull", "request", "list", "pull", "request", "repo"]
    assert words("get_me") == words("Get me") == ["get"]
    assert words("HTTPServer v2.0!") == ["http", "server", "v2", "0"]
    assert words("") == [] and words("the of and") == []


DOCS = ["star repository: star a repository", "unstar repository: remove a star",
        "list issues: list issues in a repository", "create issue: open a new issue"]


def okapi(docs: list[str], query: str, k1: float = 1.2, b: float = 0.75) -> np.ndarray:
    """BM25 straight from its definition (idf = ln(1 + (N - df + 0.5) / (df + 0.5)))."""
    terms = [words(d) for d in docs]
    mean = sum(map(len, terms)) / len(terms)
    out = np.zeros(len(docs))
    for term in set(words(query)):
        df = sum(term in t for t in terms)
        if not df:
            continue
        idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
        for i, t in enumerate(terms):
            tf = t.count(term)
            out[i] += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(t) / mean))
    return out


@pytest.mark.parametrize("query", ["remove my star from torvalds/linux", "list issues issues",
                                   "open a new issue", "nothing matches here", ""])
def test_bm25_equals_the_formula(query: str) -> None:
    index = BM25Index(DOCS)
    np.testing.assert_allclose(index.scores(query), okapi(DOCS, query), rtol=1e-5, atol=1e-6)
    again = BM25Index.from_terms([words(d) for d in DOCS])
    np.testing.assert_array_equal(again.scores(query), index.scores(query))
    normalized = index.normalized(query)
    assert normalized.dtype == np.float32 and normalized.shape == (4,)
    assert (normalized >= 0).all() and (normalized < 1).all()
    if index.ceiling(query) > 0:
        np.testing.assert_allclose(normalized, index.scores(query) / index.ceiling(query),
                                   rtol=1e-6)
    else:
        assert not normalized.any()


def test_bm25_prefers_the_named_action() -> None:
    index = BM25Index(DOCS)
    assert int(np.argmax(index.scores("unstar the repository"))) == 1
    assert int(np.argmax(index.scores("list the issues"))) == 2


def test_fuse_and_errors() -> None:
    dense = np.array([0.5, 0.4, 0.1], np.float32)
    lexical = np.array([0.0, 0.5, 1.0], np.float32)
    np.testing.assert_array_equal(fuse(dense, lexical, 0.0), dense)
    np.testing.assert_allclose(fuse(dense, lexical, 0.6), [0.5, 0.7, 0.7], rtol=1e-6)
    with pytest.raises(ArgumentError, match="differ"):
        fuse(dense, lexical[:2], 0.6)
    with pytest.raises(ArgumentError, match="lexical weight"):
        fuse(dense, lexical, -1.0)
    with pytest.raises(ArgumentError, match="k1"):
        BM25Index(DOCS, k1=-1)
    with pytest.raises(ArgumentError, match="sequence"):
        BM25Index("one string")
    assert len(BM25Index([])) == 0 and BM25Index([]).scores("x").shape == (0,)
