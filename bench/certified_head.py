"""Greedy decoding with the certified head against the full output projection, per model.

Contract: ``python bench/certified_head.py [--model M] [--tag T] [--quick]`` runs three views of
:mod:`nexus_mlx.decode.certified_head` on chat prompts (:data:`PROMPTS`), each arm against the
same thing with the full projection, interleaved trial by trial (the order alternates):

- ``head``: one step over the last-layer states of a real greedy decode of each prompt:
  ``CertifiedHead.top`` (its full-projection fallback included where it refuses) against
  ``lm_head`` and its argmax; the certified share of those steps.
- ``generate``: ``generate_tokens`` greedy after each prompt, ``certified_head`` on and off
  (tokens per second of the decode steps).
- ``session``: ``Session.generate`` on agent-shaped turns (free text, a forced tool call with a
  schema-constrained argument, a JSON reply under a ``response_format``), a fresh session per
  arm and trial, on and off (decode tokens per second, ``reply.decode_s``).
- ``tool_call``: ``call_tool`` (the function-calling path: name FSM, schema-constrained
  arguments with the optional members' restraint, copy drafts) on the first GitHub MCP queries
  (``bench/github_queries.jsonl``), each over its gold tool and the three tools after it in the
  registry, on and off (milliseconds per generated token after the prefill).

The head is built whatever the library's :data:`~nexus_mlx.decode.certified_head.MIN_HEAD_WEIGHTS`
(this benchmark's results set it). Correctness first: both arms' ids are identical before any
timing (the run stops otherwise).
Ratios are full / certified medians of paired trials (> 1: the certified head is faster) with
bootstrap CIs over trials. Final JSON line: ``{"head": {"certified_ms", "full_ms", "ratio",
"ratio_ci", "certified_share", "steps"}, "generate": {"tok_s", "full_tok_s", "ratio",
"ratio_ci", "certified_share"}, "session": {same}, "tool_call": {same}, "model", "model_info",
"vocab", "hidden", "loadavg", ...}``; PNG beside it. ``--views a,b`` runs only those views.
``--quick``: 2 prompts (and queries), 3 trials, 12 tokens.
"""

from __future__ import annotations

from common import (  # first: loads nexus_mlx + fast BLAS
    add_model_argument,
    add_tag_argument,
    arg_parser,
    emit,
    median_ci,
    model_record,
    paired_ratio_ci,
    shared_data,
    tagged_name,
)

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import plots

from nexus_mlx import load
from nexus_mlx.agent.session import Session
import nexus_mlx.decode.certified_head as certified_head_module
from nexus_mlx.decode.certified_head import CertifiedHead
from nexus_mlx.decode.generate import GenerationStats, generate_tokens, greedy
from nexus_mlx.decode.tool_call import call_tool
from nexus_mlx.models.forward import forward_last_hidden, lm_head, make_cache
from nexus_mlx.tools.registry import load_tools

PROMPTS = (
    "Explain how a hash map handles collisions.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "What changed in the French revolution of 1789? Answer in three sentences.",
    "List four uses of the git rebase command.",
)
TIME_TOOL = {"type": "function", "function": {
    "name": "get_current_time", "description": "The current time in an IANA timezone",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}},
                   "required": ["timezone"]}}}
CITY = {"type": "json_schema", "json_schema": {"schema": {
    "type": "object", "properties": {"city": {"type": "string"}, "reason": {"type": "string"}},
    "required": ["city", "reason"]}}}


VIEWS = ("head", "generate", "session", "tool_call")


def chat_ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                              add_generation_prompt=True))


def paired(arms: dict[str, Callable[[], float]], trials: int) -> dict[str, list[float]]:
    """Each arm's measurement per trial, the arms' order alternating."""
    names = list(arms)
    out: dict[str, list[float]] = {name: [] for name in names}
    for trial in range(trials):
        for name in names if trial % 2 == 0 else names[::-1]:
            out[name].append(arms[name]())
    return out


