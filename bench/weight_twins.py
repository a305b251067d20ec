"""Decode with weight twins against decode from the float32 weights, on real models.

Contract: ``python bench/weight_twins.py [--models M,M] [--trials T] [--tokens N] [--quick]
[--tag T]`` loads each model (default SmolLM2-135M and Qwen2.5-Coder-0.5B; ``load`` attaches
the twins, :mod:`nexus_mlx.models.twins`) and times, interleaved trial by trial with the shim's
twin routing on and off (:func:`~nexus_mlx._platform.blas.set_twin_routing`, the order
alternating):

- ``engine``: ``generate_tokens`` (the engine's pipelined greedy loop) decoding ``N`` tokens after
  a ~100-token prompt, end-of-sequence ignored: ms per token;
- ``session``: a live :class:`~nexus_mlx.agent.session.Session` continuing the same prompt with
  ``complete`` (its decode loop: certified head, drafting of copies): ms per token of the reply;
- ``forward4``: a forward of 4 tokens at depth 512, logits of all four (a drafted-copy verify
  pass; the kernel's 4-row path), ms per pass.

Before timing, each arm's ids are checked equal with the routing on and off (the twins rebuild
the same weights; sums run in another order). Ratios are float32 / twins medians of paired
trials (> 1: twins faster) with bootstrap CIs over rounds. The JSON records each model's twin
report (matrices, bytes, build seconds, declined matrices) and the load average. Final JSON
line: ``{"models": {spec: {"engine": {...}, "session": {...}, "forward4": {...}, "twins":
{...}}}}`` with ``twins_ms``, ``float32_ms``, ``ratio``, ``ratio_ci`` per arm.
"""

from __future__ import annotations

from common import ( # first: nexus_mlx + BLAS
    add_tag_argument,
    arg_parser,
    emit,
    model_record,
    paired_ratio_ci,
    switched_trials,
    tagged_name,
)

import os
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np
import plots

from nexus_mlx import load
from nexus_mlx._platform.blas import set_twin_routing
from nexus_mlx.agent.session import Session
from nexus_mlx.decode.generate import generate_tokens
from nexus_mlx.models.forward import forward, make_cache
from nexus_mlx.models.twins import twin_report

PROMPT = ("Write a detailed guide to keeping a sourdough starter alive: feeding schedules, "
          "flour types, temperatures, signs of trouble, and how to revive a neglected one. "
          "Explain each step and why it matters, in plain words, for a beginner who bakes "
          "once a week and sometimes travels for several days at a time.")
DEPTH = 512


def paired(fn: Callable[[], Any], trials: int) -> tuple[list[float], list[float], list[Any]]:
    """Milliseconds of ``fn`` with twins on and off (order alternating), and its outputs."""
    return switched_trials(set_twin_routing, fn, trials)


def summary(on: list[float], off: list[float], per: int, unit: str) -> dict[str, Any]:
    ratio, low, high = paired_ratio_ci(off, on)
    return {"twins_ms": float(np.median(on)) / per, "float32_ms": float(np.median(off)) / per,
            "unit": unit, "ratio": ratio, "ratio_ci": [low, high], "trials": len(on)}


def same_outputs(outputs: list[Any]) -> bool:
    """Whether every trial, twins on or off, produced the first trial's ids."""
    first = outputs[0][1]
    return all(out == first for _, out in outputs)


def engine_arm(model: Any, prompt: list[int], tokens: int, trials: int) -> dict[str, Any]:
    """``generate_tokens`` for ``tokens`` ids; each round's prompt-only run (prefill and the first
    id) is subtracted from its full run, so the figure is per decoded token."""
    def run(n: int) -> list[int]:
        return list(generate_tokens(model, prompt, make_cache(model), max_tokens=n,
                                    eos_token_ids=set()))

    run(tokens)  # warm-up
    on, off, outputs = paired(lambda: run(tokens), trials)
    first_on, first_off, _ = paired(lambda: run(1), trials)
    on = [a - b for a, b in zip(on, first_on, strict=True)]
    off = [a - b for a, b in zip(off, first_off, strict=True)]
    return {**summary(on, off, tokens - 1, "ms per token"), "same_ids": same_outputs(outputs),
            "prompt_tokens": len(prompt)}


