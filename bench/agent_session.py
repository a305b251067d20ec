"""Live sessions on multi-turn tool-using trajectories: re-prefill, a prefix cache, and the
session's exact and repair policies on the same requests.

Contract: ``python bench/agent_session.py [--model M] [--n N] [--requests R] [--quick]``
replays ``N`` trajectories (``bench/tasks/trajectories.py``: appends, tool-list changes,
deleted or truncated tool results, edited messages) over the GitHub MCP tool definitions plus
the live ``mcp-server-time`` and ``mcp-server-git`` tools, whose results are real answers of
those servers on a temporary git repository. Each user turn asks for one of the tools its request
offers (the GitHub MCP queries, or a request for a live tool), so replies write calls to compare;
``--generic-questions`` asks the fixed general questions instead. An appended call is the one
the previous turn asked for (the query's gold arguments; a live tool's real result, a GitHub
tool's acknowledgement, :func:`~tasks.trajectories.stand_in_result`), so the conversation reads
as an agent's; ``--random-calls`` appends a random offered tool's call with made-up arguments
instead (the construction of the runs before 2026-12-03; ``calls`` in the JSON says which).
Arms, interleaved request by request (their order rotates):

- ``reprefill``: a fresh cache per request (our engine);
- ``prefix``: mlx-lm's own prompt cache and forward, reused up to the first differing token and
  trimmed there (what ``mlx_lm.server`` does);
- ``exact``: ``Session(policy="exact")`` (the same policy on our engine);
- ``repair-2`` / ``repair-5``: ``Session(policy="repair", budget=2 / 5)``, sharing one
  :class:`~nexus_mlx.agent.tool_blocks.ToolBlocks` harvested from their caches (a tool
  definition new to a session is spliced when an earlier trajectory computed it).
  ``--budgets 5,25,50`` names other budgets (one ``repair-<b>`` arm each) and ``--allocator``
  the repair allocator (default ``sur``): a fidelity-vs-budget sweep on the same requests.
  ``--guard G`` sets the repair arms' close-call guard (every stale row healed before a token
  whose top two logits are within ``G`` nats; the session's default
  :data:`~nexus_mlx.agent.session.DEFAULT_GUARD`, 0 turns it off): a step's guard counts in its
  TTFT, a decoding step's in ``decode_guard_ms`` (records: ``guarded`` and ``decode_guarded``
  rows).
- ``--arms`` runs a subset of the three baselines (e.g. ``prefix,exact`` for a cheaper probe:
  fidelity is then judged against ``exact``, whose output equals re-prefill's — a tested
  equivalence; the JSON's ``reference`` names the arm).

A repair arm's record also keeps each chosen token's top-2 logit margin (``margins``) and the
first token index where its reply leaves the reference's (``diverge``, None: identical): what
``bench/guard_sweep.py`` needs to replay any close-call guard threshold from a run without one
(``--guard 0``).

Per request and arm: TTFT (the step from the previous state to the first token's logits), tokens
computed, the session's path, then ``--decode`` greedy tokens from the live cache (kept there,
as a server keeps them), and on up to ``--call-tokens`` while the reply is an unfinished call
(tags, bare JSON or a fence), so the call can be compared. After its reply a session arm heals its stale rows
(:meth:`~nexus_mlx.agent.session.Session.heal`), as the server does while a session is idle:
that time is off the critical path and reported apart (``heal_ms``), not in TTFT;
``--no-idle-heal`` keeps the stale rows instead (they then heal by ``budget`` percent a step). Fidelity against re-prefill: first-token KL, first 16 greedy tokens
identical, and the first tool call identical (name and arguments; tagged, bare or fenced JSON
naming an offered tool), compared only where the reference or the arm wrote one: two text
replies are not a call comparison. ``calls_compared`` counts those requests and
``calls_identical`` is None where there were none.
JSON: ``summary[arm][edit_class] = {"ttft_ms", "speedup_vs_prefix", "ttft_plus_guard_ms",
"speedup_incl_guard", "agree16", "calls_identical", "calls_compared", "n"}`` (``_plus_guard``:
TTFT plus the guard's heals while decoding, the time the guard adds to a reply) for classes
``append``, ``tools``, ``delete``, ``edit`` (and ``deep``: the non-append classes at depth
>= 1,024 tokens), plus every request's record.

A trajectory ends before its first request whose prompt and reply (``--decode``, or
``--call-tokens`` for a call) would pass the model's ``max_position_embeddings``: a session
refuses such a prompt (our trim policy is the caller's, as an agent framework's is). The JSON's
``cut`` lists each such request (trajectory, request, depth) and ``context_room`` the longest
prompt that fit.

A long run may go in shards: trajectories are drawn per index (the same trajectory ``i`` for
any ``--n`` > ``i``), so ``--trajectories A:B`` runs indices ``A..B-1`` of the ``--n`` drawn, each
shard alone on the machine and every request's arms still interleaved within it; then
``--merge FILE ...`` (no model) joins shards of the same settings and disjoint trajectories into
one result (records in trajectory order, the summary recomputed over all of them, each shard's
machine listed under ``shards``) written under ``--tag``. The repair arms' compiled tool blocks
are shared within a process, so a shard starts with none: its first trajectories splice fewer
blocks than they would in one run of all of them.
"""

