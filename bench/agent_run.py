"""Multi-step agent requests answered over the live time and git MCP servers, checked against
the servers' own facts.

Contract: ``python bench/agent_run.py [--model M] [--only I,J] [--trials T] [--max-requests K]
[--system TEXT] [--tool-choice C] [--policy P] [--answer-prompt TEXT] [--review 0|1]
[--approve all|read-only] [--tag T] [--quick]``
starts ``mcp-server-time`` and ``mcp-server-git`` (on a temporary repository with three commits
and one modified file), then asks one conversation a list of requests (``--only``: those
indices, in that order; ``--max-requests``: the exchanges it keeps, as ``Agent``'s option)
through the agent loop
(:func:`~nexus_mlx.agent.loop.run_agent`, the loop ``Agent.run`` drives; every live tool is
shown, so no routing): each step generates in the model's own call format over one live
:class:`~nexus_mlx.agent.session.Session`, executes the calls on the servers and appends the
results, until the model answers in text. Each answer is checked against facts computed here,
independently of the model: the last commit's subject, the repository's modified file (and no
other of its files), the three commit subjects, the time in Tokyo (at the last commit, which is
dated long before the run, within two minutes; now, any minute from two before the request to
two after its answer; in London too), and time-zone conversions (computed for today's date).
Requests 0 and 5-7 have two parts each (0: the second needs the first's result; 5-7: each part
its own tool). ``--review 0|1``: the loop's completeness review off or on
(:mod:`~nexus_mlx.agent.review`). ``--approve read-only``: only calls to tools that
declare themselves read-only run (:data:`~nexus_mlx.agent.approval.READ_ONLY`; default: all).
The JSON records every request's calls
(name, arguments, the server's verdict), answer, checks, the loop's retries and reviews
(``regenerated``), steps and timings.
``--trials`` repeats the conversation over a new repository each time: its path is in the
requests, and a small model's choices change with such details, so one conversation is a noisy
sample. The final line has ``correct`` (requests whose every check passed), ``tools_ok``
(requests where, for each part, a tool that answers it ran and its server accepted the call:
whether the agent did the work, however its answer then reads), ``n`` and
``correct_per_trial``.
"""

from __future__ import annotations

from common import ( # first: nexus_mlx + BLAS
    add_model_argument,
    add_tag_argument,
    arg_parser,
    emit,
    model_record,
    tagged_name,
)

import datetime
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from agent_session import _git_repository

from nexus_mlx import load
from nexus_mlx.agent.approval import READ_ONLY
from nexus_mlx.agent.loop import DEFAULT_ANSWER_PROMPT, AgentRun, last_exchanges, run_agent
from nexus_mlx.agent.mcp_server import McpServer, installed_server
from nexus_mlx.agent.session import Session
from nexus_mlx.tools.registry import ToolRegistry

TOKYO = ZoneInfo("Asia/Tokyo")
# the tools that answer each part of a request (any one of a group, succeeding, counts)
LOG = ("git.git_log", "git.git_show")
NOW = ("time.get_current_time",)
CONVERT = ("time.convert_time",)
CHANGES = ("git.git_status", "git.git_diff_unstaged", "git.git_diff")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


def _clock_times(moment: datetime.datetime, until: datetime.datetime | None = None) -> set[str]:
    """24-hour ``HH:MM`` strings from two minutes before ``moment`` to two minutes after
    ``until`` (default ``moment``)."""
    out = set()
    t, last = moment - datetime.timedelta(minutes=2), (until or moment) + datetime.timedelta(
        minutes=2)
    while t <= last:
        out.add(t.strftime("%H:%M"))
        t += datetime.timedelta(minutes=1)
    return out


_CLOCK = re.compile(r"(?<![\d:])(\d{1,2}):(\d{2})(?::\d{2})?(?:\s*([ap])\.?\s?m\b\.?)?",
                    re.IGNORECASE)


def _stated_times(answer: str) -> set[str]:
    """The 24-hour ``HH:MM`` times ``answer`` may mean: one per time marked AM or PM
    (``6:16 PM`` is 18:16 only), both readings of an unmarked one of 1-12 hours written without
    a leading zero (``5:01`` is 05:01 or 17:01), as written otherwise (``05:01``, ``17:01``).
    A time must not follow a digit or a colon, so a time inside an ISO 8601 datetime
    (``2026-12-02T05:00:05+09:00``) counts and its ``MM:SS`` does not."""
    out = set()
    for hours, minutes, marker in _CLOCK.findall(answer):
        hour = int(hours)
        if marker and 1 <= hour <= 12:
            out.add(f"{hour % 12 + (12 if marker.lower() == 'p' else 0):02d}:{minutes}")
        elif 1 <= hour <= 12 and not hours.startswith("0"):
            out |= {f"{hour % 12:02d}:{minutes}", f"{hour % 12 + 12:02d}:{minutes}"}
        else:
            out.add(f"{hour:02d}:{minutes}")
    return out