def session_arm(model: Any, tokenizer: Any, prompt: list[int], tokens: int,
                trials: int) -> dict[str, Any]:
    """A new session steps to the prompt (untimed), then ``complete`` continues it (timed)."""
    decode_ms: list[float] = []
    lengths: list[int] = []

    def run() -> list[int]:
        session = Session(model, tokenizer)
        session.step_ids(prompt)
        start = time.perf_counter()
        reply = session.complete(prompt, max_tokens=tokens)
        decode_ms.append((time.perf_counter() - start) * 1e3)
        lengths.append(len(reply.tokens))
        return list(reply.tokens)

    run()  # warm-up
    decode_ms.clear()
    _, _, outputs = paired(run, trials)
    on = [t for (state, _), t in zip(outputs, decode_ms, strict=True) if state]
    off = [t for (state, _), t in zip(outputs, decode_ms, strict=True) if not state]
    n = max(int(np.median(lengths)), 1)
    return {**summary(on, off, n, "ms per token"), "same_ids": same_outputs(outputs),
            "reply_tokens": n}


def forward4_arm(model: Any, trials: int) -> dict[str, Any]:
    cache = make_cache(model)
    forward(model, np.arange(DEPTH) % 1000 + 10, cache)
    mx.eval(cache.keys(0))
    ids = [101, 202, 303, 404]

    def run() -> list[int]:
        logits = forward(model, ids, cache)
        mx.eval(logits)
        cache.trim(DEPTH)
        return [int(i) for i in np.argmax(np.array(logits[0]), axis=-1)]

    run()
    on, off, outputs = paired(run, trials)
    return {**summary(on, off, 1, "ms per pass"), "same_ids": same_outputs(outputs)}


def measure(spec: str, args: Any) -> dict[str, Any]:
    model, tokenizer = load(spec)
    report = twin_report(model)
    prompt = list(tokenizer.encode(PROMPT))
    tokens = 8 if args.quick else args.tokens
    trials = 2 if args.quick else args.trials
    return {
        **model_record(spec, model),
        "twins": None if report is None else {
            "matrices": report.matrices, "encoded": report.encoded,
            "declined": list(report.declined), "twin_mib": report.twin_bytes / 2**20,
            "float32_mib": report.weight_bytes / 2**20, "build_s": report.seconds,
            "reason": report.reason},
        "engine": engine_arm(model, prompt, tokens, trials),
        "session": session_arm(model, tokenizer, prompt, tokens, trials),
        "forward4": forward4_arm(model, trials),
    }


def draw(models: dict[str, dict[str, Any]], name: str, quick: bool) -> None:
    def short(spec: str) -> str:
        return "SmolLM2" if spec == "default" else spec.split("-")[0]

    cases = {f"{short(spec)}\n{arm}": {"ratio": m[arm]["ratio"], "ratio_ci": m[arm]["ratio_ci"]}
             for spec, m in models.items() for arm in ("engine", "session", "forward4")}
    plots.ratio_bars(cases, "float32 time / twins time (> 1: twins faster)",
                     "Decode reading weight twins", name, quick)


def main() -> None:
    parser = arg_parser(__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--models", default="default,qwen2.5-coder-0.5b")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=48)
    add_tag_argument(parser)
    args = parser.parse_args()
    specs = ["default"] if args.quick else args.models.split(",")
    name = tagged_name("weight_twins", args.tag)
    start = time.perf_counter()
    models = {spec: measure(spec, args) for spec in specs}
    draw(models, name, args.quick)
    emit(name, {"models": models, "tokens": args.tokens, "trials": args.trials,
                "loadavg": list(os.getloadavg()), "seconds": time.perf_counter() - start},
         args.quick)


if __name__ == "__main__":
    main()
