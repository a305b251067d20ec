"""Shared library of the routing benchmarks (``routing_accuracy``, ``calibration``,
``rerank_fusion``, ``sidecar_accuracy``): data paths, queries, tool texts, cached embeddings,
memoised rerankers, the concatenate-all oracle, registry draws and Wilson intervals.

Contract:
- ``load_queries(path, registry)`` reads Seal-Tools ``dev.jsonl`` rows with one gold call (gold
  names through ``sanitize_name``) or ``{"query", "tool", "arguments"}`` lines, keeping those
  whose gold tool is in ``registry``; ``heldout_queries`` returns the several-call Seal-Tools rows
  as unlabeled text; ``quick_pool`` cuts a pool to the queries' gold tools plus seeded others.
- ``TEXTS`` maps a tool-text name (``name_desc``, ``params``, ``words_params``) to the text that
  is embedded for a tool; ``embed_cached`` is ``embedder.embed`` memoised on disk, keyed by
  the embedder's fingerprint (config, tokenizer, weights), ``max_length``, kind and texts.
- ``draw(pool_size, gold, n, seed, query_index)`` is one registry of ``n`` tools (the gold one at
  a random position) and depends only on its arguments, so every method sees the same draws.
- ``StoredLikelihoodReranker`` memoises the library's query-likelihood scores in a JSON file
  across runs, keyed by the model's fingerprint and the exact token ids it reads (another model,
  tokenizer or template never reuses a score); ``MemoReranker`` memoises any reranker within a run; ``ConcatAllOracle`` scores
  names with every tool's full JSON schema in the prompt; ``oracle_tokens`` is its prompt
  length (a lower bound once it cannot fit ``window``); ``context_window(model)`` is the
  model's own limit (``max_position_embeddings``; ``DEFAULT_CONTEXT_WINDOW`` if it has none).
- ``wilson(k, n)`` is the Wilson score 95% interval of ``k / n``.

It is not a benchmark (``nexus-mlx bench`` and ``make bench-quick`` skip it): it times nothing,
writes no result and draws no figure; which queries, sizes and rerankers are scored is each
script's choice.
"""

from __future__ import annotations

import os

from common import ROOT, shared_data  # noqa: I001  (loads nexus_mlx before mlx)

import hashlib
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from nexus_mlx.tools.registry import ToolRegistry, text_for_embedding
from nexus_mlx.tools.tool import Tool, sanitize_name
from nexus_mlx.models.arch import model_plan
from nexus_mlx.models.fingerprint import model_fingerprint
from nexus_mlx.models.forward import forward, make_cache
from nexus_mlx.routing.embedder import Embedder
from nexus_mlx.decode.tool_call import CALL_PREFIX
from nexus_mlx.routing.rerank import DEFAULT_RETRIEVAL_WEIGHT, INSTRUCTION, QL_ANSWER, QL_PROMPT, LLMReranker, QueryLikelihoodReranker, chat_prompt, tool_prose

DATA = shared_data()
SEAL_TOOLS = DATA / "seal-tools" / "tool.jsonl"
SEAL_DEV = DATA / "seal-tools" / "dev.jsonl"
GITHUB_TOOLS = DATA / "github-mcp" / "tools.json"
GITHUB_QUERIES = ROOT / "bench" / "github_queries.jsonl"
EMBEDDER_ID = "all-MiniLM-L6-v2"
DEFAULT_CONTEXT_WINDOW = 8192  # for a model whose config names no max_position_embeddings
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "nexus-mlx-bench"
PREFILL_CHUNK = 512  # long oracle prompts are prefilled in chunks (bounded attention memory)


