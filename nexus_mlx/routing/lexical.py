"""Lexical tool retrieval: BM25 over the tools' texts, and its fusion with the dense SLB score.

Contract:
- :func:`words` turns any text into match terms: identifiers split into words
  (``list_pull_requests`` and ``listPullRequests`` both give ``list pull request``), lower case,
  letters and digits only, English function words dropped, a light suffix stemmer
  (:func:`stem`: ``issues``/``issue``, ``starred``/``star``, ``listing``/``list``) applied. It is
  deterministic and knows no registry or dataset.
- ``BM25Index(documents, k1=, b=)`` indexes one text per tool (row ``i`` is document ``i``).
  ``scores(query)`` returns the Okapi BM25 score of every document, ``(N,)`` float32, in row
  order (0 where no term matches; a query term repeated counts once); ``normalized(query)``
  divides them by the best score a document could reach on that query's terms (the sum of
  their idf times ``k1 + 1``), so they lie in ``[0, 1]`` whatever the query's length.
- :func:`fuse` is the hybrid score the router ranks by: ``dense + weight * normalized lexical``.
  ``weight = 0`` is the dense score unchanged.

Why (measured by ``bench/routing_levers.py``, fusion weight chosen on the hand-written GitHub MCP
requests, held out on Seal-Tools): dense MiniLM alone confuses tools that share a domain but not
an action (``list_releases`` under ``get_release_by_tag`` for "List every release that
nodejs/node has published", ``actions_list`` under ``actions_get``); the exact words of the
tool's name and description separate them, and the fixed normalization keeps the fused score on the cosine's scale, so a margin gate
can be calibrated on it like on the cosine.

It does not embed, scan the SLB, or know what a tool is: the router indexes the same text the
SLB embeds (:func:`~nexus_mlx.tools.registry.text_for_embedding`: name words, description,
parameter names).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

import numpy as np

from nexus_mlx.errors import ArgumentError

DEFAULT_K1 = 1.2
DEFAULT_B = 0.75

STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each either few for
    from further had has have having he her here hers herself him himself his how i if in into
    is it its itself just me more most my myself no nor not of off on once only or other our
    ours ourselves out over own please same she should so some such than that the their theirs
    them themselves then there these they this those through to too under until up very was we
    were what when where which while who whom why will with would you your yours yourself
    yourselves""".split()
)
"""English function words (no content word: ``list``, ``get``, ``new`` and ``all`` of the
domain stay, except the quantifier ``all``)."""

_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
_ACRONYM = re.compile(r"([A-Z]+)([A-Z][a-z])")
_TOKEN = re.compile(r"[a-z0-9]+")
_VOWELS = set("aeiouy")


def stem(word: str) -> str:
    """A light English suffix stemmer, the same on query and tool words: plural ``-s`` / ``-es``
    / ``-ies``, ``-ing`` and ``-ed`` (a doubled final consonant undone), then a final ``-e``.

    ``issues``, ``issue`` -> ``issu``; ``created``, ``create`` -> ``creat``; ``starred``,
    ``stars`` -> ``star``; ``branches`` -> ``branch``; ``repositories`` -> ``repository``;
    ``listing`` -> ``list``. Words of three letters or fewer and non-alphabetic tokens are kept;
    a suffix is stripped only when a root of three letters with a vowel remains.
    """
    if len(word) <= 3 or not word.isalpha():
        return word
    if word.endswith("ies") and len(word) > 4:
        word = word[:-3] + "y"
    elif word.endswith(("sses", "shes", "ches", "xes", "zes")):
        word = word[:-2]
    elif word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    else:
        for suffix in ("ing", "ed"):
            root = word[: -len(suffix)]
            if word.endswith(suffix) and len(root) >= 3 and _VOWELS & set(root):
                double = root[-1] == root[-2] and root[-1] not in _VOWELS | set("lsz")
                word = root[:-1] if double else root
                break
    if word.endswith("e") and len(word) > 4:
        word = word[:-1]
    return word


