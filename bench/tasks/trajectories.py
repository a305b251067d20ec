"""Multi-turn tool-using trajectories with the edits agent frameworks make between requests.

Contract: ``make_trajectories(tool_pool, results, n, requests, seed)`` returns ``n``
:class:`Trajectory` objects, each a list of :class:`Request` (``messages``, ``tools`` in OpenAI
form, the ``edit`` class that produced it from the previous request). The first request is a
system prompt, a tool list and a user question; every later one applies one edit to the previous
request and then appends a new user question:

- ``append``: the assistant's call and the tool's result, then the question. With ``answers``
  (a request text -> :data:`Answer`) and the last user turn one of them, whose tool is offered,
  the call is the one that request asks for, with its arguments, and the result is that call's
  real result (a live server's) or, for a tool no server answers here, :func:`stand_in_result`:
  the conversation reads as an agent's would, and every later request also starts with such an
  answer to the last turn before its own edit (an agent answers each turn; the class names the
  edit made besides). Otherwise (or without ``answers``) the call is to a random offered tool
  with made-up arguments and a real result from the pool, and only ``append`` requests add one;
- ``tools``: one tool added or removed, or the list shuffled (servers reconnecting, routing
  changing its top-k);
- ``delete``: a stale tool result truncated to a surrogate, or an old call and its result
  removed;
- ``edit``: an earlier user message reworded.

Edit classes cycle so that every class appears in every trajectory of four or more requests;
``tool_pool`` is a list of OpenAI tool dicts (e.g. the GitHub MCP definitions plus the live time
and git tools), ``results`` maps a tool name to real result texts of that tool (any other tool
gets one of the pool's texts). With ``questions`` (a tool name -> requests that tool serves),
the first tool list holds at least one tool with requests, and each user turn asks a request for
one of the tools that request offers, drawn at random, so a model has a call to write; a request
offering none of them (its tool removed by a ``tools`` edit) asks one of :data:`QUESTIONS`, as
every turn does without ``questions``. Deterministic in ``seed``; no model, no server.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

EDIT_CLASSES = ("append", "tools", "delete", "edit")
QUESTIONS = (
    "What changed in the last commit of the repository?",
    "What time is it in Tokyo right now?",
    "List the open issues that mention the parser.",
    "Which files are modified in the working tree?",
    "Show me the three most recent commits.",
    "Convert 14:30 New York time to London time.",
    "Is there a pull request that touches the README?",
    "Summarize what the tool returned so far in one sentence.",
    "Create a branch called fix-login for the bug we discussed.",
    "Who authored the latest commit, and when?",
)
REWORDINGS = (("What", "Tell me what"), ("Show me", "Please show"), ("List", "Please list"),
              ("Which", "Tell me which"), ("Is there", "Do we have"))
SYSTEM = ("You are a coding agent working in a git repository. Use the tools when they help; "
          "answer briefly when they do not.")


Answer = tuple[str, dict[str, Any], str | None]
"""What a request asks for: the tool, its arguments, and the call's real result (None: none)."""


@dataclass
class Request:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    edit: str  # the class of edit that made it from the previous request ("first" for the first)
    detail: str = ""


@dataclass
class Trajectory:
    index: int
    requests: list[Request] = field(default_factory=list)


def _arguments(tool: Mapping[str, Any], rng: random.Random) -> dict[str, Any]:
    """Plausible arguments: every required property, strings and numbers of the right type."""
    params = tool["function"].get("parameters") or {}
    props = params.get("properties") or {}
    out: dict[str, Any] = {}
    for name in params.get("required") or []:
        kind = (props.get(name) or {}).get("type", "string")
        if kind == "integer":
            out[name] = rng.randint(1, 20)
        elif kind == "boolean":
            out[name] = rng.random() < 0.5
        elif kind == "number":
            out[name] = round(rng.uniform(0, 10), 2)
        elif kind == "array":
            out[name] = []
        elif kind == "object":
            out[name] = {}
        else:
            out[name] = rng.choice(["main", "nexus-mlx", "octo-org", "README.md", "Asia/Tokyo"])
    return out


def stand_in_result(name: str, arguments: Mapping[str, Any]) -> str:
    """The result of a call no server answers here: an acknowledgement naming the call."""
    return json.dumps({"status": "ok", "tool": name, "arguments": dict(arguments)})


def _answered_call(req: Request, answers: Mapping[str, Answer] | None) -> Answer | None:
    """The call the last user turn asks for, when ``answers`` knows it and its tool is offered."""
    last = next((m for m in reversed(req.messages) if m["role"] == "user"), None)
    answer = answers.get(str(last["content"])) if answers and last else None
    offered = {t["function"]["name"] for t in req.tools}
    return answer if answer is not None and answer[0] in offered else None


def _append_call(req: Request, results: Mapping[str, Sequence[str]], pool_texts: Sequence[str],
                 rng: random.Random, serial: int, answers: Mapping[str, Answer] | None = None
                 ) -> str:
    answered = _answered_call(req, answers)
    if answered is not None:
        name, arguments, result = answered
        content = result if result is not None else stand_in_result(name, arguments)
    else:
        tool = rng.choice(req.tools)
        name, arguments = tool["function"]["name"], _arguments(tool, rng)
        content = rng.choice(list(results.get(name) or pool_texts))
    call_id = f"call_{serial}"
    req.messages.append({"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function",
         "function": {"name": name, "arguments": json.dumps(arguments)}}]})
    req.messages.append({"role": "tool", "tool_call_id": call_id, "name": name,
                         "content": content})
    return name


