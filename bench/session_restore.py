"""Benchmark: a conversation resumed after a server restart, restored sessions vs a cold start.

Contract: ``python bench/session_restore.py [--quick] [--model M] [--conversations C]
[--tag T]``. Each conversation is one HotpotQA question of
``../shared/data/multihop/hotpotqa_dev50.json`` asked over all ten of its paragraphs (a long first
user turn), answered in 8 tokens; its follow-up asks for the answer in one word. Server ``A``
(``--session-dir``, in this process) serves every first request, then stops and saves its
sessions (timed; bytes on disk recorded). Two servers then answer every follow-up: ``restored``
(the same directory: it restores the sessions before it serves; the restore is timed) and
``cold`` (no directory: it computes each conversation from nothing), the order alternating per
conversation. Each follow-up is streamed with the ``openai`` client over loopback; TTFT is the time
to the first streamed text (the first chunk only names the role). Correctness first: both servers'
replies are the same text (greedy; the script exits otherwise). Reported: TTFT medians with
bootstrap CIs, the paired ratio cold / restored with its CI, the rows each reused
(``cached_tokens``), the seconds of server A's stop (the save) and of the restoring server's whole
start (the restore included), the files in the directory (the sessions and their index) and
their bytes per cached token (float32 K/V as the cache holds it). Writes ``results/session_restore[_<tag>].json`` (``results/quick/`` with ``--quick``), a
PNG beside it, and prints the JSON as its last line.
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
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import plots
from nexus_mlx import load
from nexus_mlx.server import Server
from streaming import stream_chat

ANSWER_TOKENS = 8
FOLLOW_UP = "Now give only the answer, in as few words as you can."


def conversations(n: int) -> list[list[dict[str, str]]]:
    """First requests: each question over all of its paragraphs."""
    data = json.loads(shared_data("multihop", "hotpotqa_dev50.json").read_text())[:n]
    out = []
    for q in data:
        paragraphs = "\n\n".join(f"{title}: {''.join(sents)}" for title, sents in q["context"])
        out.append([{"role": "user", "content": f"{paragraphs}\n\nQuestion: {q['question']}"}])
    return out


def ask(server: Server, messages: list[dict[str, str]]) -> tuple[float, str, int]:
    """(TTFT ms, text, cached prompt tokens) of one streamed greedy request."""
    done = stream_chat(server.base_url, messages, ANSWER_TOKENS,
                       stream_options={"include_usage": True})
    cached = 0 if done.usage is None else done.usage.prompt_tokens_details.cached_tokens
    return done.first_ms, done.text, cached


def draw(result: dict[str, Any], name: str, quick: bool) -> None:
    plots.median_bars({arm: result[f"{arm}_ttft_ms"] for arm in ("cold", "restored")},
                      "follow-up TTFT, ms (median, 95% CI)",
                      f"{result['model_info']['spec']}: a conversation resumed after a restart "
                      f"({result['speedup'][0]:.2f}x)", name, quick)


def main() -> None:
    parser = arg_parser(__doc__.splitlines()[0])
    add_model_argument(parser)
    parser.add_argument("--conversations", type=int, default=12, help="HotpotQA questions")
    add_tag_argument(parser)
    args = parser.parse_args()
    model, tokenizer = load(args.model)
    firsts = conversations(3 if args.quick else args.conversations)
    options = dict(model_name="m", max_sessions=len(firsts), cache_budget_mib=8192,
                   idle_release_s=None)
    with tempfile.TemporaryDirectory(prefix="nexus-sessions-") as tmp:
        directory = Path(tmp)
        with Server(model, tokenizer, session_dir=directory, **options) as first:
            ask(first, [{"role": "user", "content": "Hello."}])  # warm-up, its own session
            replies = [ask(first, messages)[1] for messages in firsts]
            started = time.perf_counter()
            first.stop()
            save_s = time.perf_counter() - started
        files = sorted(directory.iterdir())
        on_disk = sum(f.stat().st_size for f in files)
        started = time.perf_counter()
        restored = Server(model, tokenizer, session_dir=directory, **options).start()
        restore_s = time.perf_counter() - started
        cold = Server(model, tokenizer, **options).start()
        try:
            ask(cold, [{"role": "user", "content": "Hello."}])  # the same warm-up
            times: dict[str, list[float]] = {"cold": [], "restored": []}
            cached: dict[str, list[int]] = {"cold": [], "restored": []}
            for k, (messages, reply) in enumerate(zip(firsts, replies, strict=True)):
                follow = [*messages, {"role": "assistant", "content": reply},
                          {"role": "user", "content": FOLLOW_UP}]
                texts = {}
                for arm in (["cold", "restored"] if k % 2 else ["restored", "cold"]):
                    ms, texts[arm], rows = ask(restored if arm == "restored" else cold, follow)
                    times[arm].append(ms)
                    cached[arm].append(rows)
                if texts["cold"] != texts["restored"]:
                    sys.exit(f"conversation {k}: replies differ: {texts}")
            health = restored.engine.stats()
        finally:
            restored.stop()
            cold.stop()
    rows = int(health["session_rows_restored"])
    result = {**model_record(args.model, model), "conversations": len(firsts),
              "answer_tokens": ANSWER_TOKENS,
              "cold_ttft_ms": median_ci(times["cold"]),
              "restored_ttft_ms": median_ci(times["restored"]),
              "speedup": paired_ratio_ci(times["cold"], times["restored"]),
              "cached_tokens": {arm: float(np.mean(v)) for arm, v in cached.items()},
              "sessions_restored": int(health["sessions_restored"]), "rows_restored": rows,
              "save_s": save_s, "restore_s": restore_s,
              "bytes_on_disk": on_disk, "files": len(files),
              "trials_ms": times}
    result["bytes_per_token"] = result["bytes_on_disk"] / max(rows, 1)
    name = tagged_name("session_restore", args.tag)
    print(f"cold {result['cold_ttft_ms'][0]:.0f} ms, restored {result['restored_ttft_ms'][0]:.0f}"
          f" ms, {result['speedup'][0]:.2f}x; save {save_s:.2f} s, restore {restore_s:.2f} s",
          flush=True)
    draw(result, name, args.quick)
    emit(name, result, args.quick)


if __name__ == "__main__":
    main()
