"""The tool-choice reranker and the native argument prompt: scores equal a fresh forward pass of
the same prompt, the prompt is the model's own tool prompt where its template shows tools (a
template that renders them, wrapped around the default tokenizer) and the textual one where it
does not (SmolLM2's), and the router's default follows the template."""

from __future__ import annotations

import json
from typing import Any

import mlx.core as mx
import pytest

from nexus_mlx.agent.orchestrator import Agent
from nexus_mlx.decode.call_format import CALL_OPEN
from nexus_mlx.decode.tool_call import (
    CALL_PREFIX,
    NAME_GLUE,
    generate_tool_call,
    native_call_prompt,
    tool_call_prompt,
)
from nexus_mlx.errors import ArgumentError
from nexus_mlx.models.forward import forward, make_cache
from nexus_mlx.routing.rerank import (
    QueryLikelihoodReranker,
    ToolChoiceReranker,
    default_reranker,
)
from nexus_mlx.tools.registry import load_tools

QUERY = "Create a new GitHub repository called demo"
NAMES = ("create_repository", "fork_repository", "list_issues")


class ToolTemplate:
    """The default tokenizer behind a chat template that shows tools (as Qwen's does)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def apply_chat_template(self, messages: list[dict[str, Any]], tools: Any = None,
                            add_generation_prompt: bool = False, tokenize: bool = True) -> Any:
        text = "".join(f"<tools>{json.dumps(t)}</tools>\n" for t in tools or ())
        text += "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        text += "assistant: " if add_generation_prompt else ""
        return self.inner.encode(text, add_special_tokens=False) if tokenize else text


@pytest.fixture(scope="module")
def tools(github_tools_file):
    registry = load_tools(github_tools_file)
    return [registry.get(n) for n in NAMES]


def _fresh_logprob(model: Any, prompt: list[int], ids: list[int]) -> float:
    logits = forward(model, prompt + ids, make_cache(model))[0]  # (T, V)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    rows = mx.arange(len(prompt) - 1, len(prompt) + len(ids) - 1)
    return float(logprobs[rows, mx.array(ids)].sum())


def test_choice_scores_are_the_call_logprob_of_a_fresh_forward(tools, default_model):
    model, tokenizer = default_model
    reranker = ToolChoiceReranker(model, tokenizer)
    assert not reranker.native  # SmolLM2's template shows no tools: the textual prompt
    prompt = reranker.prompt_tokens(QUERY, tools)
    text = tokenizer.decode(prompt)
    assert text.endswith(f"{CALL_OPEN}\n{CALL_PREFIX}")
    assert all(t.qualified_name in text and t.description.split()[0] in text for t in tools)
    scored = reranker.rerank(QUERY, tools)
    assert [s for _, s in scored] == sorted((s for _, s in scored), reverse=True)
    for name, score in scored:
        ids = list(tokenizer.encode(name + NAME_GLUE, add_special_tokens=False))
        assert score == pytest.approx(_fresh_logprob(model, prompt, ids), abs=1e-3)


def test_choice_fuses_the_retrieval_score_and_rejects_bad_input(tools, default_model):
    model, tokenizer = default_model
    plain = dict(ToolChoiceReranker(model, tokenizer, retrieval_weight=0.0)
                 .rerank(QUERY, tools, [0.9, 0.1, 0.5]))
    fused = dict(ToolChoiceReranker(model, tokenizer, retrieval_weight=3.0)
                 .rerank(QUERY, tools, [0.9, 0.1, 0.5]))
    for name, cosine in zip(NAMES, (0.9, 0.1, 0.5), strict=True):
        assert fused[name] == pytest.approx(plain[name] + 3.0 * cosine, abs=1e-6)
    assert ToolChoiceReranker(model, tokenizer).rerank(QUERY, []) == []
    with pytest.raises(ArgumentError, match="2 retrieval scores for 3"):
        ToolChoiceReranker(model, tokenizer).rerank(QUERY, tools, [0.1, 0.2])
    with pytest.raises(ArgumentError, match="retrieval_weight"):
        ToolChoiceReranker(model, tokenizer, retrieval_weight=float("nan"))


def test_a_template_that_shows_tools_gets_them_there(tools, default_model):
    model, tokenizer = default_model
    wrapped = ToolTemplate(tokenizer)
    reranker = ToolChoiceReranker(model, wrapped)
    assert reranker.native
    text = tokenizer.decode(reranker.prompt_tokens(QUERY, tools))
    assert text.startswith("<tools>") and f"user: {QUERY}\nassistant: {CALL_OPEN}" in text
    assert '"parameters": {}' in text  # names and descriptions only: the schema is not read
    assert isinstance(default_reranker(model, wrapped), ToolChoiceReranker)
    assert isinstance(default_reranker(model, tokenizer), QueryLikelihoodReranker)


def test_native_argument_prompt_carries_the_schema_and_decodes_a_valid_call(tools,
                                                                          default_model):
    model, tokenizer = default_model
    tool = tools[0]
    for tok in (tokenizer, ToolTemplate(tokenizer)):
        prompt = tool_call_prompt(tok, QUERY, [tool], style="native")
        assert prompt == native_call_prompt(tok, QUERY, [tool])
        text = tokenizer.decode(prompt)
        description = tool.input_schema["properties"]["name"]["description"]
        assert description in text and text.endswith(CALL_PREFIX)
        call = generate_tool_call(model, tok, None, prompt, [tool], max_argument_tokens=24)
        assert call.name == tool.qualified_name and call.complete and not call.errors
    with pytest.raises(ArgumentError, match="unknown prompt style 'xml'"):
        tool_call_prompt(tokenizer, QUERY, [tool], style="xml")


def test_agent_rejects_an_unknown_prompt_style(tools, default_model):
    model, tokenizer = default_model
    with pytest.raises(ArgumentError, match="unknown prompt style"):
        Agent(model, tokenizer, None, None, prompt_style="json")  # type: ignore[arg-type]
