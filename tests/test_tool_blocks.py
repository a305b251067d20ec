"""Compiled tool blocks in live sessions (real default model and chat template): a tool's span is
found in the rendered request, blocks are harvested from one session and spliced into another,
and a splice at a 100% budget, or a splice healed afterwards, equals a fresh prefill."""

from __future__ import annotations

import numpy as np
import pytest
from cache_oracle import max_diff
from tiny_models import tiny_model

import nexus_mlx.agent.tool_blocks as tool_blocks_module
from nexus_mlx.agent.session import Session
from nexus_mlx.agent.session_file import template_digest
from nexus_mlx.agent.tool_blocks import ToolBlocks
from nexus_mlx.errors import ArgumentError
from nexus_mlx.metrics import next_token_kl
from nexus_mlx.models.forward import forward, make_cache

TOL = 1e-4


def _tool(name: str, description: str, **props: str) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "required": list(props),
                       "properties": {k: {"type": "string", "description": v}
                                      for k, v in props.items()}}}}


TOOLS = [
    _tool("get_current_time", "Get the current time in a specific timezone.",
          timezone="IANA timezone name, e.g. 'America/New_York' or 'Europe/London'."),
    _tool("git_log", "Show the commit history of a git repository, newest first.",
          repo_path="Path to the git repository.", max_count="How many commits to show."),
    _tool("search_issues", "Search the issues of a GitHub repository by keywords and labels.",
          query="Search words, GitHub search syntax allowed.", owner="Repository owner."),
]
MESSAGES = [{"role": "system", "content": "You are a coding agent. Use the tools when they help."},
            {"role": "user", "content": "What time is it in Tokyo right now?"}]


@pytest.fixture(scope="module")
def blocks(default_model):
    model, tokenizer = default_model
    return ToolBlocks(model, Session(model, tokenizer).render, template_digest(tokenizer))


def _fresh(model, ids):
    return forward(model, np.asarray(ids), make_cache(model), logits="last")[0, -1]


def test_every_tool_span_sits_inside_the_rendered_request(default_model, blocks):
    model, tokenizer = default_model
    ids = Session(model, tokenizer).render(MESSAGES, TOOLS)
    text = bytes(np.asarray(ids, np.int32))
    for tool in TOOLS:
        span = blocks.span(tool)
        assert span is not None and len(span) > 20
        assert bytes(np.asarray(span, np.int32)) in text
    assert blocks.key(TOOLS[0]) != blocks.key(TOOLS[1])
    assert blocks.key(TOOLS[0]) == blocks.key(dict(TOOLS[0]))


def test_remembered_spans_stay_bounded_when_tools_change_per_request(default_model,
                                                                      monkeypatch):
    model, tokenizer = default_model
    fresh = ToolBlocks(model, Session(model, tokenizer).render, template_digest(tokenizer))
    monkeypatch.setattr(tool_blocks_module, "MAX_SPANS", 2)
    first = fresh.span(TOOLS[0])
    for tool in TOOLS:
        fresh.span(tool)
    assert len(fresh._spans) == 2 and fresh.key(TOOLS[0]) not in fresh._spans
    assert fresh.span(TOOLS[0]) == first  # forgotten, rendered again the same


def test_blocks_harvested_in_one_session_are_spliced_into_another(default_model, blocks):
    model, tokenizer = default_model
    first = Session(model, tokenizer, blocks=blocks)
    first.step(MESSAGES, TOOLS)
    assert len(blocks) == 3 and blocks.nbytes > 0  # cut from the rows it just computed
    shuffled = [TOOLS[2], TOOLS[0], TOOLS[1]]
    ids = first.render(MESSAGES, shuffled)
    exact = Session(model, tokenizer, blocks=blocks, budget=100.0)
    report = exact.step(MESSAGES, shuffled)
    assert report.from_blocks == sum(len(blocks.span(t)) for t in TOOLS)
    assert max_diff(exact.next_token_logits(), _fresh(model, ids)) <= TOL  # all recomputed
    cheap = Session(model, tokenizer, blocks=blocks, budget=5.0, guard=None)  # stale rows kept
    report = cheap.step(MESSAGES, shuffled)
    assert report.from_blocks > 0 and report.stale > 0
    assert report.computed == len(ids) - report.from_blocks
    assert next_token_kl(_fresh(model, ids), cheap.next_token_logits()) < 0.5
    cheap.heal()
    assert cheap.stale_rows == 0
    assert max_diff(cheap.next_token_logits(), _fresh(model, ids)) <= TOL


def test_compile_fills_blocks_and_exact_sessions_never_splice(default_model):
    model, tokenizer = default_model
    library = ToolBlocks(model, Session(model, tokenizer).render, template_digest(tokenizer))
    assert library.compile(TOOLS[:2]) == 2 and library.compile(TOOLS[:2]) == 0
    audit = Session(model, tokenizer, policy="exact", blocks=library)
    report = audit.step(MESSAGES, TOOLS[:2])
    assert report.from_blocks == 0 and report.stale == 0
    tiny = ToolBlocks(model, Session(model, tokenizer).render, max_bytes=0)
    tiny.compile(TOOLS[:1])
    assert len(tiny) == 0  # over its byte budget: evicted at once
    with pytest.raises(ArgumentError):
        ToolBlocks(model, Session(model, tokenizer).render, max_bytes=-1)
    with pytest.raises(ArgumentError, match="another loaded model"):
        Session(tiny_model("llama"), None, blocks=library)
