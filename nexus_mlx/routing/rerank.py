"""Rerankers: the second opinion the margin gate escalates to.

Contract: a :class:`Reranker` has ``rerank(query, tools) -> [(name, score), ...]`` over the
gate's top-k candidates, best first, one entry per tool. No cross-encoder ships offline, so the
implementation here is :class:`LLMReranker`: the default LLM reads the candidates' compact
signatures and the request once (one prefill), then each candidate's name is scored as the
continuation of ``"Tool: "`` by its mean token log-probability (a forked cache per candidate,
so the prompt is never recomputed). It evaluates arrays; it does not route or call tools.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from nexus_mlx.agent.tools import Tool
from nexus_mlx.models.forward import forward, make_cache
from nexus_mlx.routing.ir import tool_signature

INSTRUCTION = (
    "Pick the one tool that best serves the request. Tools:\n{tools}\n\nRequest: {query}\n"
    "Answer with the tool name only."
)
ANSWER_PREFIX = "Tool: "


class Reranker(Protocol):
    def rerank(self, query: str, tools: Sequence[Tool]) -> list[tuple[str, float]]: ...


class LLMReranker:
    """Scores candidates by the LLM's likelihood of naming them."""

    def __init__(self, model: nn.Module, tokenizer: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer

    def prompt_tokens(self, query: str, tools: Sequence[Tool]) -> list[int]:
        listing = "\n".join(f"- {tool_signature(t)}" for t in tools)
        messages = [{"role": "user", "content": INSTRUCTION.format(tools=listing, query=query)}]
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict):
            ids = ids["input_ids"]
        return list(ids) + list(self.tokenizer.encode(ANSWER_PREFIX, add_special_tokens=False))

    def _name_logprob(self, cache: Any, last_logits: mx.array, name: str) -> float:
        ids = list(self.tokenizer.encode(name, add_special_tokens=False))
        logits = forward(self.model, ids, cache)  # (1, T, V)
        stacked = mx.concatenate([last_logits, logits[0, :-1]], axis=0)  # predicts each name token
        logprobs = stacked - mx.logsumexp(stacked, axis=-1, keepdims=True)
        picked = logprobs[mx.arange(len(ids)), mx.array(ids)]
        return float(np.asarray(picked.mean()))

    def rerank(self, query: str, tools: Sequence[Tool]) -> list[tuple[str, float]]:
        if not tools:
            return []
        cache = make_cache(self.model)
        last = forward(self.model, self.prompt_tokens(query, tools), cache, logits="last")[0]
        mx.eval(last)
        cache.evaluate()
        scored = [
            (t.qualified_name, self._name_logprob(cache.copy(), last, t.qualified_name))
            for t in tools
        ]
        return sorted(scored, key=lambda pair: -pair[1])