from __future__ import annotations

from common import (  # first: loads nexus_mlx + fast BLAS
    add_model_argument,
    add_tag_argument,
    arg_parser,
    emit,
    model_record,
    shared_data,
    tagged_name,
)

import functools
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache
from tasks.call_scoring import GoldCall, read_gold
from tasks.trajectories import EDIT_CLASSES, Answer, make_trajectories

from nexus_mlx import forward, load, make_cache
from nexus_mlx.agent.alignment import common_prefix
from nexus_mlx.agent.loop import openai_tool
from nexus_mlx.agent.mcp_server import McpServer, installed_server
from nexus_mlx.agent.cache_editor import PREFILL_CHUNK
from nexus_mlx.agent.session import DEFAULT_GUARD, SESSION_ALLOCATORS, Session
from nexus_mlx.agent.session_file import template_digest
from nexus_mlx.agent.tool_blocks import ToolBlocks
from nexus_mlx.decode.call_format import CALL_OPEN, ParsedCall, parse_tool_calls
from nexus_mlx.decode.prose_calls import intended_calls
from nexus_mlx.metrics import next_token_kl, top2_margin
from nexus_mlx.models.arch import model_plan
from routing_eval import GITHUB_QUERIES

BASE_ARMS = ("reprefill", "prefix", "exact")
DEFAULT_BUDGETS = (2.0, 5.0)
ARMS = (*BASE_ARMS, *(f"repair-{b:g}" for b in DEFAULT_BUDGETS))  # a default run's arms
DEEP = 1024
CALL_TOKENS = 96
CALL_STARTS = ("{", "```", CALL_OPEN)


# ---------------------------------------------------------------------------- tools and results

COMMIT_DATES = ("2025-03-14T01:12:00+00:00", "2025-03-14T04:37:00+00:00",
                "2025-03-14T06:48:00+00:00")  # fixed, far from any run's "now"


def _git_repository(root: Path) -> Path:
    """Three commits at :data:`COMMIT_DATES` and one modified file, so a run's git facts (and
    the time of the last commit) are the same on every machine and never equal "now"."""
    repo = root / "repo"
    repo.mkdir()

    def git(*args: str, date: str = "") -> None:
        dates = {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date} if date else {}
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                       env={"GIT_AUTHOR_NAME": "Ada", "GIT_AUTHOR_EMAIL": "ada@example.com",
                            "GIT_COMMITTER_NAME": "Ada", "GIT_COMMITTER_EMAIL": "ada@example.com",
                            "PATH": "/usr/bin:/bin", **dates})

    git("init", "-q", "-b", "main")
    for i, (name, text) in enumerate([("README.md", "# demo\n"), ("parser.py", "def parse():\n"),
                                      ("login.py", "def login(user):\n    return True\n")]):
        (repo / name).write_text(text * (i + 1))
        git("add", name)
        git("commit", "-q", "-m", f"Add {name}: the {['docs', 'parser', 'login flow'][i]}",
            date=COMMIT_DATES[i])
    (repo / "parser.py").write_text("def parse(text):\n    return text.split()\n")
    return repo