def summary(times: dict[str, list[float]], key: str, share: float, **extra: Any
            ) -> dict[str, Any]:
    """Medians of both arms (``key`` names the unit), full / certified ratio and its CI."""
    ratio, lo, hi = paired_ratio_ci(times["full"], times["certified"])
    return {f"certified_{key}": median_ci(times["certified"])[0],
            f"full_{key}": median_ci(times["full"])[0], "ratio": ratio, "ratio_ci": [lo, hi],
            "certified_share": share, **extra,
            "trials_ms": dict(times)}


def head_view(model: Any, tokenizer: Any, head: CertifiedHead, prompts: tuple[str, ...],
              tokens: int, trials: int) -> dict[str, Any]:
    def projected(hidden: mx.array) -> mx.array:  # the full projection's greedy id, lazy
        return greedy(lm_head(model, hidden)[:, -1, :])

    states = []
    for text in prompts:  # the states a real greedy decode passes through
        cache = make_cache(model)
        hidden = forward_last_hidden(model, chat_ids(tokenizer, text), cache)
        for _ in range(tokens):
            mx.eval(hidden)
            states.append(hidden)
            hidden = forward_last_hidden(model, [int(projected(hidden).item())], cache)
    certified_steps = 0
    for hidden in states:
        top, full_id = head.top(hidden), int(projected(hidden).item())
        if top is not None and int(top.ids[0]) != full_id:
            raise SystemExit(f"certified id {int(top.ids[0])} is not the argmax {full_id}")
        certified_steps += top is not None

    def certified() -> float:
        start = time.perf_counter()
        for hidden in states:
            if head.top(hidden) is None:
                mx.eval(projected(hidden))
        return (time.perf_counter() - start) * 1e3 / len(states)

    def full() -> float:
        start = time.perf_counter()
        for hidden in states:
            mx.eval(projected(hidden))
        return (time.perf_counter() - start) * 1e3 / len(states)

    times = paired({"certified": certified, "full": full}, trials)
    return summary(times, "ms", certified_steps / len(states), steps=len(states))


def rate_view(times: dict[str, list[float]], share: float) -> dict[str, Any]:
    """:func:`summary` of per-token milliseconds, with both arms' tokens per second."""
    return {**summary(times, "ms_per_token", share),
            "tok_s": 1e3 / median_ci(times["certified"])[0],
            "full_tok_s": 1e3 / median_ci(times["full"])[0]}


def generate_view(model: Any, tokenizer: Any, prompts: tuple[str, ...], tokens: int,
                  trials: int) -> dict[str, Any]:
    prompt_ids = [chat_ids(tokenizer, text) for text in prompts]

    def run(on: bool) -> tuple[list[list[int]], float, int]:
        """The ids of every prompt, the decode's tokens per second, the ids certified."""
        out, seconds, steps, certified = [], 0.0, 0, 0
        for ids in prompt_ids:
            stats = GenerationStats()
            out.append(list(generate_tokens(model, ids, make_cache(model), max_tokens=tokens,
                                            stats=stats, certified_head=on)))
            seconds, steps = seconds + stats.decode_s, steps + stats.generated_tokens - 1
            certified += stats.certified_tokens
        return out, steps / seconds, certified

    ours, _, certified = run(True)
    if ours != run(False)[0]:
        raise SystemExit("generate_tokens ids differ with and without the certified head")
    share = certified / sum(len(ids) for ids in ours)
    times = paired({"certified": lambda: 1e3 / run(True)[1],
                    "full": lambda: 1e3 / run(False)[1]}, trials)  # ms per token
    return rate_view(times, share)


def session_turns(session: Session, tokens: int) -> list[Any]:
    ask = [{"role": "user", "content": "What time is it in Tokyo right now, and why is the "
                                       "city famous?"}]
    return [session.generate(ask, max_tokens=tokens),
            session.generate(ask, [TIME_TOOL], tool_choice="required", max_tokens=tokens),
            session.generate(ask, response_format=CITY, max_tokens=tokens)]