def _has_time(answer: str, moment: datetime.datetime,
              until: datetime.datetime | None = None) -> bool:
    """Whether ``answer`` states ``moment``'s clock time (from ``moment`` to ``until``, two
    minutes either side; :func:`_stated_times`)."""
    return bool(_stated_times(answer) & _clock_times(moment, until))


def _converted(clock: str, source: str, target: str) -> set[str]:
    """``clock`` (``HH:MM``) today in zone ``source``, in zone ``target``: 24- and 12-hour
    forms (what mcp-server-time's convert_time computes, for today's date)."""
    hour, minute = (int(x) for x in clock.split(":"))
    moment = datetime.datetime.now(ZoneInfo(source)).replace(hour=hour, minute=minute, second=0,
                                                             microsecond=0)
    there = moment.astimezone(ZoneInfo(target))
    return {there.strftime("%H:%M"), there.strftime("%I:%M").lstrip("0")}


def requests_and_checks(repo: Path) -> list[tuple[str, dict[str, Any]]]:
    """The requests and, for each, what its answer must contain (computed from the repo)."""
    subjects = _git(repo, "log", "-3", "--format=%s").splitlines()
    committed = datetime.datetime.fromtimestamp(int(_git(repo, "log", "-1", "--format=%ct")),
                                                TOKYO)
    last_file = subjects[0].split(":")[0].removeprefix("Add ").strip()
    modified = _git(repo, "diff", "--name-only").splitlines()
    unmodified = sorted(set(_git(repo, "ls-files").splitlines()) - set(modified))
    return [
        (f"What changed in the last commit of the git repository at {repo}, and what time was "
         "that in Tokyo?", {"contains": [last_file], "tokyo_time_at": committed,
                               "tools": [LOG, CONVERT]}),
        ("What time is it in Tokyo right now?", {"now_in": "Asia/Tokyo", "tools": [NOW]}),
        (f"Which files are modified but not committed in the repository at {repo}?",
         {"contains": modified, "excludes": unmodified, "tools": [CHANGES]}),
        (f"Show me the three most recent commit messages of the repository at {repo}.",
         {"contains": [s.split(":")[0].removeprefix("Add ").strip() for s in subjects],
          "tools": [LOG]}),
        ("Convert 14:30 in America/New_York to Europe/London time.",
         {"contains_any": ["19:30", "7:30"], "tools": [CONVERT]}),
        # two independent parts, each its own tool
        (f"What changed in the last commit of the repository at {repo}, and what time is it in "
         "Tokyo right now?",
         {"contains": [last_file], "now_in": "Asia/Tokyo", "tools": [LOG, NOW]}),
        ("Convert 18:30 in Europe/Berlin to America/Los_Angeles time, and tell me the current "
         "time in Tokyo.", {"contains_any": sorted(_converted("18:30", "Europe/Berlin",
                                                              "America/Los_Angeles")),
                            "now_in": "Asia/Tokyo", "tools": [CONVERT, NOW]}),
        (f"What is the status of the repository at {repo}, and what time is it in London right "
         "now?", {"contains": modified, "now_in": "Europe/London", "tools": [CHANGES, NOW]}),
    ]


def check(answer: str, expect: dict[str, Any], asked_at: datetime.datetime,
          answered_at: datetime.datetime | None = None) -> dict[str, bool]:
    """Each fact ``expect`` names, found in ``answer`` or not. "Now" is any minute from the
    request to its answer (a slow model's tool call runs well after the request)."""
    text = answer.lower()
    out: dict[str, bool] = {}
    for needle in expect.get("contains", []):
        out[f"mentions {needle}"] = needle.lower() in text
    for needle in expect.get("excludes", []):
        out[f"does not name {needle}"] = needle.lower() not in text
    if "contains_any" in expect:
        out["mentions " + " or ".join(expect["contains_any"])] = any(
            n in text for n in expect["contains_any"])
    if "tokyo_time_at" in expect:
        out["Tokyo time at the commit"] = _has_time(answer, expect["tokyo_time_at"])
    if "now_in" in expect:
        zone = ZoneInfo(expect["now_in"])
        out[f"{expect['now_in']} time now"] = _has_time(answer, asked_at.astimezone(zone),
                                                       (answered_at or asked_at).astimezone(zone))
    return out


def tools_called(run: AgentRun, groups: list[tuple[str, ...]]) -> bool:
    """Whether, for every part of the request, one of its tools ran and its server accepted
    the call (the run's calls, however its answer reads)."""
    ran = {e.name for e in run.executions if e.ok}
    return all(ran & set(group) for group in groups)


def _record(request: str, run: AgentRun, checks: dict[str, bool], tools_ok: bool,
            seconds: float, trial: int) -> dict[str, Any]:
    return {"trial": trial, "request": request, "answer": run.answer, "finish": run.finish,
            "calls": [{"name": e.name, "arguments": e.arguments, "ok": e.ok,
                       "approved": e.approved, "output": e.output[:300]}
                      for e in run.executions],
            "checks": checks, "correct": run.finish == "answer" and all(checks.values()),
            "tools_ok": tools_ok,
            "regenerated": run.regenerated,
            "steps": [{"path": s.path, "prompt_tokens": s.prompt_tokens, "reused": s.reused,
                       "spliced": s.spliced, "repaired": s.repaired, "computed": s.computed,
                       "seconds": s.timings.get("total")} for s in run.steps],
            "seconds": seconds}


