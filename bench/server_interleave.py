"""Benchmark: a short request sent while a long reply streams, replies interleaved vs one at a time.

Contract: ``python bench/server_interleave.py [--quick] [--model M] [--trials K] [--long N]
[--long-prompt W] [--tag T]``. Two servers over one loaded model: ``interleaved`` (the default:
the replies being decoded take turns on the MLX thread token by token) and ``fifo``
(``interleave=False``: each reply to its end, in arrival order). Per trial and server (the order
alternating per trial): a long reply is streamed (greedy, ``N`` tokens, end-of-turn ids banned by
``logit_bias`` so its length is fixed); when its first text arrives, a short request is sent from
another thread: a new conversation (a HotpotQA paragraph and a question about it, from
``../shared/data/multihop/hotpotqa_dev50.json``, a different one per trial), answered in
``SHORT_TOKENS`` tokens, streamed. With ``--long-prompt W`` the long request is a new document
each trial (about ``W`` words of HotpotQA paragraphs to summarise) and the short request is sent
``SEND_AFTER_S`` after it, during its prefill (a prompt that only appends takes a turn per 512
rows). Timed with the ``openai`` client over loopback: the short request's TTFT (to its first
text) and its whole time, from when it was sent; the long reply's whole time. Correctness first:
each short reply equals the one its server gives to the same request alone (asked before the
trials), and the long replies of both servers are the same text; the script exits otherwise.
Reported: medians with bootstrap CIs per server, the paired ratios fifo / interleaved of the
short request's TTFT and whole time (> 1: interleaving answers it sooner), and interleaved /
fifo of the long reply's whole time (its cost: the same work, shared out differently), the long
prompt's median tokens. Writes ``results/server_interleave[_<tag>].json`` (``results/quick/``
with ``--quick``), a PNG beside it, and prints the JSON as its last line.
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
import threading
from typing import Any

import numpy as np

import plots
from nexus_mlx import load
from nexus_mlx.models.tokenizer import eos_token_ids
from nexus_mlx.server import Server
from streaming import stream_chat

SHORT_TOKENS = 8
SEND_AFTER_S = 0.5  # with --long-prompt: the short request goes out during the long prefill
LONG_ASK = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
ARMS = ("interleaved", "fifo")


def short_asks(data: list[dict[str, Any]], n: int) -> list[list[dict[str, str]]]:
    """One new conversation per trial: a HotpotQA paragraph and its item's question."""
    out = []
    for q in data[:n]:
        title, sentences = q["context"][0]
        out.append([{"role": "user", "content": f"{title}: {''.join(sentences)}\n\n"
                                                f"Question: {q['question']}"}])
    return out


def long_document(data: list[dict[str, Any]], k: int, words: int) -> list[dict[str, str]]:
    """Trial ``k``'s long request: about ``words`` words of HotpotQA paragraphs, a new
    document each trial (its first line differs), to summarise."""
    text = " ".join(f"{title}: {''.join(sentences)}" for q in data[k:] + data[:k]
                    for title, sentences in q["context"]).split()[:words]
    return [{"role": "user", "content": f"Document {k}.\n\n{' '.join(text)}\n\n"
                                        "Summarise the document."}]


def trial(server: Server, short: list[dict[str, str]], long: list[dict[str, str]],
          long_tokens: int, no_end: dict[str, int], during_prefill: bool) -> dict[str, Any]:
    """The long reply streamed, the short request sent at its first text (or
    ``SEND_AFTER_S`` after it was sent, ``during_prefill``): both timed."""
    out: dict[str, Any] = {}

    def ask_short() -> None:
        done = stream_chat(server.base_url, short, SHORT_TOKENS)
        out.update(short_ttft=done.first_ms, short_total=done.end_ms, short_text=done.text)

    asker = (threading.Timer(SEND_AFTER_S, ask_short) if during_prefill
             else threading.Thread(target=ask_short))
    if during_prefill:
        asker.start()
    reply = stream_chat(server.base_url, long, long_tokens, logit_bias=no_end,
                        on_first=None if during_prefill else asker.start,
                        stream_options={"include_usage": True})
    if asker.ident is None:
        sys.exit("the long reply streamed no text")
    asker.join()
    prompt = 0 if reply.usage is None else reply.usage.prompt_tokens
    return {**out, "long_total": reply.end_ms, "long_text": reply.text, "long_prompt": prompt}