def log(message: str) -> None:
    """Progress on stderr (stdout's last line is the result)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Tool texts and queries


TEXTS: dict[str, Callable[[Tool], str]] = {
    "name_desc": lambda t: text_for_embedding(t, parameters=False, split_names=False),
    "params": lambda t: text_for_embedding(t, parameters=True, split_names=False),
    "words_params": lambda t: text_for_embedding(t, parameters=True),  # the library default
}


@dataclass(frozen=True)
class Query:
    """One request with its gold tool (a registry name) and the arguments it specifies."""

    text: str
    tool: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str = ""


def load_queries(path: Path, registry: ToolRegistry) -> tuple[list[Query], int]:
    """Single-call queries whose gold tool is in ``registry`` (file order), and how many were
    skipped (multi-call rows, or a gold name the registry lacks)."""
    queries, skipped = [], 0
    for number, line in enumerate(path.read_text("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        if "calling" in row:  # Seal-Tools dev row
            calls = row["calling"]
            if len(calls) != 1:
                skipped += 1
                continue
            query = Query(row["query"], sanitize_name(calls[0]["api"]),
                          dict(calls[0].get("parameters") or {}), str(row.get("id", number)))
        else:
            query = Query(row["query"], row["tool"], dict(row.get("arguments") or {}),
                          str(row.get("id", f"{path.stem}-{number}")))
        if query.tool not in registry:
            skipped += 1
            continue
        queries.append(query)
    return queries, skipped


def heldout_queries(path: Path) -> list[str]:
    """Seal-Tools dev rows with several calls (``dev-difficult``): unlabeled calibration text."""
    out = []
    for line in path.read_text("utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            if len(row.get("calling", [])) > 1:
                out.append(row["query"])
    return out


def quick_pool(tools: list[Tool], queries: list[Query], size: int, seed: int) -> list[Tool]:
    """The queries' gold tools plus seeded random others, ``size`` in all, in pool order."""
    gold = {q.tool for q in queries}
    rest = [i for i, t in enumerate(tools) if t.qualified_name not in gold]
    rng = np.random.default_rng([seed, 7])
    keep = set(rng.choice(rest, size=max(size - len(gold), 0), replace=False).tolist())
    return [t for i, t in enumerate(tools) if i in keep or t.qualified_name in gold]


# ---------------------------------------------------------------------------------------------
# Embeddings (cached on disk: the pool is embedded once per text)


def embed_cached(
    embedder: Embedder, texts: Sequence[str], kind: str, cache_dir: Path | None
) -> np.ndarray:
    """``embedder.embed(texts, kind=kind)``, read from ``cache_dir`` when computed before."""
    key = hashlib.sha256(json.dumps(
        [EMBEDDER_ID, embedder.fingerprint, embedder.max_length, kind, list(texts)]
    ).encode("utf-8")).hexdigest()[:32]
    path = None if cache_dir is None else cache_dir / f"emb-{key}.npy"
    if path is not None and path.is_file():
        vectors = np.load(path)
        if vectors.shape == (len(texts), embedder.dim):
            return vectors
    vectors = np.asarray(embedder.embed(list(texts), kind=kind), dtype=np.float32)  # (N, D)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, vectors)
    return vectors


class PrecomputedEmbedder:
    """What ``Router`` calls: returns query vectors computed (with the prefix) beforehand."""

    def __init__(self, vectors: dict[str, np.ndarray]) -> None:
        self.vectors = vectors

    def embed(self, texts: Sequence[str], *, kind: str = "query") -> np.ndarray:
        return np.stack([self.vectors[t] for t in texts])  # (B, D)


# ---------------------------------------------------------------------------------------------
# Rerankers and the oracle

class StoredLikelihoodReranker(QueryLikelihoodReranker):
    """The library's :class:`QueryLikelihoodReranker` whose (request, tool text) likelihoods are
    memoised, and with ``store`` kept in a JSON file across runs: draws at several N and reruns
    share the LLM work. A key hashes the model's fingerprint (architecture, shapes, weights
    digest) with the token ids of the tool prompt and of the request, i.e. exactly what decides
    the score: a second model (or tokenizer, or prompt template) gets its own entries."""

    def __init__(self, model: Any, tokenizer: Any, *, store: Path | None = None,
                 retrieval_weight: float = DEFAULT_RETRIEVAL_WEIGHT) -> None:
        super().__init__(model, tokenizer, retrieval_weight=retrieval_weight)
        self.store = store
        self._scores: dict[str, float] = {}
        if store is not None and store.is_file():
            self._scores = json.loads(store.read_text())
        self._unsaved = 0
        self.scored = 0
        self.model_key = json.dumps(model_fingerprint(model).as_dict(), sort_keys=True)

    def flush(self) -> None:
        """Write the memo to ``store`` (atomically) if it changed."""
        if self.store is not None and self._unsaved:
            self.store.parent.mkdir(parents=True, exist_ok=True)
            if self.store.is_file():  # another run may have added scores meanwhile
                self._scores = {**json.loads(self.store.read_text()), **self._scores}
            tmp = self.store.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self._scores))
            os.replace(tmp, self.store)
            self._unsaved = 0

    def score_key(self, query: str, tool: Tool) -> str:
        """The store key of one (request, tool) score: model fingerprint and token ids."""
        prompt = chat_prompt(self.tokenizer, QL_PROMPT.format(tool=tool_prose(tool)), QL_ANSWER)
        request = list(self.tokenizer.encode(" " + query, add_special_tokens=False))
        return hashlib.sha256(json.dumps([self.model_key, prompt, request]).encode()).hexdigest()[:32]

    def likelihood(self, query: str, tool: Tool) -> float:
        key = self.score_key(query, tool)
        if key not in self._scores:
            self._scores[key] = super().likelihood(query, tool)
            self.scored += 1
            self._unsaved += 1
            if self._unsaved >= 50:
                self.flush()
        return self._scores[key]