def words(text: str) -> list[str]:
    """The match terms of ``text`` (see the module docstring), in order, repeats kept."""
    spaced = _ACRONYM.sub(r"\1 \2", _CAMEL.sub(r"\1 \2", text))
    return [stem(w) for w in _TOKEN.findall(spaced.lower()) if w not in STOPWORDS]


class BM25Index:
    """Okapi BM25 over a fixed list of documents (one per tool), as term postings in numpy."""

    def __init__(self, documents: Sequence[str], *, k1: float = DEFAULT_K1,
                 b: float = DEFAULT_B) -> None:
        if isinstance(documents, str):
            raise ArgumentError("BM25Index takes a sequence of documents, not one string")
        if not (math.isfinite(k1) and k1 >= 0) or not (math.isfinite(b) and 0 <= b <= 1):
            raise ArgumentError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        self._build([Counter(words(doc)) for doc in documents], float(k1), float(b))

    @classmethod
    def from_terms(cls, documents: Sequence[Sequence[str]], *, k1: float = DEFAULT_K1,
                   b: float = DEFAULT_B) -> BM25Index:
        """An index of documents already turned into terms (by :func:`words`)."""
        index = cls([], k1=k1, b=b)
        index._build([Counter(terms) for terms in documents], float(k1), float(b))
        return index

    def _build(self, counts: list[Counter[str]], k1: float, b: float) -> None:
        self.k1, self.b = k1, b
        self.size = len(counts)
        lengths = np.asarray([sum(c.values()) for c in counts], dtype=np.float64)  # (N,)
        mean = float(lengths.mean()) if self.size and lengths.mean() > 0 else 1.0
        norm = k1 * (1.0 - b + b * lengths / mean)  # (N,)
        postings: dict[str, tuple[list[int], list[int]]] = {}
        for row, counter in enumerate(counts):
            for term, count in counter.items():
                docs, tfs = postings.setdefault(term, ([], []))
                docs.append(row)
                tfs.append(count)
        self.idf: dict[str, float] = {}
        self._postings: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for term, (docs, tfs) in postings.items():
            df = len(docs)
            idf = math.log(1.0 + (self.size - df + 0.5) / (df + 0.5))
            rows = np.asarray(docs, dtype=np.int64)
            freq = np.asarray(tfs, dtype=np.float64)  # (df,)
            weight = idf * freq * (k1 + 1.0) / (freq + norm[rows])  # (df,)
            self.idf[term] = idf
            self._postings[term] = (rows, weight.astype(np.float32))

    def __len__(self) -> int:
        return self.size

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every document for ``query``, ``(N,)`` float32."""
        out = np.zeros(self.size, dtype=np.float32)  # (N,)
        for term in dict.fromkeys(words(query)):
            hit = self._postings.get(term)
            if hit is not None:
                rows, weight = hit
                out[rows] += weight  # rows are unique within one term's postings
        return out

    def ceiling(self, query: str) -> float:
        """The score a document would reach on every known query term: ``sum idf * (k1+1)``."""
        return sum(self.idf.get(t, 0.0) for t in dict.fromkeys(words(query))) * (self.k1 + 1.0)

    def normalized(self, query: str) -> np.ndarray:
        """:meth:`scores` divided by :meth:`ceiling` (all zeros when no query term is known)."""
        top = self.ceiling(query)
        raw = self.scores(query)
        return raw / np.float32(top) if top > 0 else raw


def fuse(dense: np.ndarray, lexical: np.ndarray, weight: float) -> np.ndarray:
    """``dense + weight * lexical`` (both ``(N,)``), float32: the hybrid retrieval score."""
    d, x = np.asarray(dense, dtype=np.float32), np.asarray(lexical, dtype=np.float32)
    if d.shape != x.shape:
        raise ArgumentError(f"dense scores {d.shape} and lexical scores {x.shape} differ")
    if not math.isfinite(weight) or weight < 0:
        raise ArgumentError(f"the lexical weight must be finite and >= 0, got {weight}")
    return d + np.float32(weight) * x
