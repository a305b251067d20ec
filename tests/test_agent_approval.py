"""Approval of the agent loop's tool calls: the policy over MCP annotations, and the loop on the
live mcp-server-git, where a refused call never reaches the server (the repository stays as it
was) and an approved one does."""

from __future__ import annotations

import dataclasses
import subprocess
import threading
from pathlib import Path

import pytest

from nexus_mlx.agent.approval import (
    READ_ONLY,
    ApprovalPolicy,
    check_approval,
    effect,
    may_destroy,
    reads_only,
)
from nexus_mlx.agent.loop import refusal, run_agent
from nexus_mlx.agent.mcp_server import McpServer, installed_server
from nexus_mlx.agent.session import Session
from nexus_mlx.decode.call_format import ParsedCall
from nexus_mlx.errors import ArgumentError
from nexus_mlx.tools.registry import ToolRegistry
from nexus_mlx.tools.tool import Tool

SCHEMA = {"type": "object", "properties": {}}


def _tool(name: str, server: str = "git", **hints: bool) -> Tool:
    return Tool(name, f"the {name} tool", SCHEMA, annotations=hints, server=server)


READER = _tool("log", readOnlyHint=True)
ADDER = _tool("add", readOnlyHint=False, destructiveHint=False)
RESETTER = _tool("reset", readOnlyHint=False, destructiveHint=True)
UNSAID = _tool("mystery")  # no hints: MCP's defaults say it may write and destroy


def test_hints_are_read_on_the_cautious_side():
    assert reads_only(READER) and not may_destroy(READER)
    assert not reads_only(ADDER) and not may_destroy(ADDER)
    assert may_destroy(RESETTER) and may_destroy(UNSAID) and not reads_only(UNSAID)
    # a read-only claim must be the JSON true, not a truthy string
    assert not reads_only(_tool("odd", readOnlyHint="yes"))  # type: ignore[arg-type]
    assert [effect(t) for t in (READER, ADDER, UNSAID)] == [
        "declared read-only", "may write (not destructive)", "may make destructive changes"]


def test_the_policy_runs_what_is_allowed_or_declared_safe_and_refuses_the_rest():
    call = ParsedCall("git.x", {})
    assert READ_ONLY(call, READER) and not READ_ONLY(call, ADDER)
    assert not READ_ONLY(call, RESETTER) and not READ_ONLY(call, UNSAID)
    additive = ApprovalPolicy(non_destructive=True)
    assert additive(call, ADDER) and not additive(call, RESETTER) and not additive(call, UNSAID)
    by_name = ApprovalPolicy(allow={"git.reset"})
    assert by_name(call, RESETTER) and not by_name(call, ADDER)
    by_server = ApprovalPolicy(allow=["git"], read_only=False)
    assert by_server(call, RESETTER) and not by_server(call, _tool("log", server="other",
                                                                    readOnlyHint=True))


def test_ask_hears_only_the_calls_the_policy_does_not_allow():
    heard: list[tuple[str, str]] = []

    def ask(call: ParsedCall, tool: Tool) -> bool:
        heard.append((call.name, tool.qualified_name))
        return call.arguments.get("ok") is True

    policy = ApprovalPolicy(ask=ask)
    assert policy(ParsedCall("git.log", {}), READER) and heard == []
    assert policy(ParsedCall("git.reset", {"ok": True}), RESETTER)
    assert not policy(ParsedCall("git.reset", {}), RESETTER)
    assert heard == [("git.reset", "git.reset")] * 2
    # only True approves: a truthy answer of the wrong kind is a refusal
    truthy = ApprovalPolicy(ask=lambda c, t: "yes")  # type: ignore[arg-type,return-value]
    assert not truthy(ParsedCall("git.reset", {}), RESETTER)


@pytest.mark.parametrize("bad, match", [
    ({"allow": "git"}, "not the string 'git'"),
    ({"allow": {"git", ""}}, "not non-empty strings"),
    ({"allow": [3]}, "not non-empty strings"),
    ({"read_only": 1}, "read_only must be True or False"),
    ({"non_destructive": None}, "non_destructive must be True or False"),
    ({"ask": "always"}, "ask must be a callable"),
])
def test_bad_policies_are_refused(bad, match):
    with pytest.raises(ArgumentError, match=match):
        ApprovalPolicy(**bad)


