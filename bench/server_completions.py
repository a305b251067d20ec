"""Head to head over HTTP on ``/v1/completions``: a document edited in the middle and continued
at its end, ``mlx_lm.server`` against ``nexus-mlx serve`` on the same model files.

Contract: ``python bench/server_completions.py [--model M] [--docs D] [--edits E]
[--max-tokens K] [--paragraphs P] [--quick]``.

Set-up as ``bench/server.py``'s (the same server processes, converted model directory, wrapper
that gives ``mlx_lm.server`` our OpenBLAS matmuls, warm-up): three servers, ``mlx_lm.server``,
ours with ``--policy exact`` (an edit re-encodes from the first differing token, as a prefix
cache does) and ours with ``--policy repair --budget 5``.

Workload: ``D`` documents, each the first ``P`` context paragraphs of a HotpotQA question
(``../shared/data/multihop``), as an editor or an autocompleting assistant holds a file. Request
0 sends the document (cold for every server); then ``E`` requests each change the document
and ask for the continuation of its end (a streamed raw completion at temperature 0, ``K``
tokens): alternately ``edit`` (one sentence of a paragraph in the document's first half
replaced by a sentence of another question's paragraphs) and ``append`` (a paragraph of another
question added at the end). Each request goes to the three servers in rotating order.
Per request and server: time to the first streamed text (TTFT), total time, the text, prompt and
cached tokens. Agreement: the whole continuation equal to mlx_lm.server's, and equal but for
leading whitespace (mlx_lm.server's streamed text drops the space a continuation's first token
carries, which ours and OpenAI's API return). The prompts' token counts are compared across
servers (the same tokenization proves the same prompt).

JSON (``results/server_completions.json``): ``summary[server][class]`` = ``{"ttft_ms_mean",
"ttft_ms_median", "ttft_speedup_vs_mlx_lm" (median of per-request ratios, with a bootstrap
CI), "agree_with_mlx_lm", "agree_but_leading_space", "cached_tokens_mean", "n"}`` for classes ``edit`` and ``append``;
``records``; the load average; PNG beside it.
"""

from __future__ import annotations

from common import arg_parser, emit, paired_ratio_ci, shared_data  # first: nexus_mlx + BLAS

import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import openai

import plots
from server import EXACT, MLX_LM, REPAIR, ServerProcess, convert, mlx_lm_server, nexus_server

NAME = "server_completions"
SERVERS = (MLX_LM, EXACT, REPAIR)
CLASSES = ("edit", "append")


def documents(n_docs: int, paragraphs: int) -> tuple[list[list[str]], list[str]]:
    """``n_docs`` documents as lists of paragraphs, and a pool of other questions' sentences
    (the edits' material)."""
    data = json.loads(shared_data("multihop", "hotpotqa_dev50.json").read_text())
    docs = [["".join(sents).strip() for _, sents in q["context"][:paragraphs]]
            for q in data[:n_docs]]
    pool = [s.strip() for q in data[n_docs:] for _, sents in q["context"] for s in sents
            if len(s.split()) >= 6]
    return docs, pool


