"""Session replies with the constraint's forced ids fed in one pass against one id per pass.

Contract: ``python bench/forced_runs.py [--model M] [--trials T] [--tag T] [--quick]`` times
``Session.generate`` on agent-shaped turns (:data:`TURNS`: a required call, a named call, an
``auto`` turn over tools, a JSON reply under a ``response_format``) with
:data:`~nexus_mlx.agent.session_decode.FEED_FORCED_RUNS` on and off. Each trial and arm takes a
fresh session, steps it to the turn's prompt (untimed), then times the reply alone (wall clock
of ``generate``, whose step then reuses every row); arms alternate their order trial by trial.
Before any timing both arms' replies are compared: ``same`` says per turn whether their calls
and text agree (the grammar's forced ids are its canonical tokenization, which a model choosing
id by id may not always take). Per turn: median ms of each arm, the paired ratio off / on (> 1:
one pass per forced run is faster) with its bootstrap CI, forward passes and ids of each arm.
Final JSON line: ``{"turns": {name: {...}}, "overall": {"ratio", "ratio_ci"}, "model", ...}``
(``overall``: the ratio of the summed per-trial times); PNG beside it. ``--quick``: 2 trials.
"""

from __future__ import annotations

from common import (
    add_model_argument,
    add_tag_argument,
    arg_parser,
    emit,
    median_ci,
    model_record,
    paired_ratio_ci,
    tagged_name,
)

import os
import time
from typing import Any

import plots

import nexus_mlx.agent.session_decode as session_decode
from nexus_mlx import load
from nexus_mlx.agent.session import Session

TIME_TOOL = {"type": "function", "function": {
    "name": "get_current_time", "description": "Get the current time in an IANA timezone",
    "parameters": {"type": "object", "properties": {"timezone": {
        "type": "string", "description": "IANA timezone name, e.g. 'Europe/London'"}},
        "required": ["timezone"]}}}
LOG_TOOL = {"type": "function", "function": {
    "name": "git_log", "description": "Show the commit log of a git repository",
    "parameters": {"type": "object", "properties": {
        "repo_path": {"type": "string", "description": "Path to the repository"},
        "max_count": {"type": "integer", "description": "How many commits"}},
        "required": ["repo_path"]}}}
TOOLS = [TIME_TOOL, LOG_TOOL]
CITY = {"type": "json_schema", "json_schema": {"schema": {
    "type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
    "required": ["city", "country"]}}}
TURNS: dict[str, dict[str, Any]] = {
    "required": {"ask": "What time is it in Tokyo?", "tools": TOOLS, "tool_choice": "required"},
    "named": {"ask": "Show the last three commits of the repository at /srv/app.",
              "tools": TOOLS,
              "tool_choice": {"type": "function", "function": {"name": "git_log"}}},
    "auto": {"ask": "Use a tool: what time is it in Europe/Paris right now?", "tools": TOOLS,
             "tool_choice": "auto"},
    "json": {"ask": "Which city is the Eiffel Tower in? Answer as JSON.", "tools": None,
             "response_format": CITY},
}
MAX_TOKENS = 64


def reply(model: Any, tokenizer: Any, turn: dict[str, Any], runs: bool) -> tuple[Any, float]:
    """One reply (fresh session, prompt stepped first) and its wall-clock milliseconds."""
    session_decode.FEED_FORCED_RUNS = runs
    messages = [{"role": "user", "content": turn["ask"]}]
    session = Session(model, tokenizer)
    session.step(messages, turn["tools"])
    start = time.perf_counter()
    out = session.generate(messages, turn["tools"], max_tokens=MAX_TOKENS,
                           tool_choice=turn.get("tool_choice", "auto"),
                           response_format=turn.get("response_format"),
                           parallel_tool_calls=False)
    return out, (time.perf_counter() - start) * 1e3


def measure(model: Any, tokenizer: Any, turn: dict[str, Any], trials: int) -> dict[str, Any]:
    (on, _), (off, _) = reply(model, tokenizer, turn, True), reply(model, tokenizer, turn, False)
    times: dict[str, list[float]] = {"on": [], "off": []}
    for trial in range(trials):
        for arm in ("on", "off") if trial % 2 == 0 else ("off", "on"):
            times[arm].append(reply(model, tokenizer, turn, arm == "on")[1])
    ratio, lo, hi = paired_ratio_ci(times["off"], times["on"])
    return {"same": (on.tool_calls, on.content) == (off.tool_calls, off.content),
            "text_on": on.text, "text_off": off.text,
            "on_ms": median_ci(times["on"])[0], "off_ms": median_ci(times["off"])[0],
            "ratio": ratio, "ratio_ci": [lo, hi],
            "passes_on": on.drafts.passes, "passes_off": off.drafts.passes,
            "ids_on": len(on.tokens), "ids_off": len(off.tokens), "trials_ms": times}


def main() -> None:
    parser = arg_parser(__doc__.splitlines()[0])
    add_model_argument(parser, default="qwen2.5-coder-0.5b")
    parser.add_argument("--trials", type=int, default=None)
    add_tag_argument(parser)
    args = parser.parse_args()
    name = tagged_name("forced_runs", args.tag)
    trials = args.trials or (2 if args.quick else 6)
    started, load_start = time.perf_counter(), os.getloadavg()
    model, tokenizer = load(args.model)
    turns = {}
    for turn_name, turn in TURNS.items():
        turns[turn_name] = measure(model, tokenizer, turn, trials)
        print(f"{turn_name}: {turns[turn_name]['ratio']:.2f}x, passes "
              f"{turns[turn_name]['passes_off']} -> {turns[turn_name]['passes_on']}", flush=True)
    session_decode.FEED_FORCED_RUNS = True
    total = {arm: [sum(t["trials_ms"][arm][i] for t in turns.values()) for i in range(trials)]
             for arm in ("on", "off")}
    ratio, lo, hi = paired_ratio_ci(total["off"], total["on"])
    plots.ratio_bars(turns, "one id per pass / forced runs fed together (median ratio)",
                     "session replies: forced ids in one pass", name, args.quick)
    emit(name, {**model_record(args.model, model), "turns": turns,
                "overall": {"ratio": ratio, "ratio_ci": [lo, hi]}, "trials": trials,
                "max_tokens": MAX_TOKENS, "seconds": time.perf_counter() - started,
                "loadavg": {"start": list(load_start), "end": list(os.getloadavg())}},
         args.quick)


if __name__ == "__main__":
    main()