LIVE_CALLS: dict[str, list[dict[str, Any]]] = {  # each made once per run ("{repo}": the repository)
    "time.get_current_time": [{"timezone": z} for z in ("Asia/Tokyo", "UTC", "Europe/London")],
    "time.convert_time": [{"source_timezone": "America/New_York", "time": "14:30",
                           "target_timezone": "Europe/London"}],
    "git.git_log": [{"repo_path": "{repo}", "max_count": n} for n in (2, 3)],
    "git.git_status": [{"repo_path": "{repo}"}],
    "git.git_diff_unstaged": [{"repo_path": "{repo}"}],
}
LIVE_QUESTIONS = {  # tool -> (request, index of the LIVE_CALLS call that answers it)
    "time.get_current_time": (("What time is it in Tokyo right now?", 0),
                              ("What is the current time in UTC?", 1)),
    "time.convert_time": (("Convert 14:30 New York time to London time.", 0),),
    "git.git_log": (("Show me the three most recent commits of the repository at {repo}.", 1),),
    "git.git_status": (("Which files are modified in the working tree of {repo}?", 0),),
    "git.git_diff_unstaged": (("What are the unstaged changes in the repository at {repo}?",
                               0),),
}


def _for_repo(arguments: dict[str, Any], repo: Path) -> dict[str, Any]:
    return {k: v.format(repo=repo) if isinstance(v, str) else v for k, v in arguments.items()}


def live_tools(workdir: Path) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    """The live time and git tools and real results of each (``LIVE_CALLS``, in order), from
    the running servers on a fresh repository under ``workdir``."""
    repo = _git_repository(workdir)
    specs = [installed_server("mcp-server-time", "mcp_server_time", namespace="time"),
             installed_server("mcp-server-git", "mcp_server_git", "--repository", str(repo),
                              namespace="git")]
    tools: list[dict[str, Any]] = []
    results: dict[str, list[str]] = {}
    for spec in specs:
        with McpServer(spec) as server:
            for tool in server.list_tools():
                tools.append(openai_tool(tool))
                for arguments in LIVE_CALLS.get(tool.qualified_name, []):
                    answer = server.call_tool(tool.qualified_name, _for_repo(arguments, repo),
                                              timeout=30)
                    results.setdefault(tool.qualified_name, []).append(answer.text)
    return tools, results


def tool_questions(repo: Path) -> dict[str, list[str]]:
    """Requests each tool serves: the live tools' (about ``repo``) and the GitHub MCP queries'."""
    out = {name: [q.format(repo=repo) for q, _ in qs] for name, qs in LIVE_QUESTIONS.items()}
    for call in _github_gold():
        out.setdefault(call.tool, []).append(call.query)
    return out


def question_answers(repo: Path, results: dict[str, list[str]]) -> dict[str, Answer]:
    """The call each request of :func:`tool_questions` asks for: a live tool's with its real
    result (``results`` from :func:`live_tools`), a GitHub MCP query's gold call with none."""
    out: dict[str, Answer] = {}
    for name, asked in LIVE_QUESTIONS.items():
        for question, index in asked:
            answer = results.get(name, [])[index:index + 1]
            out[question.format(repo=repo)] = (name, _for_repo(LIVE_CALLS[name][index], repo),
                                               answer[0] if answer else None)
    for call in _github_gold():
        out[call.query] = (call.tool, dict(call.arguments), None)
    return out


@functools.cache
def _github_gold() -> tuple[GoldCall, ...]:
    """The GitHub MCP queries with their gold calls (read and checked once)."""
    return tuple(read_gold(GITHUB_QUERIES))


def github_tools(limit: int | None) -> list[dict[str, Any]]:
    data = json.loads(shared_data("github-mcp", "tools.json").read_text())
    rows = data["tools"] if isinstance(data, dict) else data
    return [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                              "parameters": t["inputSchema"]}}
            for t in rows[:limit]]