def edited(doc: list[str], pool: list[str], step: int, rng: np.random.Generator
           ) -> tuple[str, list[str]]:
    """The request's class and the document after its change (a new list)."""
    doc = list(doc)
    if step % 2:  # append: another question's sentences as a new last paragraph
        doc.append(" ".join(pool[int(i)] for i in rng.choice(len(pool), 3, replace=False)))
        return "append", doc
    where = int(rng.integers(1, max(2, len(doc) // 2)))  # a paragraph in the first half
    sentences = re.split(r"(?<=[.!?])\s+", doc[where])
    sentences[int(rng.integers(len(sentences)))] = pool[int(rng.integers(len(pool)))]
    doc[where] = " ".join(sentences)
    return "edit", doc


def streamed(server: ServerProcess, client: openai.OpenAI, prompt: str, max_tokens: int
             ) -> dict[str, Any]:
    """One streamed greedy raw completion: TTFT, total time, text, usage."""
    start = time.perf_counter()
    first: float | None = None
    pieces: list[str] = []
    usage: Any = None
    stream = client.completions.create(model=server.model_name, prompt=prompt, stream=True,
                                       temperature=0, max_tokens=max_tokens,
                                       stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.text:
                first = time.perf_counter() if first is None else first
                pieces.append(choice.text)
    end = time.perf_counter()
    details = getattr(usage, "prompt_tokens_details", None)
    extra = (usage.model_extra or {}) if usage is not None else {}
    nexus = extra.get("nexus") if isinstance(extra.get("nexus"), dict) else None
    return {"ttft_ms": ((first or end) - start) * 1e3, "total_ms": (end - start) * 1e3,
            "text": "".join(pieces), "prompt_tokens": getattr(usage, "prompt_tokens", None),
            "cached_tokens": getattr(details, "cached_tokens", None),
            "path": nexus.get("path") if nexus else None}


def replay(servers: dict[str, ServerProcess], docs: list[list[str]], pool: list[str],
           edits: int, max_tokens: int, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    clients = {name: s.client() for name, s in servers.items()}
    records: list[dict[str, Any]] = []
    turn = 0
    for d, doc in enumerate(docs):
        for step in range(edits + 1):
            kind, doc = ("first", doc) if step == 0 else edited(doc, pool, step, rng)
            prompt = "\n\n".join(doc)
            order = SERVERS[turn % 3:] + SERVERS[:turn % 3]
            turn += 1
            answers = {name: streamed(servers[name], clients[name], prompt, max_tokens)
                       for name in order}
            for answer in answers.values():
                answer["agree_with_mlx_lm"] = answer["text"] == answers[MLX_LM]["text"]
                answer["agree_but_leading_space"] = (answer["text"].lstrip()
                                                     == answers[MLX_LM]["text"].lstrip())
            tokens = {a["prompt_tokens"] for a in answers.values()}
            records.append({"doc": d, "step": step, "class": kind, "order": list(order),
                            "prompt_identical": len(tokens) == 1, "servers": answers})
            print(f"doc {d} step {step} {kind}: " + ", ".join(
                f"{n} {a['ttft_ms']:.0f} ms" for n, a in answers.items()), flush=True)
    return records


def summarize(records: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name in SERVERS:
        out[name] = {}
        for kind in CLASSES:
            rows = [r["servers"] for r in records if r["class"] == kind]
            if not rows:
                continue
            ttft = [row[name]["ttft_ms"] for row in rows]
            base = [row[MLX_LM]["ttft_ms"] for row in rows]
            ratio = paired_ratio_ci(base, ttft)
            cached = [row[name]["cached_tokens"] for row in rows
                      if row[name]["cached_tokens"] is not None]
            out[name][kind] = {
                "n": len(rows), "ttft_ms_mean": float(np.mean(ttft)),
                "ttft_ms_median": float(np.median(ttft)),
                "ttft_speedup_vs_mlx_lm": ratio[0], "ttft_speedup_ci": list(ratio[1:]),
                "agree_with_mlx_lm": float(np.mean([row[name]["agree_with_mlx_lm"]
                                                    for row in rows])),
                "agree_but_leading_space": float(np.mean(
                    [row[name]["agree_but_leading_space"] for row in rows])),
                "cached_tokens_mean": float(np.mean(cached)) if cached else None}
    return out


def draw(summary: dict[str, Any], quick: bool) -> None:
    fig, ax = plots.figure(width=6.0)
    x = np.arange(len(CLASSES))
    for offset, name in zip((-0.27, 0.0, 0.27), SERVERS, strict=True):
        means = [summary[name].get(k, {}).get("ttft_ms_mean", 0.0) for k in CLASSES]
        ax.bar(x + offset, means, 0.27, label=name)
    ax.set_xticks(x, CLASSES)
    ax.set_ylabel("TTFT ms (mean)")
    ax.set_title("/v1/completions: an edited document continued at its end")
    ax.legend()
    plots.save(fig, NAME, quick)


def main() -> None:
    parser = arg_parser(__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--model", default="default")
    parser.add_argument("--docs", type=int, default=8, help="documents (<= 25)")
    parser.add_argument("--edits", type=int, default=6, help="changes per document")
    parser.add_argument("--paragraphs", type=int, default=10, help="paragraphs per document")
    parser.add_argument("--max-tokens", type=int, default=8, help="continuation tokens")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.quick:
        args.docs, args.edits, args.paragraphs = 1, 2, 4
    started, load_before = time.perf_counter(), os.getloadavg()
    docs, pool = documents(args.docs, args.paragraphs)
    with tempfile.TemporaryDirectory(prefix="nexus-bench-completions-") as tmp:
        root = Path(tmp)
        model_dir = convert(args.model, root / "model")
        logs = root / "logs"
        logs.mkdir()
        servers = {MLX_LM: mlx_lm_server(model_dir, args.max_tokens, logs),
                   EXACT: nexus_server(EXACT, model_dir, "exact", 8, 1024, logs),
                   REPAIR: nexus_server(REPAIR, model_dir, "repair", 8, 1024, logs)}
        commands = {s.name: s.command for s in servers.values()}
        try:
            for server in servers.values():
                server.start()
            with servers[MLX_LM], servers[EXACT], servers[REPAIR]:
                for server in servers.values():  # warm-up: first-call costs out of the timings
                    streamed(server, server.client(), "Hello, my name is", args.max_tokens)
                records = replay(servers, docs, pool, args.edits, args.max_tokens, args.seed)
        finally:
            for server in servers.values():
                server.stop()
    summary = summarize(records)
    emit(NAME, {"model": args.model, "docs": args.docs, "edits": args.edits,
                "paragraphs": args.paragraphs, "max_tokens": args.max_tokens,
                "server_commands": commands,
                "prompt_tokens_median": float(np.median(
                    [r["servers"][MLX_LM]["prompt_tokens"] or 0 for r in records])),
                "prompts_identical_rate": float(np.mean([r["prompt_identical"]
                                                         for r in records])),
                "summary": summary, "records": records,
                "load_average": {"start": list(load_before), "end": list(os.getloadavg())},
                "wall_s": time.perf_counter() - started}, args.quick)
    draw(summary, args.quick)


if __name__ == "__main__":
    main()
