"""The agent turn: route, generate the call's arguments in a sidecar, optionally execute it.

Contract: ``Agent(model, tokenizer, registry, router, servers).turn(messages)`` routes the last
user message with the :class:`~nexus_mlx.routing.router.Router` (SLB + margin gate + reranker:
depth-independent, it never reads the conversation's KV cache), then generates the chosen
tool's arguments over its compressed-IR signature (``prompt_style="ir"``, the default) or its
full definition in the model's own tool prompt (``"native"``) with constrained decoding, in a sidecar
sequence at position 0 built from a pruned window of the conversation
(:func:`~nexus_mlx.agent.sidecar.sidecar_messages`). ``execute(turn)`` runs the call on the live
MCP server that owns the tool and returns its result. ``run(request)`` is the multi-step loop
instead: one live :class:`~nexus_mlx.agent.session.Session` for the whole conversation, the
router's top-k tools shown each step, calls in the model's own format executed on the servers
until the model answers in text (:func:`~nexus_mlx.agent.loop.run_agent`); the conversation is
kept in ``history`` (a run that raises :class:`~nexus_mlx.errors.RunError` after calls ran
keeps them there too). ``max_requests`` bounds it: before a run, whole exchanges (a user
request and everything after it up to the next one) are dropped from its start until at most
``max_requests - 1`` remain, an edit the live session repairs instead of re-encoding; with
None (the default) it grows until the model's context refuses it (the error names both
lengths), and ``reset()`` starts a new conversation. When a server says its tool list changed,
``run`` and ``turn`` take its new tools into ``registry`` (``refresh_tools()``) and the router
is built again over it on its next use (only new tools are embedded). One coarse re-entrant
lock serialises whole turns and runs, so concurrent callers get exactly the outputs they would
get alone (greedy decoding is deterministic).

It does not own the servers' lifetimes (the caller starts and closes them).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.nn as nn

from nexus_mlx._platform.mlx_thread import on_mlx_thread
from nexus_mlx.agent.approval import CallApproval
from nexus_mlx.agent.loop import (
    DEFAULT_ANSWER_PROMPT,
    AgentRun,
    check_positive_int,
    last_exchanges,
    relisted,
    run_agent,
    server_for,
)
from nexus_mlx.agent.mcp_server import McpCallResult, McpServer
from nexus_mlx.agent.session import Session
from nexus_mlx.agent.sidecar import Message, sidecar_messages
from nexus_mlx.decode.tool_call import (
    DEFAULT_OPTIONAL_MARGIN,
    PROMPT_STYLES,
    ToolCallResult,
    generate_tool_call,
    quoted_text,
    tool_call_prompt,
)
from nexus_mlx.errors import ArgumentError, RunError, ToolError
from nexus_mlx.routing.router import RouteDecision, Router, rebuilt_router
from nexus_mlx.tools.registry import ToolRegistry


@dataclass
class AgentTurn:
    route: RouteDecision
    call: ToolCallResult
    sidecar: list[dict[str, str]]
    prompt_tokens: int
    timings: dict[str, float] = field(default_factory=dict)


class Agent:
    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        registry: ToolRegistry,
        router: Router,
        servers: Mapping[str, McpServer] | None = None,
        *,
        window: int = 4,
        payload_chars: int = 240,
        max_argument_tokens: int = 96,
        optional_margin: float = DEFAULT_OPTIONAL_MARGIN,
        prompt_style: str = "ir",
        ground_optional: bool = True,
        max_requests: int | None = None,
    ) -> None:
        if max_requests is not None:
            check_positive_int("max_requests", max_requests)
        if prompt_style not in PROMPT_STYLES:
            raise ArgumentError(f"unknown prompt style {prompt_style!r}; choose one of "
                                f"{PROMPT_STYLES}")
        self.model, self.tokenizer = model, tokenizer
        self.registry, self.router = registry, router
        self.servers = dict(servers or {})  # namespace (or "") -> server
        self.window, self.payload_chars = window, payload_chars
        self.max_argument_tokens = max_argument_tokens
        self.optional_margin = optional_margin  # see generate_tool_call
        self.prompt_style = prompt_style  # "ir" or "native": see tool_call_prompt
        self.ground_optional = ground_optional  # see generate_tool_call
        self.lock = threading.RLock()
        self.max_requests = max_requests  # exchanges kept in history (see the module docstring)
        self.session: Session | None = None  # the live conversation of run(), made on first use
        self.history: list[dict[str, Any]] = []

    def reset(self) -> None:
        """Forget the conversation of :meth:`run`: its history and its live session."""
        with self.lock:
            self.history, self.session = [], None

    @on_mlx_thread  # its MLX work runs on the one MLX thread, whichever thread calls
    def run(
        self,
        request: str,
        *,
        top_k: int = 8,
        tool_choice: str | Mapping[str, Any] = "auto",
        max_steps: int = 6,
        max_tokens: int = 256,
        answer_prompt: str | None = DEFAULT_ANSWER_PROMPT,
        review: bool = True,
        approve: CallApproval | None = None,
    ) -> AgentRun:
        """Answer ``request`` in the running conversation, calling tools as the model asks
        (``answer_prompt``, ``review``, ``approve``: which calls may run, see
        :func:`~nexus_mlx.agent.loop.run_agent`)."""
        with self.lock:
            if self.session is None:
                self.session = Session(self.model, self.tokenizer)
            def select(query: str) -> list[str]:  # reads the registry in force at each call
                if len(self.registry) > top_k:
                    return self.routed_tools(query, top_k)
                return self.registry.names()

            history = last_exchanges(self.history, self.max_requests - 1) \
                if self.max_requests is not None else self.history
            try:
                result = run_agent(self.session, history, request, self.registry, self.servers,
                                   select_tools=select, tool_choice=tool_choice,
                                   max_steps=max_steps, max_tokens=max_tokens,
                                   answer_prompt=answer_prompt, review=review,
                                   approve=approve,
                                   on_registry=self._take_registry)
            except RunError as exc:  # calls ran on their servers: the conversation keeps them
                assert isinstance(exc.run, AgentRun)
                self.history = exc.run.messages
                raise
            self.history = result.messages
            return result

    def _take_registry(self, registry: ToolRegistry) -> None:
        self.registry = registry  # the router follows on its next use (current_router)

    def current_router(self) -> Router:
        """The router, built again over :attr:`registry` first when that differs from the
        router's (:func:`~nexus_mlx.routing.router.rebuilt_router`: only new tools are embedded)."""
        with self.lock:
            current = self.router.registry
            if current is not self.registry and current != self.registry:
                self.router = rebuilt_router(self.router, self.registry)
            return self.router

    def refresh_tools(self) -> bool:
        """List again the tools of every server that said its list changed and take them into
        :attr:`registry` (:meth:`run` does this itself before each step); True when one did."""
        with self.lock:
            registry = relisted(self.registry, self.servers)
            if registry is not None:
                self._take_registry(registry)
            return registry is not None

    def routed_tools(self, request: str, k: int) -> list[str]:
        """The ``k`` tools the router ranks highest for ``request``, its choice first."""
        decision = self.current_router().route(request)
        names = [decision.chosen] + [n for n, _ in decision.candidates if n != decision.chosen]
        return names[:k]

    @on_mlx_thread  # its MLX work runs on the one MLX thread, whichever thread calls
    def turn(self, messages: Sequence[Message]) -> AgentTurn:
        """Route the last user message and generate the chosen tool's call."""
        with self.lock:
            timings: dict[str, float] = {}
            start = time.perf_counter()
            window = sidecar_messages(messages, window=self.window, payload_chars=self.payload_chars)
            self.refresh_tools()
            decision = self.current_router().route(str(messages[-1].get("content", "")))
            timings["route"] = time.perf_counter() - start
            tool = self.registry.get(decision.chosen)
            start = time.perf_counter()
            prompt = tool_call_prompt(self.tokenizer, window, [tool], style=self.prompt_style)
            call = generate_tool_call(self.model, self.tokenizer, None, prompt, [tool],
                                      max_argument_tokens=self.max_argument_tokens,
                                      optional_margin=self.optional_margin,
                                      quoted=quoted_text(window),
                                      ground_optional=self.ground_optional)
            timings["arguments"] = time.perf_counter() - start
            return AgentTurn(decision, call, window, len(prompt), timings)

    def server_for(self, name: str) -> McpServer:
        """The live server owning tool ``name`` (``namespace.tool`` or a plain name)."""
        server = server_for(self.servers, self.registry, name)
        if server is None:
            raise ToolError(f"no running MCP server owns tool {name!r}; servers: {sorted(self.servers)}")
        return server

    def execute(self, turn: AgentTurn, timeout: float | None = None) -> McpCallResult:
        """Run the turn's call on its server (serialised with turns by the same lock)."""
        with self.lock:
            if not turn.call.valid:
                raise ToolError(f"refusing to execute an invalid call: {list(turn.call.errors)}")
            return self.server_for(turn.call.name).call_tool(turn.call.name, turn.call.arguments,
                                                             timeout=timeout)