def conversation(model: Any, tokenizer: Any, args: Any, trial: int) -> list[dict[str, Any]]:
    """One conversation over a new repository (a new path each trial) and new servers: every
    request asked in turn, each answer checked."""
    with tempfile.TemporaryDirectory(prefix="nexus-agent-run-") as tmp:
        repo = _git_repository(Path(tmp))
        specs = {"time": installed_server("mcp-server-time", "mcp_server_time", namespace="time"),
                 "git": installed_server("mcp-server-git", "mcp_server_git", "--repository",
                                         str(repo), namespace="git")}
        servers = {name: McpServer(spec) for name, spec in specs.items()}
        try:
            for server in servers.values():
                server.start()
            registry = ToolRegistry([t for s in servers.values() for t in s.list_tools()])
            items = requests_and_checks(repo)
            if args.only:
                items = [items[int(i)] for i in str(args.only).split(",")]
            session = Session(model, tokenizer, policy=args.policy)
            history: list[dict[str, Any]] = (
                [{"role": "system", "content": args.system}] if args.system else [])
            records = []
            for request, expect in items[: 2 if args.quick else None]:
                asked_at = datetime.datetime.now(datetime.timezone.utc)
                start = time.perf_counter()
                if args.max_requests is not None:
                    history = last_exchanges(history, args.max_requests - 1)
                run = run_agent(session, history, request, registry, servers,
                                tool_choice=args.tool_choice, max_steps=args.max_steps,
                                max_tokens=args.max_tokens, answer_prompt=args.answer_prompt,
                                review=bool(args.review),
                                approve=READ_ONLY if args.approve == "read-only" else None)
                seconds = time.perf_counter() - start
                history = run.messages
                checks = check(run.answer, expect, asked_at,
                               datetime.datetime.now(datetime.timezone.utc))
                records.append(_record(request, run, checks,
                                       tools_called(run, expect.get("tools", [])), seconds, trial))
                print(f"[{trial}] {request!r}\n  calls: "
                      f"{[(e.name, e.arguments, e.ok) for e in run.executions]}"
                      f"\n  answer: {run.answer.strip()[:300]!r}\n  checks: {checks} "
                      f"({seconds:.0f} s)", flush=True)
            return records
        finally:
            for server in servers.values():
                server.close()


def main() -> None:
    parser = arg_parser(__doc__.splitlines()[0] if __doc__ else "")
    add_model_argument(parser, default="qwen2.5-coder-0.5b")
    parser.add_argument("--max-steps", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--no-answer-prompt", action="store_true",
                        help="show no answer prompt after tool results (the loop's default "
                             "asks for the answer in words)")
    parser.add_argument("--answer-prompt", default=DEFAULT_ANSWER_PROMPT,
                        help="the loop's answer prompt shown after tool results")
    parser.add_argument("--only", default="",
                        help="comma-separated request indices to ask (default: all, in order)")
    parser.add_argument("--system", default=None,
                        help="a system prompt opening the conversation (default: none)")
    parser.add_argument("--tool-choice", default="auto",
                        help="the first step's tool_choice: auto, required or none (later steps "
                             "are auto)")
    parser.add_argument("--policy", default="repair", choices=("repair", "exact"),
                        help="the live session's fidelity policy")
    parser.add_argument("--max-requests", type=int, default=None,
                        help="exchanges the conversation keeps, this one included (Agent's "
                             "max_requests; default: all)")
    parser.add_argument("--review", type=int, default=1, choices=(0, 1),
                        help="the completeness review (run_agent's review): 1 on, 0 off")
    parser.add_argument("--approve", default="all", choices=("all", "read-only"),
                        help="which calls run: every one, or only read-only tools' (READ_ONLY)")
    parser.add_argument("--trials", type=int, default=1,
                        help="conversations, each over a new repository at a new path")
    add_tag_argument(parser)
    args = parser.parse_args()
    if args.no_answer_prompt:
        args.answer_prompt = None
    model, tokenizer = load(args.model)
    conversations = [conversation(model, tokenizer, args, trial)
                     for trial in range(1 if args.quick else args.trials)]
    records = [r for c in conversations for r in c]
    per_trial = [sum(r["correct"] for r in c) for c in conversations]
    name = tagged_name("agent_run", args.tag)
    emit(name, {**model_record(args.model, model), "answer_prompt": args.answer_prompt,
                "system": args.system, "tool_choice": args.tool_choice, "policy": args.policy,
                "max_requests": args.max_requests, "review": args.review,
                "approve": args.approve,
                "trials": len(per_trial), "records": records,
                "correct_per_trial": per_trial,
                "correct": sum(r["correct"] for r in records),
                "tools_ok": sum(r["tools_ok"] for r in records), "n": len(records)}, args.quick)


if __name__ == "__main__":
    main()