# ---------------------------------------------------------------------------- arms

class Reprefill:
    def __init__(self, model: Any) -> None:
        self.model = model
        self.cache = make_cache(model)

    def step(self, ids: np.ndarray) -> tuple[mx.array, int, str]:
        self.cache = make_cache(self.model)
        for start in range(0, ids.size, PREFILL_CHUNK):
            logits = forward(self.model, ids[start:start + PREFILL_CHUNK], self.cache,
                             logits="last")
        mx.eval(logits)
        return logits[0, -1], int(ids.size), "prefill"

    def decode(self, token: int) -> mx.array:
        out = forward(self.model, [token], self.cache, logits="last")[0, -1]
        mx.eval(out)
        return out


class PrefixCache:
    """mlx-lm's prompt cache and forward, reused to the first differing token."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.cache = make_prompt_cache(model)
        self.tokens: list[int] = []

    def step(self, ids: np.ndarray) -> tuple[mx.array, int, str]:
        keep = min(common_prefix(np.array(self.tokens, np.int64), ids), ids.size - 1)
        trim_prompt_cache(self.cache, len(self.tokens) - keep)
        rest = ids[keep:]
        for start in range(0, rest.size, PREFILL_CHUNK):
            chunk = mx.array(rest[start:start + PREFILL_CHUNK].astype(np.int32))[None]
            logits = self.model(chunk, cache=self.cache)
        mx.eval(logits)
        self.tokens = ids.tolist()
        return logits[0, -1].astype(mx.float32), int(rest.size), f"prefix {keep}"

    def decode(self, token: int) -> mx.array:
        out = self.model(mx.array([[token]]), cache=self.cache)[0, -1].astype(mx.float32)
        mx.eval(out)
        self.tokens.append(token)
        return out


class SessionArm:
    def __init__(self, session: Session) -> None:
        self.session = session

    def step(self, ids: np.ndarray) -> tuple[mx.array, int, str]:
        report = self.session.step_ids(ids)
        self.last = {"reason": report.reason, "repaired": report.repaired,
                     "stale": report.stale, "from_blocks": report.from_blocks,
                     "timings": report.timings, "guarded": report.guarded,
                     "decode_guarded": 0, "decode_guard_ms": 0.0}
        return (self.session.next_token_logits(), report.computed + report.repaired,
                report.path)

    def decode(self, token: int) -> mx.array:
        stale, start = self.session.stale_rows, time.perf_counter()
        logits = self.session.advance(token)
        if self.session.guard is not None and stale and not self.session.stale_rows:
            self.last["decode_guarded"] += stale  # healed by the guard before this token
            self.last["decode_guard_ms"] += (time.perf_counter() - start) * 1e3
        return logits

    def idle(self) -> dict[str, Any]:
        """Heal every stale row, as a server does between requests (off the critical path)."""
        start = time.perf_counter()
        healed = self.session.heal()
        return {"heal_ms": (time.perf_counter() - start) * 1e3, "healed": healed}


def make_arms(model: Any, tokenizer: Any, blocks: ToolBlocks | None,
              budgets: tuple[float, ...] = DEFAULT_BUDGETS, allocator: str = "sur",
              guard: float | None = None, base: tuple[str, ...] = BASE_ARMS) -> dict[str, Any]:
    makers: dict[str, Callable[[], Any]] = {
        "reprefill": lambda: Reprefill(model), "prefix": lambda: PrefixCache(model),
        "exact": lambda: SessionArm(Session(model, tokenizer, policy="exact"))}
    arms = {name: makers[name]() for name in base}
    for b in budgets:
        arms[f"repair-{b:g}"] = SessionArm(Session(model, tokenizer, budget=b, blocks=blocks,
                                                   allocator=allocator, guard=guard))
    return arms


def context_room(model: Any, decode: int, call_tokens: int) -> int | None:
    """The longest prompt whose reply (``decode`` tokens, up to ``call_tokens`` for a call)
    still fits the model's positions; None where the model names no limit."""
    limit = model_plan(model).max_position
    return None if limit is None else limit - max(decode, call_tokens)