def session_view(model: Any, tokenizer: Any, head: CertifiedHead, tokens: int,
                 trials: int) -> dict[str, Any]:
    def run(on: bool) -> tuple[list[list[int]], float]:
        replies = session_turns(Session(model, tokenizer, certified_head=on), tokens)
        steps = sum(len(r.tokens) - 1 for r in replies)
        return [r.tokens for r in replies], steps / sum(r.decode_s for r in replies)

    certified_before = head.stats.certified
    ours = run(True)[0]
    share = (head.stats.certified - certified_before) / max(1, sum(len(t) - 1 for t in ours))
    if ours != run(False)[0]:
        raise SystemExit("session replies differ with and without the certified head")
    times = paired({"certified": lambda: 1e3 / run(True)[1],
                    "full": lambda: 1e3 / run(False)[1]}, trials)
    return rate_view(times, share)


def tool_call_view(model: Any, tokenizer: Any, queries: int, trials: int) -> dict[str, Any]:
    registry = load_tools(shared_data("github-mcp", "tools.json"))
    names = [t.name for t in registry]
    lines = (Path(__file__).parent / "github_queries.jsonl").read_text().splitlines()[:queries]
    cases = []
    for row in map(json.loads, lines):
        at = names.index(row["tool"])
        tools = [registry.get(names[(at + i) % len(names)]) for i in range(4)]
        cases.append((row["query"], tools))

    def run(on: bool) -> tuple[list[tuple[int, ...]], float, int]:
        """Every call's ids, milliseconds per generated token after the prefill, ids certified."""
        calls = [call_tool(model, tokenizer, q, tools, certified_head=on) for q, tools in cases]
        seconds = sum(c.timings.total_s - c.timings.prefill_s for c in calls)
        made = sum(len(c.tokens) for c in calls)
        return [c.tokens for c in calls], seconds * 1e3 / made, sum(c.certified_tokens
                                                                     for c in calls)

    ours, _, certified = run(True)
    if ours != run(False)[0]:
        raise SystemExit("tool calls differ with and without the certified head")
    share = certified / sum(len(ids) for ids in ours)
    times = paired({"certified": lambda: run(True)[1], "full": lambda: run(False)[1]}, trials)
    return rate_view(times, share)


def main() -> None:
    parser = arg_parser(__doc__.splitlines()[0])
    add_model_argument(parser)
    add_tag_argument(parser)
    parser.add_argument("--views", default=",".join(VIEWS), help=f"some of {VIEWS}")
    args = parser.parse_args()
    wanted = [v for v in args.views.split(",") if v]
    if not wanted or set(wanted) - set(VIEWS):
        raise SystemExit(f"--views takes some of {VIEWS}, got {args.views!r}")
    name = tagged_name("certified_head", args.tag)
    started, load_start = time.perf_counter(), os.getloadavg()
    prompts = PROMPTS[:2] if args.quick else PROMPTS
    trials = 3 if args.quick else 7
    tokens = 12 if args.quick else 32
    model, tokenizer = load(args.model)
    certified_head_module.MIN_HEAD_WEIGHTS = 0  # measure the mechanism on any head
    head = CertifiedHead.of(model)
    if head is None:
        raise SystemExit(f"model {args.model!r} has no certified head here (see the module)")
    run_view = {
        "head": lambda: head_view(model, tokenizer, head, prompts, tokens, trials),
        "generate": lambda: generate_view(model, tokenizer, prompts, tokens, trials),
        "session": lambda: session_view(model, tokenizer, head, tokens, trials),
        "tool_call": lambda: tool_call_view(model, tokenizer, len(prompts), trials),
    }
    views: dict[str, dict[str, Any]] = {}
    for view in wanted:
        views[view] = run_view[view]()
        print(f"{view}: {views[view]['ratio']:.2f}x", flush=True)
    plots.ratio_bars(views, "full projection / certified head (median ratio)",
                     "greedy decoding: certified head speed-up", name, args.quick)
    vocab, hidden = head.weight.shape
    emit(name, {**model_record(args.model, model), **views, "vocab": vocab, "hidden": hidden,
                "candidates": head.candidates, "margin": head.margin, "trials": trials,
                "tokens": tokens, "prompts": list(prompts),
                "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
                "seconds": time.perf_counter() - started,
                "loadavg": {"start": list(load_start), "end": list(os.getloadavg())}},
         args.quick)


if __name__ == "__main__":
    main()