class MemoReranker:
    """Any reranker, memoised on (request, candidate names): draws at several N share work."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._memo: dict[tuple[str, tuple[str, ...]], list[tuple[str, float]]] = {}
        self.calls = 0

    def rerank(self, query: str, tools: Sequence[Tool],
               retrieval_scores: Sequence[float] | None = None) -> list[tuple[str, float]]:
        self.calls += 1
        key = (query, tuple(t.qualified_name for t in tools),
               None if retrieval_scores is None else tuple(round(s, 6) for s in retrieval_scores))
        if key not in self._memo:
            self._memo[key] = self.inner.rerank(query, tools, retrieval_scores)
        return self._memo[key]


def schema_line(tool: Tool) -> str:
    """A tool's full definition as one JSON line (what concatenate-all puts in the prompt)."""
    return json.dumps({"name": tool.qualified_name, "description": tool.description,
                       "parameters": tool.input_schema}, ensure_ascii=False)


class ConcatAllOracle(LLMReranker):
    """``LLMReranker`` with every tool's full JSON schema in the prompt instead of signatures.

    Names are scored as the continuation of ``{"name": "`` (``CALL_PREFIX``), the format of the
    JSON listing: after ``"Tool: "`` this model starts another JSON line instead of a name
    (greedy: ``'\\n- {"name": "getHealthWorkforce"'``), and scoring names there picked the gold
    tool for 0 of 10 queries at N = 10.
    """

    def prompt_tokens(self, query: str, tools: Sequence[Tool]) -> list[int]:
        listing = "\n".join(f"- {schema_line(t)}" for t in tools)
        return chat_prompt(self.tokenizer, INSTRUCTION.format(tools=listing, query=query),
                           CALL_PREFIX)

    def rerank(self, query: str, tools: Sequence[Tool],
               retrieval_scores: Sequence[float] | None = None) -> list[tuple[str, float]]:
        ids = self.prompt_tokens(query, tools)
        cache = make_cache(self.model)
        for start in range(0, len(ids), PREFILL_CHUNK):
            last = forward(self.model, ids[start:start + PREFILL_CHUNK], cache, logits="last")[0]
            mx.eval(last)
        cache.evaluate()
        scored = [(t.qualified_name, self._name_logprob(cache.copy(), last, t.qualified_name))
                  for t in tools]
        return sorted(scored, key=lambda pair: -pair[1])


def context_window(model: Any) -> int:
    """The longest prompt ``model`` was trained for (its ``max_position_embeddings``)."""
    return model_plan(model).max_position or DEFAULT_CONTEXT_WINDOW


def oracle_tokens(tokenizer: Any, tools: Sequence[Tool], query: str,
                  line_tokens: dict[str, int], window: int) -> int:
    """Prompt length of the oracle plus its longest name; exact when the listing could fit
    ``window`` tokens, else a lower bound from per-line token counts (enough to say "overflow")."""
    bound = sum(line_tokens[t.qualified_name] for t in tools)
    if bound > window:
        return bound
    listing = "\n".join(f"- {schema_line(t)}" for t in tools)
    ids = chat_prompt(tokenizer, INSTRUCTION.format(tools=listing, query=query), CALL_PREFIX)
    longest = max(len(tokenizer.encode(t.qualified_name, add_special_tokens=False)) for t in tools)
    return len(ids) + longest


# ---------------------------------------------------------------------------------------------
# Statistics and draws


def wilson(k: int, n: int, z: float = 1.959964) -> list[float]:
    """Wilson score 95% interval of a proportion k / n."""
    if n == 0:
        return [0.0, 1.0]
    p = k / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return [max(0.0, centre - half), min(1.0, centre + half)]


def draw(pool_size: int, gold: int, n: int, seed: int, query_index: int) -> np.ndarray:
    """Pool indices of one registry: the gold tool and ``n - 1`` distractors, gold at a random
    position; the whole pool (in order) when ``n >= pool_size``. Depends only on its arguments."""
    if n >= pool_size:
        return np.arange(pool_size)
    rng = np.random.default_rng([seed, n, query_index])
    others = np.delete(np.arange(pool_size), gold)
    picked = rng.choice(others, size=n - 1, replace=False)
    return np.insert(picked, int(rng.integers(0, n)), gold)
