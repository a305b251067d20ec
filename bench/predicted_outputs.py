"""Predicted outputs: a model rewriting code, with the code it rewrites as its ``prediction``.

Contract: ``python bench/predicted_outputs.py [--model M] [--trials T] [--tag T] [--quick]``
asks the model to edit real code (:data:`FUNCTIONS`, functions of Python's standard library read
with ``inspect``, the same on every machine with this Python) in two ways (:data:`EDITS`: rename
the function; add a comment as the body's first line), replying with the whole function in a
code block. Arms, on the same requests: ``none`` (one id per pass: no drafts), ``context`` (the
session's default copy drafts from the conversation, which holds the code), and ``predicted-K``
(those, plus the original code block as the ``prediction``, drafting up to K of its ids per
pass; :data:`DRAFTS`) and ``mismatched`` (the default prediction drafts, but with another
request's code as the prediction: what a wrong prediction costs). Each reply takes a fresh
session stepped to the prompt (untimed) and is timed alone (wall clock of ``generate``); arms
rotate their order request by request (and trial by trial). Every arm's
reply is compared with ``none``'s: ``identical`` counts replies whose ids are equal (verification
makes them so up to float32 rounding). Per arm: total ms over all requests (each request's
median over trials), ``ratio``: the median over requests of ``none``'s time over the arm's, with
its bootstrap CI over requests (``vs_context``: the same against ``context``), ``total_ratio``:
the ratio of the totals, passes, and predicted ids drafted and kept. Final JSON line: ``{"arms":
{arm: {...}}, "requests": [...], "model", ...}``; PNG beside it. ``--quick``: 3 functions, one
edit.
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

import colorsys
import html
import inspect
import os
import shlex
import string
import textwrap
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import plots

from nexus_mlx import load
from nexus_mlx.agent.session import Session
from nexus_mlx.decode.prediction import DEFAULT_PREDICTION_DRAFT, Prediction

FUNCTIONS: list[Callable[..., Any]] = [shlex.quote, html.escape, colorsys.rgb_to_hsv,
                                       string.capwords, textwrap.indent, urllib.parse.urldefrag]
EDITS = {
    "rename": "Rename the function `{name}` to `{name}_v2`; change nothing else.",
    "comment": "Add the comment `# reviewed` as the first line of the function's body; change "
               "nothing else.",
}
DRAFTS = (8, 16, 32, 64)
SLACK = 48  # ids a reply may take beyond the code it predicts


def requests(quick: bool) -> list[dict[str, Any]]:
    functions = FUNCTIONS[:3] if quick else FUNCTIONS
    edits = list(EDITS)[:1] if quick else list(EDITS)
    codes = ["```python\n" + textwrap.dedent(inspect.getsource(fn)) + "```" for fn in functions]
    out = []
    for i, (fn, code) in enumerate(zip(functions, codes, strict=True)):
        for edit in edits:
            ask = (EDITS[edit].format(name=fn.__name__) + " Reply with the whole function in "
                   "one Python code block and nothing else.\n\n" + code)
            out.append({"name": f"{fn.__module__}.{fn.__name__}:{edit}",
                        "messages": [{"role": "user", "content": ask}], "prediction": code,
                        "mismatched": codes[(i + 1) % len(codes)]})
    return out


def reply(model: Any, tokenizer: Any, request: dict[str, Any], arm: str, max_tokens: int
          ) -> tuple[Any, float]:
    """One reply on a fresh session stepped to the prompt, and its wall-clock milliseconds."""
    session = Session(model, tokenizer, draft_tokens=0 if arm == "none" else 3)
    prediction = None
    if arm.startswith("predicted-"):
        ids = tokenizer.encode(request["prediction"], add_special_tokens=False)
        prediction = Prediction(ids, max_draft=int(arm.split("-")[1]))
    elif arm == "mismatched":
        prediction = Prediction(tokenizer.encode(request["mismatched"], add_special_tokens=False))
    session.step(request["messages"])
    start = time.perf_counter()
    out = session.generate(request["messages"], max_tokens=max_tokens, prediction=prediction)
    return out, (time.perf_counter() - start) * 1e3


def plot(arms: dict[str, dict[str, Any]], name: str, quick: bool) -> None:
    """Each arm's speed-up over one id per pass (``predicted-K`` labelled ``K``)."""
    bars = {arm.replace("predicted-", "K="): s for arm, s in arms.items() if arm != "none"}
    plots.ratio_bars(bars, "one id per pass / arm (median over requests)",
                     "code edits: copy drafts and predictions of K ids a pass",
                     name, quick)


def main() -> None:
    parser = arg_parser(__doc__.splitlines()[0])
    add_model_argument(parser, default="qwen2.5-coder-0.5b")
    parser.add_argument("--trials", type=int, default=None)
    add_tag_argument(parser)
    args = parser.parse_args()
    name = tagged_name("predicted_outputs", args.tag)
    trials = args.trials or 1
    started, load_start = time.perf_counter(), os.getloadavg()
    model, tokenizer = load(args.model)
    arms = ["none", "context", *(f"predicted-{k}" for k in DRAFTS), "mismatched"]
    asked = requests(args.quick)
    records = []
    for index, request in enumerate(asked):
        limit = len(tokenizer.encode(request["prediction"], add_special_tokens=False)) + SLACK
        replies: dict[str, Any] = {}
        for trial in range(trials):
            shift = (index + trial) % len(arms)
            for arm in arms[shift:] + arms[:shift]:
                out, ms = reply(model, tokenizer, request, arm, limit)
                replies.setdefault(arm, (out, []))[1].append(ms)
        base = replies["none"][0]
        records.append({"name": request["name"], "ids": len(base.tokens), "arms": {
            arm: {"ms": median_ci(ms)[0], "identical": out.tokens == base.tokens,
                  "passes": out.drafts.passes, "predicted": out.drafts.predicted,
                  "predicted_accepted": out.drafts.predicted_accepted}
            for arm, (out, ms) in replies.items()}})
        print(f"{request['name']}: {len(base.tokens)} ids, " + ", ".join(
            f"{arm} {rec['ms']:.0f} ms" for arm, rec in records[-1]["arms"].items()), flush=True)
    summary = {}
    times = {arm: [r["arms"][arm]["ms"] for r in records] for arm in arms}  # by request
    for arm in arms:
        ratio, lo, hi = paired_ratio_ci(times["none"], times[arm])
        vs_context, clo, chi = paired_ratio_ci(times["context"], times[arm])
        summary[arm] = {
            "ms": sum(times[arm]), "ratio": ratio, "ratio_ci": [lo, hi],
            "total_ratio": sum(times["none"]) / sum(times[arm]),
            "vs_context": vs_context, "vs_context_ci": [clo, chi],
            "identical": sum(r["arms"][arm]["identical"] for r in records),
            "passes": sum(r["arms"][arm]["passes"] for r in records),
            "predicted": sum(r["arms"][arm]["predicted"] for r in records),
            "predicted_accepted": sum(r["arms"][arm]["predicted_accepted"] for r in records)}
    plot(summary, name, args.quick)
    emit(name, {**model_record(args.model, model), "arms": summary, "requests": records,
                "ids": sum(r["ids"] for r in records), "trials": trials, "drafts": list(DRAFTS),
                "default_draft": DEFAULT_PREDICTION_DRAFT,
                "seconds": time.perf_counter() - started,
                "loadavg": {"start": list(load_start), "end": list(os.getloadavg())}},
         args.quick)


if __name__ == "__main__":
    main()