def _edit_tools(req: Request, tool_pool: Sequence[Mapping[str, Any]], rng: random.Random) -> str:
    names = {t["function"]["name"] for t in req.tools}
    called = {c["function"]["name"] for m in req.messages for c in m.get("tool_calls") or ()}
    choice = rng.choice(("add", "remove", "shuffle"))
    removable = [t for t in req.tools if t["function"]["name"] not in called]
    if choice == "remove" and len(removable) > 1:
        gone = rng.choice(removable)
        req.tools.remove(gone)
        return f"removed {gone['function']['name']}"
    spare = [t for t in tool_pool if t["function"]["name"] not in names]
    if choice == "add" and spare:
        new = copy.deepcopy(rng.choice(spare))
        req.tools.insert(rng.randrange(len(req.tools) + 1), new)
        return f"added {new['function']['name']}"
    rng.shuffle(req.tools)
    return "shuffled"


def _delete_result(req: Request, rng: random.Random) -> str:
    tool_turns = [i for i, m in enumerate(req.messages) if m["role"] == "tool"]
    if not tool_turns:
        return ""
    index = rng.choice(tool_turns[:-1] or tool_turns)
    if rng.random() < 0.5:
        text = str(req.messages[index]["content"])
        req.messages[index]["content"] = f"[result truncated: {text[:80]} ...]"
        return f"truncated result at message {index}"
    del req.messages[index - 1:index + 1]  # the assistant call and its result
    return f"removed call and result at messages {index - 1}-{index}"


def _edit_user(req: Request, rng: random.Random) -> str:
    users = [i for i, m in enumerate(req.messages) if m["role"] == "user"]
    index = rng.choice(users[:-1] or users)
    text = str(req.messages[index]["content"])
    for old, new in REWORDINGS:
        if old in text:
            req.messages[index]["content"] = text.replace(old, new, 1)
            return f"reworded message {index}"
    req.messages[index]["content"] = "Please: " + text
    return f"reworded message {index}"


def _question(tools: Sequence[Mapping[str, Any]], questions: Mapping[str, Sequence[str]] | None,
              rng: random.Random) -> str:
    """A request for one of ``tools`` that ``questions`` holds some for, else a general one."""
    askable = [t["function"]["name"] for t in tools
               if questions and questions.get(t["function"]["name"])]
    if not askable:
        return rng.choice(QUESTIONS)
    return rng.choice(list(questions[rng.choice(askable)]))


def _first_tools(pool: Sequence[Mapping[str, Any]], count: int,
                 questions: Mapping[str, Sequence[str]] | None, rng: random.Random
                 ) -> list[Mapping[str, Any]]:
    """``count`` tools of ``pool`` at random; with ``questions``, one of them a tool it holds
    requests for (an agent is offered the tool it is asked about), at a random place."""
    askable = [t for t in pool if questions and questions.get(t["function"]["name"])]
    if not askable:
        return rng.sample(list(pool), count)
    asked = rng.choice(askable)
    tools = rng.sample([t for t in pool if t is not asked], count - 1)
    tools.insert(rng.randrange(count), asked)
    return tools


def make_trajectories(
    tool_pool: Sequence[Mapping[str, Any]],
    results: Mapping[str, Sequence[str]],
    n: int,
    requests: int,
    seed: int = 0,
    tools_per_trajectory: int | Sequence[int] = 6,
    first_appends: int = 2,
    questions: Mapping[str, Sequence[str]] | None = None,
    answers: Mapping[str, Answer] | None = None,
) -> list[Trajectory]:
    """``n`` trajectories of ``requests`` requests each (see the module docstring). The first
    ``first_appends`` edits are appends, so the conversation has depth before other edits.
    ``tools_per_trajectory`` may be a sequence, cycled over the trajectories (its depths);
    ``answers`` makes appends the calls the requests ask for (module docstring)."""
    counts = ([tools_per_trajectory] if isinstance(tools_per_trajectory, int)
              else list(tools_per_trajectory))
    if n < 1 or requests < 2 or len(tool_pool) < 2 or not counts or min(counts) < 1:
        raise ValueError("need n >= 1, requests >= 2, at least two tools and tool counts >= 1")
    pool_texts = [t for texts in results.values() for t in texts] or ["ok"]
    out = []
    for index in range(n):
        rng = random.Random(seed * 1_000_003 + index)
        count = min(counts[index % len(counts)], len(tool_pool))
        tools = [copy.deepcopy(t) for t in _first_tools(tool_pool, count, questions, rng)]
        first = Request([{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": _question(tools, questions, rng)}],
                        tools, "first")
        trajectory = Trajectory(index, [first])
        for step in range(1, requests):
            req = copy.deepcopy(trajectory.requests[-1])
            kind = "append" if step <= first_appends else EDIT_CLASSES[(step - first_appends)
                                                                       % len(EDIT_CLASSES)]
            done = []  # what changed, in order
            if kind == "append" or answers is not None:  # with answers, every turn is answered
                done.append("called " + _append_call(req, results, pool_texts, rng, step,
                                                     answers))
            if kind == "tools":
                done.append(_edit_tools(req, tool_pool, rng))
            elif kind == "delete":
                done.append(_delete_result(req, rng) or "nothing to delete")
            elif kind == "edit":
                done.append(_edit_user(req, rng))
            req.messages.append({"role": "user", "content": _question(req.tools, questions, rng)})
            req.edit, req.detail = kind, "; ".join(done)
            trajectory.requests.append(req)
        out.append(trajectory)
    return out