def divergence(tokens: list[int], reference: list[int]) -> int | None:
    """The first index where ``tokens`` leave ``reference`` (None: identical)."""
    for index, (a, b) in enumerate(zip(tokens, reference, strict=False)):
        if a != b:
            return index
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


def first_call(text: str, names: list[str]) -> ParsedCall | None:
    """The first call ``text`` writes: tagged, or bare / fenced JSON naming an offered tool."""
    calls = parse_tool_calls(text, names).calls or intended_calls(text, names)
    return calls[0] if calls else None


def unfinished_call(text: str, names: list[str]) -> bool:
    """The reply opens a call (tags, bare JSON or a fence) that does not parse yet."""
    return text.lstrip().startswith(CALL_STARTS) and first_call(text, names) is None


def run_arm(arm: Any, ids: np.ndarray, decode: int, eos: set[int], idle_heal: bool,
            reply: Callable[[list[int]], bool] = lambda _: False, call_tokens: int = CALL_TOKENS
            ) -> dict[str, Any]:
    """One request on one arm: its step (timed), ``decode`` greedy tokens, and on to
    ``call_tokens`` while ``reply(tokens so far)`` says a call is unfinished."""
    start = time.perf_counter()
    logits, computed, path = arm.step(ids)
    ttft = (time.perf_counter() - start) * 1e3
    first = np.array(logits)
    tokens: list[int] = []
    margins: list[float] = []  # each chosen token's top-2 logit margin (what the guard reads)
    while len(tokens) < decode or (len(tokens) < call_tokens and reply(tokens)):
        token = int(mx.argmax(logits).item())
        tokens.append(token)
        margins.append(round(top2_margin(logits), 4))
        if token in eos:
            break
        logits = arm.decode(token)
    idle = arm.idle() if idle_heal and hasattr(arm, "idle") else {}
    return {"ttft_ms": ttft, "computed": computed, "path": path, "tokens": tokens,
            "margins": margins, "first_logits": first, **getattr(arm, "last", {}), **idle}


# ---------------------------------------------------------------------------- summary

def call_agreement(flags: list[bool | None]) -> dict[str, Any]:
    """``calls_identical`` over the requests where a call was written (None: not compared)."""
    compared = [bool(f) for f in flags if f is not None]
    return {"calls_identical": float(np.mean(compared)) if compared else None,
            "calls_compared": len(compared)}


def is_deep(record: dict[str, Any]) -> bool:
    """A non-append request at depth >= ``DEEP`` (the summary's ``deep`` class)."""
    return record["edit"] not in ("append", "first") and record["depth"] >= DEEP


def summarize(records: list[dict[str, Any]], arms: tuple[str, ...] = ARMS
              ) -> dict[str, dict[str, dict[str, float]]]:
    out: dict[str, dict[str, dict[str, float]]] = {}
    groups = {c: [r for r in records if r["edit"] == c] for c in EDIT_CLASSES}
    groups["deep"] = [r for r in records if is_deep(r)]
    for arm in arms:
        out[arm] = {}
        for name, rows in groups.items():
            if not rows:
                continue
            ttft = float(np.mean([r["arms"][arm]["ttft_ms"] for r in rows]))
            prefix = float(np.mean([r["arms"]["prefix"]["ttft_ms"] for r in rows])) \
                if "prefix" in rows[0]["arms"] else float("nan")
            with_heals = ttft + float(np.mean([r["arms"][arm].get("decode_guard_ms", 0.0)
                                               for r in rows]))
            out[arm][name] = {
                "ttft_ms": ttft, "speedup_vs_prefix": prefix / ttft if ttft else float("nan"),
                "ttft_plus_guard_ms": with_heals,
                "speedup_incl_guard": prefix / with_heals if with_heals else float("nan"),
                "agree16": float(np.mean([r["arms"][arm]["agree16"] for r in rows])),
                **call_agreement([r["arms"][arm].get("calls_identical") for r in rows]),
                "kl": float(np.mean([r["arms"][arm]["kl"] for r in rows])),
                "computed": float(np.mean([r["arms"][arm]["computed"] for r in rows])),
                "heal_ms": float(np.mean([r["arms"][arm].get("heal_ms", 0.0) for r in rows])),
                "guarded": float(np.mean([bool(r["arms"][arm].get("guarded")
                                               or r["arms"][arm].get("decode_guarded"))
                                          for r in rows])),
                "n": len(rows)}
    return out


