"""Few-row products against weight matrices: the BLAS shim's skinny kernel against OpenBLAS.

Contract: ``python bench/skinny_gemm.py [--quick] [--model M] [--tag T]`` times, interleaved trial by
trial with the routing on and off (:func:`~nexus_mlx._platform.blas.set_skinny_routing`):

- ``gemm``: ``x @ W.T`` for ``rows`` in 1, 2, 3, 4, 6, 8, 12 against the weight shapes of
  SmolLM2-135M (fused q/k/v 960 x 576, gate/up 3,072 x 576, down 576 x 1,536, tied head
  49,152 x 576) and Qwen2.5-0.5B (gate/up 9,728 x 896, head 151,936 x 896), random float32. Past
  6 rows (4 without AVX-512F) the kernel declines, so those rows time OpenBLAS in both arms (a
  control: ratio ~1); one row is sgemv in both arms.
- ``forward``: a forward of ``tokens`` in 1, 2, 3, 4, 6, 8 appended at depth 512 to a cache of the
  model (default SmolLM2), the logits of every token (a decoder's verify pass,
  :mod:`~nexus_mlx.decode.lookahead`), then trimmed back.

Before timing, each product equals numpy's within 1e-4 and each forward's logits agree within
1e-3 with the routing on and off. Ratios are OpenBLAS / skinny medians (> 1: the kernel is
faster), with bootstrap CIs over paired trials. Final JSON line: ``{"gemm": [{"shape", "rows",
"skinny_ms", "openblas_ms", "ratio", "ratio_ci"}], "forward": [{"tokens", ...}], "step_cost":
{tokens: forward ms / one-token forward ms, skinny on}}``.
"""

from __future__ import annotations

from common import (  # first: loads nexus_mlx + fast BLAS
    add_model_argument,
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
from nexus_mlx._platform.blas import BLAS_STATUS, set_skinny_routing
from nexus_mlx.models.forward import forward, make_cache

SHAPES = {"smollm2 qkv": (960, 576), "smollm2 gate_up": (3072, 576),
          "smollm2 down": (576, 1536), "smollm2 head": (49152, 576),
          "qwen0.5b gate_up": (9728, 896), "qwen0.5b head": (151936, 896)}
ROWS = (1, 2, 3, 4, 6, 8, 12)
TOKENS = (1, 2, 3, 4, 6, 8)
DEPTH = 512


def paired(fn: Callable[[], object], trials: int) -> tuple[list[float], list[float]]:
    """Milliseconds of ``fn`` with the routing on and off, alternating which goes first."""
    on, off, _ = switched_trials(set_skinny_routing, fn, trials)
    return on, off


def row(on: list[float], off: list[float], **fields: object) -> dict[str, Any]:
    ratio, low, high = paired_ratio_ci(off, on)
    return {**fields, "skinny_ms": float(np.median(on)), "openblas_ms": float(np.median(off)),
            "ratio": ratio, "ratio_ci": [low, high]}


def gemm_rows(trials: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    out = []
    for shape, (n, k) in SHAPES.items():
        w = rng.standard_normal((n, k), dtype=np.float32)
        wm = mx.array(w)
        for rows in ROWS:
            x = rng.standard_normal((rows, k), dtype=np.float32)
            xm = mx.array(x)
            for state in (True, False):
                set_skinny_routing(state)
                got = np.array(xm @ wm.T)
                assert np.allclose(got, x @ w.T, rtol=1e-4, atol=1e-3), (shape, rows, state)
            on, off = paired(lambda xm=xm, wm=wm: mx.eval(xm @ wm.T), trials)
            out.append(row(on, off, shape=shape, n=n, k=k, rows=rows))
            print(f"{shape} rows={rows}: {out[-1]['ratio']:.2f}x", flush=True)
    return out


def forward_rows(model: object, trials: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(1)
    vocab = int(model.args.vocab_size)  # type: ignore[attr-defined]
    cache = make_cache(model)
    mx.eval(forward(model, rng.integers(0, vocab, DEPTH).tolist(), cache, logits="last"))
    cache.evaluate()
    out = []
    for tokens in TOKENS:
        ids = rng.integers(0, vocab, tokens).tolist()

        def run(ids: list[int] = ids) -> mx.array:
            logits = forward(model, ids, cache, logits="all")
            mx.eval(logits)
            cache.trim(DEPTH)
            return logits

        results = []
        for state in (True, False):
            set_skinny_routing(state)
            results.append(np.array(run()))
        assert np.allclose(results[0], results[1], atol=1e-3), tokens
        on, off = paired(run, trials)
        out.append(row(on, off, tokens=tokens, depth=DEPTH))
        print(f"forward tokens={tokens}: {out[-1]['ratio']:.2f}x", flush=True)
    return out


def draw(gemm: list[dict[str, Any]], fwd: list[dict[str, Any]], name: str, quick: bool) -> None:
    fig, (left, right) = plots.figure(ncols=2, width=10.0)
    for shape in dict.fromkeys(str(r["shape"]) for r in gemm):
        rows = [r for r in gemm if r["shape"] == shape]
        left.plot([r["rows"] for r in rows], [r["ratio"] for r in rows], marker="o", label=shape)
    left.axhline(1.0, color="grey", linewidth=0.8)
    left.set_xlabel("rows of x")
    left.set_ylabel("OpenBLAS / skinny (median ratio)")
    left.set_title("x @ W.T")
    left.legend(fontsize=7)
    tokens = [r["tokens"] for r in fwd]
    right.plot(tokens, [r["skinny_ms"] for r in fwd], marker="o", label="skinny")
    right.plot(tokens, [r["openblas_ms"] for r in fwd], marker="o", label="OpenBLAS")
    right.set_xlabel(f"tokens appended at depth {DEPTH}")
    right.set_ylabel("forward ms (median)")
    right.set_title("forward, logits of every token")
    right.legend()
    plots.save(fig, name, quick)


def main() -> None:
    parser = arg_parser(__doc__ or "")
    add_model_argument(parser)
    add_tag_argument(parser)
    args = parser.parse_args()
    name = tagged_name("skinny_gemm", args.tag)
    if not set_skinny_routing(True):  # on for the run, even under NEXUS_MLX_SKINNY=0
        raise SystemExit(f"the skinny routing is not available here: {BLAS_STATUS}")
    started = time.perf_counter()
    trials = 5 if args.quick else 15
    gemm = gemm_rows(trials)
    model, _ = load(args.model)
    fwd = forward_rows(model, trials)
    one = next(r for r in fwd if r["tokens"] == 1)["skinny_ms"]
    step_cost = {str(r["tokens"]): float(r["skinny_ms"]) / float(one) for r in fwd}
    step_cost_off = {str(r["tokens"]): float(r["openblas_ms"]) / float(one) for r in fwd}
    draw(gemm, fwd, name, args.quick)
    emit(name, {**model_record(args.model, model), "trials": trials,
                         "gemm": gemm, "forward": fwd, "step_cost": step_cost,
                         "step_cost_openblas": step_cost_off,
                         "seconds": time.perf_counter() - started,
                         "loadavg": os.getloadavg()}, args.quick)


if __name__ == "__main__":
    main()