def test_a_refused_call_becomes_a_result_that_says_why():
    registry = ToolRegistry([READER, RESETTER])
    call = ParsedCall("git.reset", {"repo_path": "/r"})
    done = refusal(call, registry, READ_ONLY)
    assert done is not None and not done.ok and not done.approved
    assert done.output.startswith("error: git.reset was not run: the approval policy refused it")
    assert "may make destructive changes" in done.output and done.arguments == call.arguments
    assert refusal(ParsedCall("git.log", {}), registry, READ_ONLY) is None
    assert refusal(call, registry, None) is None  # no policy: every call runs
    # a tool outside the registry is not put to the policy (it fails as an unknown tool)
    assert refusal(ParsedCall("git.nope", {}), registry, lambda c, t: 1 / 0) is None
    with pytest.raises(ArgumentError, match="approve must be a callable"):
        check_approval("yes")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout


@pytest.fixture()
def staged_repo(tmp_path: Path) -> Path:
    """A repository with one commit and one change staged on top of it."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.email", "ada@example.com")
    _git(repo, "config", "user.name", "Ada")
    (repo / "notes.txt").write_text("one\n")
    _git(repo, "add", "notes.txt")
    _git(repo, "commit", "-q", "-m", "notes")
    (repo / "notes.txt").write_text("one\ntwo\n")
    _git(repo, "add", "notes.txt")
    return repo


class _WritesTheReset(Session):
    """A session whose model (really decoded, then overruled) calls ``git.git_reset`` on the
    repository: the 135M default model's paths are unreliable, and what is under test is what
    the loop does with the call, on the real server."""

    def __init__(self, model, tokenizer, repo: Path) -> None:
        super().__init__(model, tokenizer)
        self.repo = repo

    def generate(self, messages, tools=None, **kwargs):
        reply = super().generate(messages, tools, **kwargs)
        call = ParsedCall("git.git_reset", {"repo_path": str(self.repo)})
        return dataclasses.replace(reply, tool_calls=[call], call_errors=[],
                                   finish_reason="tool_calls")


def _reset_run(model, tokenizer, repo: Path, approve):
    spec = installed_server("mcp-server-git", "mcp_server_git", "--repository", str(repo),
                            namespace="git", call_timeout=30)
    with McpServer(spec) as server:
        registry = ToolRegistry(server.list_tools())
        assert may_destroy(registry.get("git.git_reset"))  # the server's own annotation
        return run_agent(_WritesTheReset(model, tokenizer, repo), [],
                         f"Unstage all staged changes in the git repository at {repo}.", registry,
                         {"git": server}, tool_choice="required", max_steps=1, max_tokens=8,
                         review=False, approve=approve)


def test_a_refused_call_never_reaches_its_server(default_model, staged_repo: Path):
    model, tokenizer = default_model
    asked_on: list[int] = []

    def refuse(call: ParsedCall, tool: Tool) -> bool:
        asked_on.append(threading.get_ident())
        return READ_ONLY(call, tool)

    before = _git(staged_repo, "diff", "--cached", "--name-only")
    run = _reset_run(model, tokenizer, staged_repo, refuse)
    assert [e.name for e in run.executions] == ["git.git_reset"]
    done = run.executions[0]
    assert not done.ok and not done.approved and "approval policy refused" in done.output
    assert asked_on == [threading.get_ident()]  # asked on the loop's thread
    assert _git(staged_repo, "diff", "--cached", "--name-only") == before == "notes.txt\n"
    tool_turn = next(m for m in run.messages if m["role"] == "tool")
    assert tool_turn["content"] == done.output  # the model reads why


def test_an_approved_call_runs_on_its_server(default_model, staged_repo: Path):
    model, tokenizer = default_model
    run = _reset_run(model, tokenizer, staged_repo, ApprovalPolicy(allow={"git.git_reset"}))
    done = run.executions[0]
    assert done.approved and done.ok, done.output
    assert _git(staged_repo, "diff", "--cached", "--name-only") == ""  # the server unstaged it
    assert _git(staged_repo, "diff", "--name-only") == "notes.txt\n"  # the change itself stays


def test_a_policy_that_fails_stops_the_run_before_any_call_is_sent(default_model,
                                                                   staged_repo: Path):
    model, tokenizer = default_model

    def broken(call: ParsedCall, tool: Tool) -> bool:
        raise RuntimeError("the approval service is down")

    with pytest.raises(RuntimeError, match="approval service is down"):
        _reset_run(model, tokenizer, staged_repo, broken)  # nothing ran: raised as it is
    assert _git(staged_repo, "diff", "--cached", "--name-only") == "notes.txt\n"