def draw(summary: dict[str, Any], name: str, quick: bool) -> None:
    import plots

    first = next(iter(summary.values()))
    classes = [c for c in (*EDIT_CLASSES, "deep") if c in first]
    fig, (ax_t, ax_a) = plots.figure(2, width=11)
    width = 0.8 / len(summary)
    for i, arm in enumerate(summary):
        xs = np.arange(len(classes)) + i * width
        ax_t.bar(xs, [summary[arm][c]["ttft_ms"] for c in classes], width, label=arm)
        ax_a.bar(xs, [summary[arm][c]["agree16"] for c in classes], width, label=arm)
    for ax, label in ((ax_t, "mean TTFT (ms)"), (ax_a, "first 16 greedy tokens = re-prefill")):
        ax.set_xticks(np.arange(len(classes)) + 0.4 - width / 2, classes)
        ax.set_ylabel(label)
    ax_t.set_title("Time to first token by edit class")
    ax_a.set_title("Fidelity against re-prefill")
    ax_t.legend()
    plots.save(fig, name, quick)


SHARD_SETTINGS = ("model", "n_trajectories", "requests", "tools_per_trajectory", "idle_heal",
                  "tool_blocks", "decode_tokens", "call_tokens", "questions", "budgets",
                  "allocator", "seed", "calls", "guard", "arms")  # shards must share these


def trajectory_range(text: str, n: int) -> tuple[int, int]:
    """``"A:B"`` (either end may be omitted) as a range of trajectory indices within ``n``."""
    first, sep, last = text.partition(":")
    try:
        a, b = int(first or 0), int(last or n) if sep else int(first) + 1
    except ValueError:
        raise SystemExit(f"--trajectories wants A:B, got {text!r}") from None
    if not 0 <= a < b <= n:
        raise SystemExit(f"--trajectories {text}: need 0 <= A < B <= --n ({n})")
    return a, b


def merge_shards(shards: list[dict[str, Any]]) -> dict[str, Any]:
    """One result payload from shard payloads of the same settings and disjoint trajectories
    (see the module docstring); raises ValueError naming what differs or overlaps."""
    if not shards:
        raise ValueError("nothing to merge")
    base = shards[0]
    for shard in shards[1:]:
        differ = [k for k in SHARD_SETTINGS if shard.get(k) != base.get(k)]
        if differ:
            raise ValueError(f"shards differ in {', '.join(differ)}")
    seen: dict[int, int] = {}
    for number, shard in enumerate(shards):
        for index in {r["trajectory"] for r in shard["records"]}:
            if index in seen:
                raise ValueError(f"trajectory {index} is in shards {seen[index]} and {number}")
            seen[index] = number
    records = sorted((r for shard in shards for r in shard["records"]),
                     key=lambda r: (r["trajectory"], r["request"]))
    arms = tuple(records[0]["arms"])
    return {**{k: base[k] for k in ("model", "model_info", "reference", *SHARD_SETTINGS)
               if k in base},
            "trajectories": sorted(seen),
            "depths": [min(r["depth"] for r in records), max(r["depth"] for r in records)],
            "cut": sorted((c for shard in shards for c in shard.get("cut", [])),
                          key=lambda c: c["trajectory"]),
            "shards": [{"trajectories": sorted({r["trajectory"] for r in shard["records"]}),
                        "machine": shard.get("machine")} for shard in shards],
            "summary": summarize([r for r in records if r["request"] > 0], arms),
            "records": records}


def merge_main(files: list[str], tag: str) -> None:
    payload = merge_shards([json.loads(Path(f).read_text()) for f in files])
    name = "agent_session" + (f"_{tag}" if tag else "")
    emit(name, payload, False)
    draw(payload["summary"], name, False)


