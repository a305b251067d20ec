"""The agent loop over a live session: answer a request, calling tools on live MCP servers until
the model answers in text.

Contract: ``run_agent(session, history, request, registry, servers)`` appends the user's
request to ``history`` and repeats, at most ``max_steps`` times: choose the tools this step shows
(``select_tools``, e.g. a router's top-k over a large registry; default every tool), let the
session generate (tool calls in the model's own format, constrained; ``tool_choice`` on the first
step, ``"auto"`` after), execute each call on the server that owns the tool and append the
assistant call and the tool results as OpenAI-style messages. It stops when a reply has no
calls: ``finish`` is ``"answer"``, or ``"call_error"`` when the reply wrote a call that did not
parse (``replies[-1].call_errors`` says why), or ``"length"`` when it was cut at ``max_tokens``
(``"step_limit"``: the steps ran out). Two replies are asked again (``AgentRun.regenerated``
lists each retry): one that writes a new call to an offered tool as JSON in its prose instead of
in the call format (small models do; a slightly wrong name counts when it means one offered
tool, :func:`~nexus_mlx.decode.prose_calls.resolved_name`) is regenerated with that tool forced
(``tool_choice`` naming it, or ``"required"`` for several), so the call is made and schema-valid;
one that only repeats calls already executed, in the format or as text, is asked again for the
answer, with ``tool_choice "none"`` and a first token that must begin words
(:func:`~nexus_mlx.decode.prose_calls.prose_answer`). A step that follows tool results sees one
more user message at the end, ``answer_prompt`` (default :data:`DEFAULT_ANSWER_PROMPT`; None for
none; ``{request}`` in it stands for the request's text): small models that recite the call and
its result as JSON answer in words when asked to (Qwen2.5-Coder-0.5B does). It is shown only to
that step, never kept in ``messages``, so the next step or request removes it from the live
cache (an edit the session repairs). With ``review`` (default True), before a reply without
calls ends a run that made calls, the model splits the request into its parts
(:mod:`~nexus_mlx.agent.review`; once a run) and, where it finds several, a call is required for
each part not asked for yet (``tool_choice "required"``, the review's follow-up naming the part
as the last message): a call already made means the part is covered; the calls not made yet are
made together instead of answering (else the answer stands; ``regenerated`` says which), and the
answer prompt of the steps after them asks for every part of the quoted request
(:data:`~nexus_mlx.agent.review.EVERY_PART_PROMPT`, where ``answer_prompt`` is not None). A run
that made no call is not reviewed: a required call cannot tell a request that needs a tool from
one that does not. Qwen2.5-Coder-1.5B answers "what changed in the last commit, and what time
is it in Tokyo now?" after the log's result alone, yet splits the request when asked, calls
``get_current_time`` for the Tokyo part and answers both parts. Tool results older than the
latest step and longer than ``payload_chars`` are replaced by a short surrogate in the messages the
session sees, an edit in the middle of the conversation that the session repairs instead of
re-encoding; the latest results are shown up to ``result_chars`` characters each (default
:data:`DEFAULT_RESULT_CHARS`; the run's ``messages`` keep them whole); while the calls run on their
servers the session heals the rows its repairs left stale
(:meth:`~nexus_mlx.agent.session.Session.heal`). ``approve`` (None: every call runs) is asked
about each call to a registry tool before any call of its step runs; a call it refuses is never
sent (:mod:`~nexus_mlx.agent.approval`; :data:`~nexus_mlx.agent.approval.READ_ONLY` runs only the
tools that declare themselves read-only). A call the approval refuses, that names an unknown
tool, or that its server refuses or fails, becomes the tool's result text (``error: ...``), so
the model can recover; the :class:`Execution` records say which calls succeeded (and
``approved`` which the policy refused). Any other failure (the model or
the cache failed, a failed heal, a conversation that outgrew the context) propagates as it is while
no call has run; after one has, it is raised as :class:`~nexus_mlx.errors.RunError` whose ``run``
(``finish == "error"``) keeps every step, call and result up to then, so a call that ran on its
server is never lost. A server that says its tool list changed
(``notifications/tools/list_changed``, e.g. after a call enabled a toolset) is listed again before
the run's first step and before every later one: its tools in the registry are replaced
(:func:`relisted`), ``on_registry`` hears the new registry (the
:class:`~nexus_mlx.agent.orchestrator.Agent` rebuilds its router), the shown tools are chosen
again, and the session splices the changed tool list like any other edit.

It does not own the servers (the caller starts and closes them) and never routes by reading
the deep cache.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from nexus_mlx.agent.approval import CallApproval, check_approval, effect
from nexus_mlx.agent.mcp_server import McpServer
from nexus_mlx.agent.review import (
    EVERY_PART_PROMPT,
    follow_up_prompt,
    part_key,
    request_parts,
    with_request,
)
from nexus_mlx.agent.session import Reply, Session, StepReport
from nexus_mlx.agent.sidecar import surrogate
from nexus_mlx.decode.call_format import ParsedCall
from nexus_mlx.decode.prose_calls import intended_calls, prose_answer
from nexus_mlx.errors import ArgumentError, NexusError, RunError
from nexus_mlx.tools.registry import ToolRegistry
from nexus_mlx.tools.tool import Tool

ToolSelector = Callable[[str], Sequence[str]]  # request -> qualified tool names to show
DEFAULT_RESULT_CHARS = 8000  # the latest results shown to the model: ~2-3K tokens each
DEFAULT_ANSWER_PROMPT = ("Using the tool results above, answer my question in plain words, or "
                         "call another tool if you still need one.")


@dataclass(frozen=True)
class Execution:
    name: str
    arguments: dict[str, Any]
    ok: bool
    output: str
    seconds: float
    approved: bool = True  # False: the run's approval policy refused it; it never ran

    @property
    def verdict(self) -> str:
        """``"accepted"``, ``"refused"`` (by its server, or as an unknown tool) or
        ``"not approved"`` (by the run's policy)."""
        return "accepted" if self.ok else "refused" if self.approved else "not approved"


@dataclass
class AgentRun:
    answer: str
    messages: list[dict[str, Any]]  # the conversation, tool turns included (unpruned)
    finish: str  # "answer", "step_limit", "length", "call_error" or "error" (module docstring)
    steps: list[StepReport] = field(default_factory=list)
    executions: list[Execution] = field(default_factory=list)
    replies: list[Reply] = field(default_factory=list)
    regenerated: list[str] = field(default_factory=list)  # "step N: why", one per retry


def openai_tool(tool: Tool) -> dict[str, Any]:
    """The OpenAI / chat-template form of a tool, named by its qualified name."""
    return {"type": "function", "function": {"name": tool.qualified_name,
                                             "description": tool.description,
                                             "parameters": dict(tool.input_schema)}}


def server_for(servers: Mapping[str, McpServer], registry: ToolRegistry, name: str
               ) -> McpServer | None:
    """The running server owning the registry's tool ``name`` (keyed by the tool's namespace,
    ``""`` for none; a plain name may hold dots), or None."""
    if name not in registry.names():
        return None
    return servers.get(registry.get(name).server or "")


def execute_call(call: ParsedCall, registry: ToolRegistry, servers: Mapping[str, McpServer],
                 timeout: float | None = None) -> Execution:
    """Run one call; every failure becomes an ``error: ...`` output instead of an exception."""
    start = time.perf_counter()
    server = server_for(servers, registry, call.name)
    if call.name not in registry.names() or server is None:
        known = "" if server is not None else f"; no running server owns it ({sorted(servers)})"
        return Execution(call.name, call.arguments, False,
                         f"error: unknown tool {call.name!r}{known}", time.perf_counter() - start)
    try:
        result = server.call_tool(call.name, call.arguments, timeout=timeout)
    except NexusError as exc:
        return Execution(call.name, call.arguments, False, f"error: {exc}",
                         time.perf_counter() - start)
    text = result.text if not result.is_error else f"error: {result.text}"
    return Execution(call.name, call.arguments, not result.is_error, text,
                     time.perf_counter() - start)


def relisted(registry: ToolRegistry, servers: Mapping[str, McpServer]) -> ToolRegistry | None:
    """``registry`` with the tools of each server that said its tool list changed replaced by
    its new listing, put where its first tool was (at the end if it had none); the other tools
    keep their places. None when no server said so."""
    changed = [key for key, server in servers.items() if server.tools_changed]
    if not changed:
        return None
    fresh = {key: list(servers[key].list_tools()) for key in changed}
    tools: list[Tool] = []
    for tool in registry:
        key = tool.server or ""
        if key in fresh:
            tools.extend(fresh.pop(key))  # the server's first tool: its new list goes here
        elif key not in changed:
            tools.append(tool)
    for rest in fresh.values():
        tools.extend(rest)
    return ToolRegistry(tools)


def pruned(messages: Sequence[Mapping[str, Any]], keep_from: int, payload_chars: int,
           result_chars: int | None = None) -> list[dict[str, Any]]:
    """``messages`` with tool results before index ``keep_from`` longer than ``payload_chars``
    replaced by their surrogate, and later ones longer than ``result_chars`` (None: no limit)
    cut to their first ``result_chars`` characters and a line saying how much was cut."""
    out = []
    for index, m in enumerate(messages):
        m = dict(m)
        text = str(m.get("content") or "")
        if m.get("role") == "tool" and index < keep_from and len(text) > payload_chars:
            m["content"] = surrogate(m, payload_chars)
        elif m.get("role") == "tool" and result_chars is not None and len(text) > result_chars:
            m["content"] = (f"{text[:result_chars]}\n[... {len(text) - result_chars} more "
                            f"characters not shown]")
        out.append(m)
    return out


def last_exchanges(messages: Sequence[Mapping[str, Any]], keep: int) -> list[dict[str, Any]]:
    """``messages`` without whole exchanges from the start (an exchange is a user message and
    everything after it up to the next user message) until at most ``keep`` remain; messages
    before the first user message (a system prompt) always stay."""
    starts = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    if len(starts) <= keep:
        return [dict(m) for m in messages]
    cut = starts[len(starts) - keep] if keep else len(messages)
    return [dict(m) for m in messages[: starts[0]]] + [dict(m) for m in messages[cut:]]


def check_positive_int(option: str, value: Any) -> int:
    """``value`` when it is a positive integer, else an :class:`ArgumentError` naming ``option``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ArgumentError(f"{option} must be a positive integer, got {value!r}")
    return value


def run_agent(
    session: Session,
    history: Sequence[Mapping[str, Any]],
    request: str,
    registry: ToolRegistry,
    servers: Mapping[str, McpServer],
    *,
    select_tools: ToolSelector | None = None,
    tool_choice: str | Mapping[str, Any] = "auto",
    max_steps: int = 6,
    max_tokens: int = 256,
    payload_chars: int = 400,
    result_chars: int | None = DEFAULT_RESULT_CHARS,
    call_timeout: float | None = None,
    answer_prompt: str | None = DEFAULT_ANSWER_PROMPT,
    review: bool = True,
    approve: CallApproval | None = None,
    on_registry: Callable[[ToolRegistry], None] | None = None,
) -> AgentRun:
    """Answer ``request`` (see the module docstring; ``on_registry`` hears each registry a
    server's changed tool list makes)."""
    if not isinstance(request, str) or not request.strip():
        raise ArgumentError("the request is empty")
    if answer_prompt is not None and (not isinstance(answer_prompt, str)
                                      or not answer_prompt.strip()):
        raise ArgumentError(f"answer_prompt must be a non-empty string or None, got "
                            f"{answer_prompt!r}")
    check_positive_int("max_steps", max_steps)
    check_positive_int("payload_chars", payload_chars)
    if not isinstance(review, bool):
        raise ArgumentError(f"review must be True or False, got {review!r}")
    if result_chars is not None:
        check_positive_int("result_chars", result_chars)
    check_approval(approve)
    if call_timeout is not None and (isinstance(call_timeout, bool)
                                     or not isinstance(call_timeout, (int, float))
                                     or not call_timeout > 0):
        raise ArgumentError(f"call_timeout must be a positive number of seconds or None, got "
                            f"{call_timeout!r}")
    messages: list[dict[str, Any]] = [dict(m) for m in history]
    messages.append({"role": "user", "content": request})
    run = AgentRun("", messages, "step_limit")
    steps = _Steps(session, registry, servers, tool_choice, max_tokens,
                   (payload_chars, result_chars), call_timeout, answer_prompt,
                   (request, select_tools, on_registry), review, approve)
    try:
        for step in range(max_steps):
            if steps.take(run, step):
                return run
    except Exception as exc:
        if not run.executions:  # nothing ran on a server: the failure as it is
            raise
        run.finish = "error"
        raise RunError(f"the run stopped at step {len(run.steps)}: {type(exc).__name__}: {exc}",
                       run) from exc
    return run


class _Steps:
    """One step of :func:`run_agent` at a time, over settings fixed for the run."""

    def __init__(self, session: Session, registry: ToolRegistry, servers: Mapping[str, McpServer],
                 tool_choice: str | Mapping[str, Any], max_tokens: int,
                 limits: tuple[int, int | None], call_timeout: float | None,
                 answer_prompt: str | None,
                 shown: tuple[str, ToolSelector | None, Callable[[ToolRegistry], None] | None],
                 review: bool, approve: CallApproval | None) -> None:
        self.session, self.registry, self.servers = session, registry, servers
        self.approve = approve
        self.request, self.select_tools, self.on_registry = shown  # what chooses the tools shown
        self.names: list[str] = []
        self.tools: list[dict[str, Any]] = []
        self.tool_choice, self.max_tokens = tool_choice, max_tokens
        self.limits, self.call_timeout = limits, call_timeout  # (payload_chars, result_chars)
        self.answer_prompt = answer_prompt
        self.review = review
        self.parts: list[str] | None = None  # the request's parts, once the review split it
        self.parts_called = False  # the review made calls a part needed
        self.asked_parts: set[frozenset[str]] = set()  # parts a follow-up asked for (part_key)
        self.done_calls: set[str] = set()
        self.answer_in_words = prose_answer(session.tokenizer)
        self.refresh(force=True)  # the first step's tools, after any server's new list

    def refresh(self, *, force: bool = False) -> None:
        """Take the new tool lists of servers that said theirs changed (module docstring):
        the registry, ``on_registry`` told, and the tools shown chosen again."""
        registry = relisted(self.registry, self.servers)
        if registry is None and not force:
            return
        if registry is not None:
            self.registry = registry
            if self.on_registry is not None:
                self.on_registry(registry)
        names = self.select_tools(self.request) if self.select_tools is not None \
            else self.registry.names()
        self.names = list(names)
        self.tools = [openai_tool(self.registry.get(n)) for n in self.names]

    def take(self, run: AgentRun, step: int) -> bool:
        """Generate, then run the reply's calls and append them with their results; True when
        the reply has no calls (the run is over)."""
        if step:
            self.refresh()  # a call may have changed a server's tools (e.g. enabled a toolset)
        messages = run.messages
        base = pruned(messages, _last_step_start(messages), *self.limits)
        visible = list(base)
        if self.answer_prompt is not None and messages[-1].get("role") == "tool":
            visible.append({"role": "user", "content": with_request(
                EVERY_PART_PROMPT if self.parts_called else self.answer_prompt, self.request)})
        reply = self._reply(run, step, visible)
        if not reply.tool_calls and self.review and self.tools and run.executions:
            reply = self._reviewed(run, step, base, reply)
        run.replies.append(reply)
        run.steps.append(reply.report)
        self.done_calls.update(_key(c) for c in reply.tool_calls)
        if not reply.tool_calls:
            messages.append({"role": "assistant", "content": reply.content})
            run.answer, run.finish = reply.content, _finish_without_calls(reply)
            return True
        ids = [f"call_{len(run.executions) + i}" for i in range(len(reply.tool_calls))]
        messages.append({"role": "assistant", "content": reply.content or None, "tool_calls": [
            {"id": cid, "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for cid, c in zip(ids, reply.tool_calls, strict=True)]})
        done, heal_error = _execute_while_healing(self.session, reply.tool_calls, self.registry,
                                                  self.servers, self.call_timeout, self.approve)
        for cid, (call, execution) in zip(ids, done, strict=True):
            run.executions.append(execution)
            messages.append({"role": "tool", "tool_call_id": cid, "name": call.name,
                             "content": execution.output})
        if heal_error is not None:  # the results are kept; the run stops on the failure
            raise heal_error
        return False

    def _reply(self, run: AgentRun, step: int, visible: list[dict[str, Any]]) -> Reply:
        """The step's reply, asked again once when it writes a new call as text or only
        repeats calls already made (see the module docstring)."""
        choice = self.tool_choice if step == 0 else "auto"
        generate, tools = self.session.generate, self.tools
        reply = generate(visible, tools, tool_choice=choice, max_tokens=self.max_tokens)
        described = intended_calls(reply.content, self.names) if choice != "none" else []
        fresh = [c for c in described if _key(c) not in self.done_calls]
        if not reply.tool_calls and fresh:
            # the model wrote its call as text: ask for that call, in the format
            wanted = list(dict.fromkeys(c.name for c in fresh))
            run.regenerated.append(f"step {step}: {wanted} written as text, forced")
            reply = generate(visible, tools, tool_choice=_forced_choice(wanted),
                             max_tokens=self.max_tokens)
        repeats = reply.tool_calls or described
        if repeats and all(_key(c) in self.done_calls for c in repeats):
            # the model repeats calls it already has the results of: ask for the answer
            run.regenerated.append(f"step {step}: repeated calls, asked for the answer")
            reply = generate(visible, tools, tool_choice="none", max_tokens=self.max_tokens,
                             logits_processors=[self.answer_in_words])
        return reply

    def _reviewed(self, run: AgentRun, step: int, base: list[dict[str, Any]],
                  answer: Reply) -> Reply:
        """``answer``, or the calls the request's parts need that were not made yet
        (:mod:`~nexus_mlx.agent.review`): the request is split once a run, and each part not
        asked for before is asked for its call; the calls not made yet are made together."""
        if answer.call_errors or answer.finish_reason == "length":
            return answer
        if self.parts is None:
            self.parts = request_parts(self.session, base, self.tools, self.request)
        asking = [p for p in self.parts if part_key(p) not in self.asked_parts]
        if len(self.parts) < 2 or not asking:
            return answer
        missing: list[ParsedCall] = []
        seen = set(self.done_calls)  # made already, or gathered here
        first: Reply | None = None
        for part in asking:
            self.asked_parts.add(part_key(part))
            reply = self.session.generate(
                [*base, {"role": "user", "content": follow_up_prompt(part)}], self.tools,
                tool_choice="required", max_tokens=self.max_tokens)
            new = [c for c in reply.tool_calls if _key(c) not in seen]
            seen.update(_key(c) for c in new)
            if new:
                run.regenerated.append(f"step {step}: review: part {part!r} needs "
                                       f"{[c.name for c in new]}, not called yet")
                missing.extend(new)
                first = first or reply
        if first is None:
            run.regenerated.append(f"step {step}: review: each of {len(self.parts)} parts' "
                                   f"calls was made")
            return answer
        self.parts_called = True
        return dataclasses.replace(first, tool_calls=missing)


def refusal(call: ParsedCall, registry: ToolRegistry, approve: CallApproval | None
             ) -> Execution | None:
    """The result of ``call`` when ``approve`` refuses it (it is not run), else None; calls to
    tools outside the registry are not put to it (they fail as unknown tools)."""
    if approve is None or call.name not in registry.names():
        return None
    tool = registry.get(call.name)
    if approve(call, tool):
        return None
    return Execution(call.name, call.arguments, False,
                     f"error: {call.name} was not run: the approval policy refused it (the tool "
                     f"{effect(tool)}). Answer without it, or use another tool.", 0.0,
                     approved=False)


def _execute_while_healing(session: Session, calls: Sequence[ParsedCall], registry: ToolRegistry,
                           servers: Mapping[str, McpServer], timeout: float | None,
                           approve: CallApproval | None = None,
                           ) -> tuple[list[tuple[ParsedCall, Execution]], Exception | None]:
    """Run the calls ``approve`` does not refuse (asked here, on the caller's thread, before
    any runs) on their servers in a worker thread while this thread heals the session's stale
    rows (MLX work stays on the caller's thread); waits for both, so the next step always sees
    a fully healed cache whatever the servers' timing. A failed heal (the session is left as it
    was) is returned beside the calls' results, never in place of them."""
    refused = [refusal(c, registry, approve) for c in calls]
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="nexus-tool-call") as pool:
        pending = pool.submit(lambda: [(c, r or execute_call(c, registry, servers, timeout))
                                       for c, r in zip(calls, refused, strict=True)])
        heal_error: Exception | None = None
        try:
            session.heal()
        except Exception as exc:
            heal_error = exc
        return pending.result(), heal_error


def _finish_without_calls(reply: Reply) -> str:
    """Why a step without calls ends the run: a call that did not parse, a reply cut at
    ``max_tokens``, or the answer."""
    if reply.call_errors:
        return "call_error"
    return "length" if reply.finish_reason == "length" else "answer"


def _forced_choice(names: Sequence[str]) -> str | dict[str, Any]:
    """``tool_choice`` that forces a call to the one tool named, or some call for several."""
    if len(names) == 1:
        return {"type": "function", "function": {"name": names[0]}}
    return "required"


def _key(call: ParsedCall) -> str:
    return json.dumps([call.name, call.arguments], sort_keys=True)


def _last_step_start(messages: Sequence[Mapping[str, Any]]) -> int:
    """Index of the last assistant message with calls (its results stay verbatim)."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "assistant" and messages[index].get("tool_calls"):
            return index
    return len(messages)
