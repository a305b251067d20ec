"""Rerankers: the second opinion the margin gate escalates to.

Contract: a :class:`Reranker` has ``rerank(query, tools, retrieval_scores=None) -> [(name,
score), ...]`` over the gate's top-k candidates, best first, one entry per tool;
``retrieval_scores`` are the SLB's cosines of the same candidates (a reranker may use or ignore
them). No cross-encoder ships offline, so both implementations here read with the LLM:

- :class:`QueryLikelihoodReranker` (the default): for each candidate, the request's mean token
  log-probability after a prompt describing that tool (``"name words: description"``), plus
  ``retrieval_weight`` times its retrieval score. Every candidate continues with the same
  request tokens, so the likelihoods are comparable; each tool's prompt is prefilled once and its
  cache kept (LRU), so a request costs one short forward pass per candidate.
- :class:`LLMReranker`: the LLM reads the candidates' compact signatures and the request once
  (one prefill); each name is scored as the continuation of ``"Tool: "`` by its mean token
  log-probability (a forked cache per candidate).
- :class:`ToolChoiceReranker`: the question asked the way the model was trained to answer it.
  The candidates are the tools of the model's own chat template (name and description), the
  request is the user turn, and the assistant turn is opened as a call (``<tool_call>`` then
  ``{"name": "``); each candidate scores the summed log-probability of its whole name and the
  text that ends it (``", "arguments":``), the probability of that call among all the model
  could write, plus ``retrieval_weight`` times its retrieval score. One prefill per request, one
  short forward per candidate. A template that shows no tools gets them in the system message
  (``decode.tool_call.opened_call_prompt``, the format the session asks such models for).

It evaluates arrays; it does not route or call tools.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from nexus_mlx.decode.call_format import renders_tools
from nexus_mlx.decode.tool_call import NAME_GLUE, opened_call_prompt
from nexus_mlx.errors import ArgumentError
from nexus_mlx.kv.cache import NexusCache
from nexus_mlx.models.forward import forward, make_cache
from nexus_mlx.models.tokenizer import chat_ids
from nexus_mlx.tools.ir import tool_signature
from nexus_mlx.tools.registry import split_identifier
from nexus_mlx.tools.tool import Tool

INSTRUCTION = (
    "Pick the one tool that best serves the request. Tools:\n{tools}\n\nRequest: {query}\n"
    "Answer with the tool name only."
)
ANSWER_PREFIX = "Tool: "
QL_PROMPT = "Tool: {tool}\nWrite a request that a user might send to this tool."
QL_ANSWER = "Request:"
DEFAULT_RETRIEVAL_WEIGHT = 0.5
"""Weight of the cosine next to the mean log-likelihood, chosen on 240 held-out Seal-Tools
``dev-difficult`` queries over 4,076 tools (``bench/rerank_fusion.py``: escalated accuracy
0.842 vs 0.810 for the likelihood alone and 0.614 for the SLB top-1; weights 0.5-1.5 tie), never
on the routing test queries."""

CHOICE_RETRIEVAL_WEIGHT = 1.0
"""The tool-choice reranker's weight on the retrieval score, chosen on 100 Seal-Tools dev
single-call queries (rows 60-159, 4,076 tools) only (``bench/rerank_choice.py``,
Qwen2.5-Coder-0.5B: 0.90 there, weights 1-20 tie); held out, routing goes 0.718 -> 0.808 on the
78 GitHub MCP queries against query likelihood and 0.90 -> 0.90 on Seal-Tools rows 0-59
(``results/rerank_choice.json``)."""


class Reranker(Protocol):
    def rerank(
        self, query: str, tools: Sequence[Tool], retrieval_scores: Sequence[float] | None = None
    ) -> list[tuple[str, float]]: ...


def chat_prompt(tokenizer: Any, user: str, answer_prefix: str) -> list[int]:
    """Chat-template ids of one user message, the assistant turn opened with ``answer_prefix``."""
    return chat_ids(tokenizer, user) + list(tokenizer.encode(answer_prefix,
                                                             add_special_tokens=False))


def continuation_logprobs(
    model: nn.Module, cache: NexusCache, last_logits: mx.array, ids: Sequence[int]
) -> np.ndarray:
    """Log-probabilities of ``ids`` continuing a prefilled prompt whose last logits are
    ``last_logits`` (1, V); ``cache`` is advanced by ``len(ids)`` rows."""
    logits = forward(model, list(ids), cache)  # (1, T, V)
    stacked = mx.concatenate([last_logits, logits[0, :-1]], axis=0)  # (T, V): predicts each id
    logprobs = stacked - mx.logsumexp(stacked, axis=-1, keepdims=True)
    return np.asarray(logprobs[mx.arange(len(ids)), mx.array(list(ids))])  # (T,)


def prefilled(model: nn.Module, ids: Sequence[int]) -> tuple[NexusCache, mx.array]:
    """A fresh cache holding ``ids`` and the logits after them (1, V), both evaluated."""
    cache = make_cache(model)
    last = forward(model, list(ids), cache, logits="last")[0]  # (1, V)
    mx.eval(last)
    cache.evaluate()
    return cache, last


def tool_prose(tool: Tool) -> str:
    """What the query-likelihood reranker reads about a tool: ``"name words: description"``."""
    description = " ".join(tool.description.split())
    name = split_identifier(tool.name)
    return f"{name}: {description}" if description else name


def _check_retrieval(tools: Sequence[Tool], scores: Sequence[float] | None) -> list[float]:
    if scores is None:
        return [0.0] * len(tools)
    if len(scores) != len(tools):
        raise ArgumentError(f"{len(scores)} retrieval scores for {len(tools)} candidates")
    return [float(s) for s in scores]


class QueryLikelihoodReranker:
    """Ranks candidates by how likely the LLM finds the request after reading each tool.

    ``score(t) = mean log p(request | QL_PROMPT with tool_prose(t), "Request:")
    + retrieval_weight * retrieval_score(t)``. Tool prompts are prefilled once and kept
    (``max_prompts``, least recently used evicted; keyed by the prompt text, so a tool whose
    name or description changed is prefilled afresh): a warm candidate costs one forward pass
    over the request's tokens. That cache is mutable state: share one reranker between threads
    only under a lock (:class:`~nexus_mlx.agent.orchestrator.Agent` holds one per turn).
    """

    def __init__(self, model: nn.Module, tokenizer: Any, *,
                 retrieval_weight: float = DEFAULT_RETRIEVAL_WEIGHT, max_prompts: int = 96) -> None:
        if not np.isfinite(retrieval_weight) or retrieval_weight < 0:
            raise ArgumentError(f"retrieval_weight must be finite and >= 0, got {retrieval_weight}")
        if max_prompts < 1:
            raise ArgumentError(f"max_prompts must be >= 1, got {max_prompts}")
        self.model, self.tokenizer = model, tokenizer
        self.retrieval_weight, self.max_prompts = retrieval_weight, max_prompts
        self._prompts: OrderedDict[str, tuple[NexusCache, mx.array]] = OrderedDict()

    def _prompt(self, tool: Tool) -> tuple[NexusCache, mx.array]:
        key = QL_PROMPT.format(tool=tool_prose(tool))  # the text read: a changed tool misses
        if key in self._prompts:
            self._prompts.move_to_end(key)
            return self._prompts[key]
        cache, last = prefilled(self.model, chat_prompt(self.tokenizer, key, QL_ANSWER))
        self._prompts[key] = (cache, last)
        if len(self._prompts) > self.max_prompts:
            self._prompts.popitem(last=False)
        return cache, last

    def likelihood(self, query: str, tool: Tool) -> float:
        """Mean log-probability of the request's tokens after ``tool``'s prompt."""
        ids = self.tokenizer.encode(" " + query, add_special_tokens=False)
        if not ids:
            return 0.0
        cache, last = self._prompt(tool)
        return float(continuation_logprobs(self.model, cache.copy(), last, ids).mean())

    def rerank(
        self, query: str, tools: Sequence[Tool], retrieval_scores: Sequence[float] | None = None
    ) -> list[tuple[str, float]]:
        prior = _check_retrieval(tools, retrieval_scores)
        scored = [(t.qualified_name, self.likelihood(query, t) + self.retrieval_weight * p)
                  for t, p in zip(tools, prior, strict=True)]
        return sorted(scored, key=lambda pair: -pair[1])  # stable: retrieval order breaks ties


class LLMReranker:
    """Scores candidates by the LLM's likelihood of naming them (retrieval scores unused)."""

    def __init__(self, model: nn.Module, tokenizer: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer

    def prompt_tokens(self, query: str, tools: Sequence[Tool]) -> list[int]:
        listing = "\n".join(f"- {tool_signature(t)}" for t in tools)
        return chat_prompt(self.tokenizer, INSTRUCTION.format(tools=listing, query=query),
                           ANSWER_PREFIX)

    def _name_logprob(self, cache: NexusCache, last_logits: mx.array, name: str) -> float:
        ids = list(self.tokenizer.encode(name, add_special_tokens=False))
        return float(continuation_logprobs(self.model, cache, last_logits, ids).mean())

    def rerank(
        self, query: str, tools: Sequence[Tool], retrieval_scores: Sequence[float] | None = None
    ) -> list[tuple[str, float]]:
        _check_retrieval(tools, retrieval_scores)
        if not tools:
            return []
        cache, last = prefilled(self.model, self.prompt_tokens(query, tools))
        scored = [
            (t.qualified_name, self._name_logprob(cache.copy(), last, t.qualified_name))
            for t in tools
        ]
        return sorted(scored, key=lambda pair: -pair[1])


class ToolChoiceReranker:
    """Ranks candidates by the LLM's probability of calling each one (module docstring).

    ``score(t) = log p(name(t) + NAME_GLUE | the candidates as the template's tools, the
    request, the opened call) + retrieval_weight * retrieval_score(t)``. Stateless between
    requests (one forked cache per candidate, dropped after), so safe to share under the
    caller's MLX thread. The candidates are listed in the order given (retrieval order)."""

    def __init__(self, model: nn.Module, tokenizer: Any, *,
                 retrieval_weight: float = CHOICE_RETRIEVAL_WEIGHT) -> None:
        if not np.isfinite(retrieval_weight) or retrieval_weight < 0:
            raise ArgumentError(f"retrieval_weight must be finite and >= 0, got {retrieval_weight}")
        self.model, self.tokenizer = model, tokenizer
        self.retrieval_weight = retrieval_weight
        self.native = renders_tools(tokenizer)

    def prompt_tokens(self, query: str, tools: Sequence[Tool]) -> list[int]:
        """The request with ``tools`` offered, the assistant's call opened up to the name."""
        functions = [{"type": "function", "function": {
            "name": t.qualified_name, "description": " ".join(t.description.split()),
            "parameters": {}}} for t in tools]
        return opened_call_prompt(self.tokenizer, [{"role": "user", "content": query}],
                                  functions, native=self.native)

    def rerank(
        self, query: str, tools: Sequence[Tool], retrieval_scores: Sequence[float] | None = None
    ) -> list[tuple[str, float]]:
        prior = _check_retrieval(tools, retrieval_scores)
        if not tools:
            return []
        cache, last = prefilled(self.model, self.prompt_tokens(query, tools))
        scored = []
        for tool, p in zip(tools, prior, strict=True):
            ids = list(self.tokenizer.encode(tool.qualified_name + NAME_GLUE,
                                             add_special_tokens=False))
            logprob = float(continuation_logprobs(self.model, cache.copy(), last, ids).sum())
            scored.append((tool.qualified_name, logprob + self.retrieval_weight * p))
        return sorted(scored, key=lambda pair: -pair[1])  # stable: retrieval order breaks ties


def default_reranker(model: nn.Module, tokenizer: Any) -> Reranker:
    """The reranker :func:`~nexus_mlx.routing.router.build_router` uses: a model whose chat
    template shows tools (it was trained to call them) is asked for the call
    (:class:`ToolChoiceReranker`); any other is read by query likelihood
    (:class:`QueryLikelihoodReranker`). Measured in ``results/rerank_choice.json``."""
    if renders_tools(tokenizer):
        return ToolChoiceReranker(model, tokenizer)
    return QueryLikelihoodReranker(model, tokenizer)