def main() -> None:
    parser = arg_parser(__doc__.splitlines()[0] if __doc__ else "")
    add_model_argument(parser)
    parser.add_argument("--n", type=int, default=20, help="trajectories")
    parser.add_argument("--requests", type=int, default=8, help="requests per trajectory")
    parser.add_argument("--tools", default="3,6,12,20",
                        help="tools offered per trajectory, cycled (sets the depths)")
    parser.add_argument("--decode", type=int, default=24, help="greedy tokens per request")
    parser.add_argument("--call-tokens", type=int, default=CALL_TOKENS,
                        help="decode on to this many tokens while the reply is an unfinished call")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--random-calls", action="store_true",
                        help="appended calls go to a random offered tool with made-up arguments "
                             "(the runs before 2026-12-03), not to the tool the request asked for")
    parser.add_argument("--generic-questions", action="store_true",
                        help="user turns ask general questions, not requests for an offered tool "
                             "(the runs before 2026-12-02)")
    add_tag_argument(parser)
    parser.add_argument("--no-blocks", action="store_true",
                        help="repair arms do not splice compiled tool blocks")
    parser.add_argument("--no-idle-heal", action="store_true",
                        help="keep stale rows between requests (no healing while idle)")
    parser.add_argument("--budgets", default=",".join(f"{b:g}" for b in DEFAULT_BUDGETS),
                        help="repair budgets in percent, one repair-<b> arm each")
    parser.add_argument("--allocator", default="sur", choices=SESSION_ALLOCATORS,
                        help="the repair arms' allocator")
    parser.add_argument("--guard", type=float, default=DEFAULT_GUARD, metavar="NATS",
                        help="the repair arms' close-call guard (Session(guard=...); 0: off; "
                             f"default {DEFAULT_GUARD})")
    parser.add_argument("--arms", default=",".join(BASE_ARMS),
                        help="the baseline arms to run besides the repair arms (a subset of "
                             f"{','.join(BASE_ARMS)}; the reference is reprefill, else exact)")
    parser.add_argument("--trajectories", default=None, metavar="A:B",
                        help="run only trajectories A..B-1 of the --n drawn (a shard)")
    parser.add_argument("--merge", nargs="+", metavar="FILE", default=None,
                        help="join shard results (no model run) into results/agent_session"
                             "[_TAG].json")
    args = parser.parse_args()
    if args.merge:
        merge_main(args.merge, args.tag)
        return
    budgets = tuple(float(b) for b in str(args.budgets).split(","))
    base = tuple(a for a in BASE_ARMS if a in str(args.arms).split(","))
    if set(str(args.arms).split(",")) - set(BASE_ARMS) or not {"reprefill", "exact"} & set(base):
        parser.error(f"--arms takes a subset of {','.join(BASE_ARMS)} holding reprefill or exact")
    arm_names = (*base, *(f"repair-{b:g}" for b in budgets))
    reference = "reprefill" if "reprefill" in base else "exact"
    if not 0 <= args.guard < float("inf"):
        parser.error(f"--guard takes a number of nats >= 0 (0: off), got {args.guard}")
    args.guard = args.guard or None  # recorded as None when off (what guard_sweep replays)
    if args.quick:
        args.n, args.requests, args.tools, args.decode = 1, 6, "3", 16
    tool_counts = [int(x) for x in str(args.tools).split(",")]
    model, tokenizer = load(args.model)
    with tempfile.TemporaryDirectory(prefix="nexus-bench-") as tmp:
        live, results = live_tools(Path(tmp))
        questions = None if args.generic_questions else tool_questions(Path(tmp) / "repo")
        answers = (None if args.generic_questions or args.random_calls
                   else question_answers(Path(tmp) / "repo", results))
    pool = live + github_tools(None if not args.quick else 12)
    trajectories = make_trajectories(pool, results, args.n, args.requests, args.seed,
                                     tool_counts, questions=questions, answers=answers)
    span = trajectory_range(args.trajectories, args.n) if args.trajectories else (0, args.n)
    trajectories = trajectories[span[0]:span[1]]
    render = Session(model, tokenizer)
    eos = set(render.eos_token_ids)
    # the repair arms share compiled tool blocks across trajectories, harvested from their caches
    blocks = (None if args.no_blocks else
              ToolBlocks(model, render.render, template_digest(tokenizer)))
    records: list[dict[str, Any]] = []
    cut: list[dict[str, int]] = []
    room = context_room(model, args.decode, args.call_tokens)
    for trajectory in trajectories:
        arms = make_arms(model, tokenizer, blocks, budgets, args.allocator, args.guard, base)
        for r, request in enumerate(trajectory.requests):
            ids = np.array(render.render(request.messages, request.tools), np.int64)
            if room is not None and ids.size > room:  # the trajectory ends where it cannot fit
                cut.append({"trajectory": trajectory.index, "request": r, "depth": int(ids.size)})
                print(f"traj {trajectory.index} ends before req {r}: depth {ids.size} + reply "
                      f"passes the model's context (room {room})", flush=True)
                break
            order = arm_names[r % len(arm_names):] + arm_names[: r % len(arm_names)]
            names = [tool["function"]["name"] for tool in request.tools]

            def reply(tokens: list[int], names: list[str] = names) -> bool:
                return unfinished_call(tokenizer.decode(tokens), names)

            runs = {name: run_arm(arms[name], ids, args.decode, eos, not args.no_idle_heal,
                                  reply, args.call_tokens)
                    for name in order}
            ref = runs[reference]
            calls = {name: first_call(tokenizer.decode(run["tokens"]), names)
                     for name, run in runs.items()}
            row = {"trajectory": trajectory.index, "request": r, "edit": request.edit,
                   "detail": request.detail, "depth": int(ids.size),
                   "load": os.getloadavg()[0], "arms": {}}
            for name, run in runs.items():
                extra = {k: run[k] for k in ("reason", "repaired", "stale", "from_blocks",
                                             "timings", "heal_ms", "healed", "guarded",
                                             "decode_guarded", "decode_guard_ms") if k in run}
                row["arms"][name] = {
                    **extra,
                    "ttft_ms": run["ttft_ms"], "computed": run["computed"], "path": run["path"],
                    "kl": next_token_kl(ref["first_logits"], run["first_logits"]),
                    "agree16": run["tokens"][:16] == ref["tokens"][:16],
                    "call": None if calls[name] is None else [calls[name].name,
                                                              calls[name].arguments],
                    "calls_identical": None if calls[name] is None and calls[reference] is None
                    else calls[name] == calls[reference]}
                if name.startswith("repair-"):  # what a guard sweep needs (bench/guard_sweep.py)
                    row["arms"][name].update(margins=run["margins"],
                                             diverge=divergence(run["tokens"], ref["tokens"]))
            records.append(row)
            print(f"traj {trajectory.index} req {r} {request.edit:>6} depth {ids.size:>5}: " +
                  "  ".join(f"{a} {row['arms'][a]['ttft_ms']:.0f}ms" for a in arm_names),
                  flush=True)
    first = [r for r in records if r["request"] > 0]
    summary = summarize(first, arm_names)
    name = tagged_name("agent_session", args.tag)
    emit(name, {**model_record(args.model, model), "n_trajectories": args.n,
                "trajectories": list(range(*span)), "seed": args.seed, "requests": args.requests,
                "tools_per_trajectory": tool_counts,
                "idle_heal": not args.no_idle_heal, "tool_blocks": not args.no_blocks, "decode_tokens": args.decode,
                "call_tokens": args.call_tokens,
                "questions": "generic" if args.generic_questions else "offered tools",
                "calls": "random" if answers is None else "answered",
                "budgets": list(budgets), "allocator": args.allocator, "guard": args.guard,
                "arms": list(arm_names), "reference": reference,
                "depths": [min(r["depth"] for r in records), max(r["depth"] for r in records)],
                "context_room": room, "cut": cut,
                "summary": summary, "records": records}, args.quick)
    draw(summary, name, args.quick)


if __name__ == "__main__":
    main()
