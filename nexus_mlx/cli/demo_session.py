"""The demo's live-session part: one conversation whose KV cache is edited in place, turn by turn.

Contract: ``session_showcase(model, tokenizer, registry, servers, repo, say)`` runs a short
multi-turn conversation over the live tools with one :class:`~nexus_mlx.agent.session.Session`:
two requests answered by the agent loop (tool calls in the model's own format executed on the
live servers, results appended; only tools that declare themselves read-only run), then the two
edits agents make — the tool list changes (one tool removed) and a stale bulky tool result is
cut to a surrogate — each applied to the same live cache. Every step prints its path and what it
reused, spliced, repaired and computed; the edit steps also print the next-token KL and top-1
agreement against a fresh prefill of the same request (the session's debug check). Returns the
number of calls the servers accepted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from nexus_mlx.agent.approval import READ_ONLY
from nexus_mlx.agent.loop import AgentRun, openai_tool, run_agent
from nexus_mlx.agent.mcp_server import McpServer
from nexus_mlx.agent.session import Session, StepReport
from nexus_mlx.agent.sidecar import surrogate
from nexus_mlx.tools.registry import ToolRegistry

Say = Callable[[str], None]


def describe_step(label: str, report: StepReport) -> str:
    """One line: what a step did to the live cache, and how long it took."""
    line = (f"  {label}: {report.path:<8} {report.prompt_tokens:>5} tokens = {report.reused} "
            f"reused + {report.spliced} spliced ({report.repaired} of them repaired) + "
            f"{report.computed} computed; {report.deleted} deleted; {report.stale} stale left; "
            f"{report.timings.get('total', 0.0) * 1e3:.0f} ms")
    if report.kl is not None:
        line += f"; vs a fresh prefill: KL {report.kl:.4f} nats, top-1 " + (
            "agrees" if report.top1 else "differs")
    return line


def _show_run(run: AgentRun, say: Say) -> int:
    for i, report in enumerate(run.steps):
        say(describe_step(f"step {i + 1}", report))
    accepted = 0
    for done in run.executions:
        accepted += done.ok
        say(f"    call {done.name}({done.arguments}) -> {done.verdict}: {done.output[:100]!r}")
    say(f"  answer: {run.answer.strip()[:160]!r}" if run.finish == "answer"
        else "  (stopped at the step limit)")
    return accepted


def session_showcase(
    model: Any,
    tokenizer: Any,
    registry: ToolRegistry,
    servers: Mapping[str, McpServer],
    repo: Path,
    say: Say,
    *,
    max_tokens: int = 96,
) -> int:
    """Run the conversation described in the module docstring."""
    live = ToolRegistry([t for t in registry if t.server in servers])
    session = Session(model, tokenizer)
    say(f"\nlive session over {len(live)} tools (policy {session.policy!r}, repair budget "
        f"{session.budget:g}%, allocator {session.allocator!r}):")
    accepted = 0
    history: Sequence[Mapping[str, Any]] = []
    for request in (f"Show me the last commit of the git repository at {repo}.",
                    "What time is it in Asia/Tokyo right now?"):
        say(f"request: {request!r}")
        start = time.perf_counter()
        run = run_agent(session, history, request, live, servers, tool_choice="required",
                        max_steps=2, max_tokens=max_tokens, approve=READ_ONLY)
        accepted += _show_run(run, say)
        say(f"  ({time.perf_counter() - start:.1f} s)")
        history = run.messages
    tools = [openai_tool(t) for t in live]
    session.debug = True
    removed = tools[len(tools) // 2]["function"]["name"]
    fewer = [t for t in tools if t["function"]["name"] != removed]
    say(f"edit: the tool list changes ({removed} removed, as when routing changes its top-k)")
    say(describe_step("step", session.step(list(history), fewer)))
    bulky = max((i for i, m in enumerate(history) if m.get("role") == "tool"),
                key=lambda i: len(str(history[i].get("content", ""))), default=None)
    if bulky is not None:
        pruned = [dict(m) for m in history]
        pruned[bulky]["content"] = surrogate(pruned[bulky], 120)
        say(f"edit: the stale {pruned[bulky].get('name', 'tool')} result is cut to a surrogate")
        say(describe_step("step", session.step(pruned, fewer)))
    return accepted
