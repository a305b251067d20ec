"""Copy drafting in a session's decode loop: replies with drafts against one-id steps.

Contract: ``python bench/lookahead.py [--model M] [--draft D] [--max-tokens N] [--quick]
[--tag T]`` decodes the same replies with ``Session(draft_tokens=0)`` and
``Session(draft_tokens=D)`` (default :data:`~nexus_mlx.decode.lookahead.DEFAULT_DRAFT_TOKENS`),
interleaved (the order alternates), each on a fresh session after the same step, greedy, up to
``--max-tokens`` ids:

- ``answers``: a request for a live tool, the assistant's call and the real result of the
  ``mcp-server-time`` / ``mcp-server-git`` servers (a temporary repository,
  ``agent_session.live_tools``), the agent loop's ``DEFAULT_ANSWER_PROMPT`` as a user turn (as
  ``Agent.run`` shows it after tool results), then the model's answer in text
  (``tool_choice="none"``);
- ``calls``: the first ``--calls`` GitHub MCP queries (default 20), each with its gold tool
  offered, the model's call (``tool_choice="required"``; arguments quote the request).

Per reply: decode time (first token to last, the step excluded), ids, drafted and accepted
ids, passes, and whether the ids equal the one-id arm's (they must, up to float32 rounding of
a several-token pass). Per workload: the total decode time of each arm and their ratio
(one-id / drafted: > 1 means drafts help), ids per pass, acceptance. Final JSON line:
``{"summary": {workload: {"decode_ms_plain", "decode_ms_drafted", "speedup", "identical",
"n", "accepted", "drafted", "ids_per_pass"}}, ...}``. ``--quick``: 3 replies of each kind.
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

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import plots

from agent_session import (
    LIVE_CALLS,
    LIVE_QUESTIONS,
    _for_repo,
    _github_gold,
    github_tools,
    live_tools,
)

from nexus_mlx import load
from nexus_mlx.agent.loop import DEFAULT_ANSWER_PROMPT
from nexus_mlx.agent.session import Session
from nexus_mlx.decode.lookahead import DEFAULT_DRAFT_TOKENS


def answer_conversations(workdir: Path) -> list[tuple[list[dict[str, Any]], list[Any], Any]]:
    """(messages, tools, tool_choice) per live question: request, call, real result."""
    tools, results = live_tools(workdir)
    repo = workdir / "repo"
    out = []
    for name, asked in LIVE_QUESTIONS.items():
        for question, index in asked:
            result = results.get(name, [])[index:index + 1]
            if not result:
                continue
            arguments = _for_repo(LIVE_CALLS[name][index], repo)
            messages = [
                {"role": "user", "content": question.format(repo=repo)},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": name, "arguments": json.dumps(arguments)}}]},
                {"role": "tool", "tool_call_id": "call_1", "name": name, "content": result[0]},
                {"role": "user", "content": DEFAULT_ANSWER_PROMPT}]  # as the agent loop asks
            out.append((messages, tools, "none"))  # answer in text
    return out


def call_conversations() -> list[tuple[list[dict[str, Any]], list[Any], Any]]:
    """(messages, tools, tool_choice) per GitHub MCP query: its gold tool offered."""
    by_name = {t["function"]["name"]: t for t in github_tools(None)}
    return [([{"role": "user", "content": call.query}], [by_name[call.tool]], "required")
            for call in _github_gold() if call.tool in by_name]


def reply(model: Any, tokenizer: Any, conversation: tuple[list[dict[str, Any]], list[Any], Any],
          draft: int, max_tokens: int) -> dict[str, Any]:
    messages, tools, choice = conversation
    session = Session(model, tokenizer, draft_tokens=draft)
    out = session.generate(messages, tools, tool_choice=choice, max_tokens=max_tokens)
    stats = out.drafts
    return {"tokens": list(out.tokens), "decode_ms": out.decode_s * 1e3, "ttft_ms": out.ttft_s
            * 1e3, "drafted": stats.drafted, "accepted": stats.accepted, "passes": stats.passes,
            "text": out.text[:200]}


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    plain = sum(r["plain"]["decode_ms"] for r in records)
    drafted = sum(r["drafted"]["decode_ms"] for r in records)
    ids = sum(len(r["drafted"]["tokens"]) for r in records)
    passes = sum(r["drafted"]["passes"] for r in records)
    return {"n": len(records), "decode_ms_plain": plain, "decode_ms_drafted": drafted,
            "speedup": plain / drafted if drafted else None,
            "identical": sum(r["identical"] for r in records),
            "drafted": sum(r["drafted"]["drafted"] for r in records),
            "accepted": sum(r["drafted"]["accepted"] for r in records),
            "ids_per_pass": ids / passes if passes else None}


def draw(summary: dict[str, Any], name: str, quick: bool) -> None:
    fig, ax = plots.figure()
    names = sorted(summary)
    x = np.arange(len(names))
    for offset, arm, label in ((-0.2, "plain", "one id per pass"), (0.2, "drafted", "drafted")):
        ax.bar(x + offset, [summary[n][f"decode_ms_{arm}"] / 1e3 for n in names], 0.4,
               label=label)
    ax.set_xticks(x, [f"{n}\n{summary[n]['speedup']:.2f}x" for n in names])
    ax.set_ylabel("total decode s")
    ax.set_title("Session replies: copy drafts vs one id per pass")
    ax.legend()
    plots.save(fig, name, quick)


def main() -> None:
    parser = arg_parser(__doc__ or "")
    add_model_argument(parser)
    parser.add_argument("--draft", type=int, default=DEFAULT_DRAFT_TOKENS)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--calls", type=int, default=20, help="GitHub MCP queries (in order)")
    add_tag_argument(parser)
    args = parser.parse_args()
    started = time.perf_counter()
    model, tokenizer = load(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        workloads = {"answers": answer_conversations(Path(tmp)),
                     "calls": call_conversations()[: args.calls]}
    if args.quick:
        workloads = {k: v[:3] for k, v in workloads.items()}
    reply(model, tokenizer, workloads["answers"][0], args.draft, 4)  # warm-up
    records: dict[str, list[dict[str, Any]]] = {}
    for name, conversations in workloads.items():
        for i, conversation in enumerate(conversations):
            order = (0, args.draft) if i % 2 == 0 else (args.draft, 0)
            runs = {d: reply(model, tokenizer, conversation, d, args.max_tokens) for d in order}
            record = {"plain": runs[0], "drafted": runs[args.draft],
                      "identical": runs[0]["tokens"] == runs[args.draft]["tokens"]}
            records.setdefault(name, []).append(record)
            print(f"{name} {i}: {runs[0]['decode_ms']:.0f} / {runs[args.draft]['decode_ms']:.0f} ms"
                  f" accepted {runs[args.draft]['accepted']}/{runs[args.draft]['drafted']}"
                  f" identical={record['identical']}", flush=True)
    name = tagged_name("lookahead", args.tag)
    summary = {k: summarize(v) for k, v in records.items()}
    draw(summary, name, args.quick)
    emit(name, {**model_record(args.model, model), "draft": args.draft,
                "max_tokens": args.max_tokens, "summary": summary, "records": records,
                "seconds": time.perf_counter() - started, "loadavg": os.getloadavg()},
         args.quick)


if __name__ == "__main__":
    main()