def draw(result: dict[str, Any], name: str, quick: bool) -> None:
    during = (f"a {result['long_prompt_tokens']:.0f}-token prompt's prefill"
              if result["during_prefill"] else f"a {result['long_tokens']}-token reply")
    plots.median_bars({arm: result[arm]["short_ttft_ms"] for arm in ARMS},
                      "short request TTFT, ms (median, 95% CI)",
                      f"{result['model_info']['spec']}: a short request during {during} "
                      f"({result['short_ttft_speedup'][0]:.1f}x)", name, quick)


def main() -> None:
    parser = arg_parser(__doc__.splitlines()[0])
    add_model_argument(parser)
    parser.add_argument("--trials", type=int, default=12, help="trials per server")
    parser.add_argument("--long", type=int, default=128, help="tokens of the long reply")
    parser.add_argument("--long-prompt", type=int, default=0, metavar="W",
                        help="the long request: a new W-word document per trial, the short "
                        "request sent during its prefill (0: a short prompt)")
    add_tag_argument(parser)
    args = parser.parse_args()
    trials, long_tokens = (2, 32) if args.quick else (args.trials, args.long)
    data = json.loads(shared_data("multihop", "hotpotqa_dev50.json").read_text())
    shorts = short_asks(data, trials)
    longs = [long_document(data, k, args.long_prompt) if args.long_prompt else LONG_ASK
             for k in range(trials)]
    model, tokenizer = load(args.model)
    no_end = {str(t): -100 for t in eos_token_ids(tokenizer)}
    options = dict(model_name="m", max_sessions=trials + 2, cache_budget_mib=8192,
                   idle_release_s=None)
    servers = {"interleaved": Server(model, tokenizer, **options).start(),
               "fifo": Server(model, tokenizer, interleave=False, **options).start()}
    try:
        alone = {arm: [stream_chat(s.base_url, short, SHORT_TOKENS).text for short in shorts]
                 for arm, s in servers.items()}  # also the warm-up
        runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
        for k, short in enumerate(shorts):
            for arm in (ARMS if k % 2 == 0 else ARMS[::-1]):
                runs[arm].append(trial(servers[arm], short, longs[k], long_tokens, no_end,
                                       bool(args.long_prompt)))
                if runs[arm][-1]["short_text"] != alone[arm][k]:
                    sys.exit(f"trial {k}, {arm}: the short reply differs from its reply alone")
            if runs["interleaved"][-1]["long_text"] != runs["fifo"][-1]["long_text"]:
                sys.exit(f"trial {k}: the long replies of the two servers differ")
    finally:
        for s in servers.values():
            s.stop()
    series = {arm: {key: [r[key] for r in runs[arm]]
                    for key in ("short_ttft", "short_total", "long_total")} for arm in ARMS}
    result: dict[str, Any] = {
        **model_record(args.model, model), "trials": trials, "long_tokens": long_tokens,
        "short_tokens": SHORT_TOKENS, "during_prefill": bool(args.long_prompt),
        "send_after_s": SEND_AFTER_S if args.long_prompt else None,
        "long_prompt_tokens": float(np.median([r["long_prompt"] for r in runs["fifo"]])),
        **{arm: {f"{key}_ms": median_ci(values) for key, values in series[arm].items()}
           for arm in ARMS},
        "short_ttft_speedup": paired_ratio_ci(series["fifo"]["short_ttft"],
                                              series["interleaved"]["short_ttft"]),
        "short_total_speedup": paired_ratio_ci(series["fifo"]["short_total"],
                                               series["interleaved"]["short_total"]),
        "long_total_cost": paired_ratio_ci(series["interleaved"]["long_total"],
                                           series["fifo"]["long_total"]),
        "trials_ms": series}
    name = tagged_name("server_interleave", args.tag)
    print(f"short TTFT {result['fifo']['short_ttft_ms'][0]:.0f} ms one at a time, "
          f"{result['interleaved']['short_ttft_ms'][0]:.0f} ms interleaved "
          f"({result['short_ttft_speedup'][0]:.2f}x); long reply "
          f"{result['long_total_cost'][0]:.2f}x as long", flush=True)
    draw(result, name, args.quick)
    emit(name, result, args.quick)


if __name__ == "__main__":
    main()
