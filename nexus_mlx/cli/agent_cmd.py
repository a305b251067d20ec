"""The ``nexus-mlx agent`` command: answer one request with the agent loop over live MCP servers
named on the command line, saying what each step did to the live cache and what each call did.

Contract: ``cmd_agent(args)`` reads ``args.request``, ``args.server`` (each ``NAME=COMMAND``: the
namespace the server's tools get and its command line, ``time=mcp-server-time``; checked by
:func:`server_spec` before anything starts), ``args.approve`` (``read-only``, the default: only
tools that declare themselves read-only run; ``ask``: those run, and every other call is put to
the person at the terminal, refused unless they answer yes; ``all``: every call runs),
``args.tool_choice`` (``auto``, ``required``, ``none`` or a tool's qualified name, for the first
step), ``args.max_steps``, ``args.max_tokens`` and ``args.no_review``; starts the servers, runs
:func:`~nexus_mlx.agent.loop.run_agent` on one live session over every tool they list, prints
each step, each call with its verdict, and the answer, and shuts the servers down. Returns 0
when the run ended on the model's answer, 1 otherwise (the steps ran out, a reply was cut or
wrote a call that did not parse). It keeps no conversation between invocations.
"""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from nexus_mlx.agent.approval import READ_ONLY, ApprovalPolicy, CallApproval, effect
from nexus_mlx.agent.loop import AgentRun, run_agent
from nexus_mlx.agent.mcp_server import McpServer, ServerSpec
from nexus_mlx.agent.session import Session
from nexus_mlx.cli import checks
from nexus_mlx.cli.demo_session import describe_step
from nexus_mlx.decode.call_format import ParsedCall
from nexus_mlx.errors import ArgumentError, ServerError, ToolError
from nexus_mlx.models.load import load
from nexus_mlx.tools.registry import ToolRegistry
from nexus_mlx.tools.tool import Tool

APPROVALS = ("read-only", "ask", "all")
CHOICES = ("auto", "required", "none")


def server_spec(value: str) -> ServerSpec:
    """The server a ``--server NAME=COMMAND`` value names, or an :class:`ArgumentError`."""
    name, sep, command = value.partition("=")
    if not sep or not name.strip():
        raise ArgumentError(f"--server {value!r} must be NAME=COMMAND, e.g. "
                            "'time=mcp-server-time' (NAME prefixes its tools: "
                            "time.get_current_time)")
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise ArgumentError(f"--server {value!r}: the command is not a valid command line "
                            f"({exc})") from None
    if not words:
        raise ArgumentError(f"--server {value!r} names no command after '='")
    try:
        return ServerSpec(words[0], tuple(words[1:]), namespace=name.strip())
    except (ServerError, ToolError) as exc:
        raise ArgumentError(f"--server {value!r}: {exc}") from None


def ask_at_terminal(call: ParsedCall, tool: Tool, read: Callable[[str], str] = input) -> bool:
    """Whether the person at the terminal answers yes to running ``call`` (no answer: no)."""
    try:
        answer = read(f"  run {call.name}({json.dumps(call.arguments)})? the tool "
                      f"{effect(tool)} [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def approval(name: str) -> CallApproval | None:
    """The approval ``--approve NAME`` stands for."""
    if name not in APPROVALS:
        raise ArgumentError(f"--approve {name!r} is not one of {', '.join(APPROVALS)}")
    return {"read-only": READ_ONLY, "ask": ApprovalPolicy(ask=ask_at_terminal),
            "all": None}[name]


def tool_choice(value: str, registry: ToolRegistry) -> str | dict[str, Any]:
    """``--tool-choice``: one of :data:`CHOICES`, or the name of a tool the servers list."""
    if value in CHOICES:
        return value
    if value not in registry.names():
        raise ArgumentError(f"--tool-choice {value!r} is neither one of {', '.join(CHOICES)} "
                            f"nor a tool the servers list ({', '.join(registry.names())})")
    return {"type": "function", "function": {"name": value}}


def print_run(run: AgentRun) -> None:
    """Each step, each call with its verdict, the loop's retries and the answer."""
    for index, report in enumerate(run.steps):
        print(describe_step(f"step {index + 1}", report))
    for done in run.executions:
        output = " ".join(done.output.split())[:160]
        print(f"call {done.name}({json.dumps(done.arguments)}) -> {done.verdict}: {output}")
    for line in run.regenerated:
        print(f"retry: {line}")
    print(f"answer: {run.answer.strip()}" if run.finish == "answer"
          else f"no answer: the run ended with {run.finish!r}")


def cmd_agent(args: argparse.Namespace) -> int:
    request = checks.request_text(args.request, "the request")
    if not args.server:
        raise ArgumentError("give at least one --server NAME=COMMAND, e.g. "
                            "--server time=mcp-server-time")
    specs = [server_spec(value) for value in args.server]
    names = [spec.namespace for spec in specs]
    if len(set(names)) < len(names):
        raise ArgumentError(f"--server names must differ, got {names}")
    approve = approval(args.approve)
    checks.positive_int(args.max_steps, "--max-steps")
    checks.positive_int(args.max_tokens, "--max-tokens")
    with ExitStack() as stack:  # the servers first: a wrong command fails before a model loads
        servers = {spec.namespace or "": stack.enter_context(McpServer(spec)) for spec in specs}
        registry = ToolRegistry([t for server in servers.values() for t in server.list_tools()])
        choice = tool_choice(args.tool_choice, registry)
        model, tokenizer = load(args.model)
        print(f"{len(registry)} tools from {', '.join(servers)}; approval: {args.approve}")
        run = run_agent(Session(model, tokenizer), [], request, registry, servers,
                        tool_choice=choice, max_steps=args.max_steps,
                        max_tokens=args.max_tokens, review=not args.no_review, approve=approve)
    print_run(run)
    return 0 if run.finish == "answer" else 1
