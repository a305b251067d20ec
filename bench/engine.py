"""Prefill and decode throughput of the default model: nexus engine vs mlx-lm's own forward.

Both arms run the same weights (float32 on CPU) on the same tokens, interleaved trial by trial.
Correctness first: last-token logits agree and greedy decodes are identical before any timing.
JSON: {"prefill": [{"tokens", "nexus_tok_s", "mlx_lm_tok_s", "ratio", "ratio_ci"}],
       "decode": {"tokens", "nexus_tok_s", "mlx_lm_tok_s", "ratio", "ratio_ci"}, "max_logit_diff"}
"""

from __future__ import annotations

from common import arg_parser, emit, median_ci, ratio_ci  # first: loads nexus_mlx + fast BLAS

import time

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from nexus_mlx import forward, load, make_cache


def _prefill_nexus(model, tokens):
    cache = make_cache(model)
    out = forward(model, tokens, cache, logits="last")
    mx.eval(out)
    return out[0, -1], cache


def _prefill_mlx_lm(model, tokens):
    cache = make_prompt_cache(model)
    out = model(mx.array(tokens)[None], cache=cache)[:, -1:, :]
    mx.eval(out)
    return out[0, -1], cache


def _decode_nexus(model, cache, first, n):
    tok, out = first, []
    for _ in range(n):
        logits = forward(model, [tok], cache, logits="last")
        tok = int(mx.argmax(logits[0, -1]).item())
        out.append(tok)
    return out


def _decode_mlx_lm(model, cache, first, n):
    tok, out = first, []
    for _ in range(n):
        logits = model(mx.array([[tok]]), cache=cache)
        tok = int(mx.argmax(logits[0, -1]).item())
        out.append(tok)
    return out


def _timed(fn):
    start = time.perf_counter()
    result = fn()
    return (time.perf_counter() - start) * 1e3, result


def main() -> None:
    args = arg_parser(__doc__.splitlines()[0]).parse_args()
    lengths = [128] if args.quick else [256, 1024]
    trials = 3 if args.quick else 10
    n_decode = 8 if args.quick else 32
    model, tokenizer = load("default")
    rng = np.random.default_rng(0)
    vocab = model.args.vocab_size

    prefill_rows = []
    max_diff = 0.0
    for n in lengths:
        tokens = rng.integers(0, vocab, size=n).tolist()
        a, _ = _prefill_nexus(model, tokens)
        b, _ = _prefill_mlx_lm(model, tokens)
        max_diff = max(max_diff, float(mx.abs(a - b).max()))
        nexus_ms, ref_ms = [], []
        _prefill_nexus(model, tokens), _prefill_mlx_lm(model, tokens)  # warm-up
        for _ in range(trials):  # interleaved
            nexus_ms.append(_timed(lambda t=tokens: _prefill_nexus(model, t))[0])
            ref_ms.append(_timed(lambda t=tokens: _prefill_mlx_lm(model, t))[0])
        ratio, lo, hi = ratio_ci(ref_ms, nexus_ms)  # > 1: nexus faster
        prefill_rows.append({
            "tokens": n,
            "nexus_ms": median_ci(nexus_ms)[0], "mlx_lm_ms": median_ci(ref_ms)[0],
            "nexus_tok_s": n / (median_ci(nexus_ms)[0] / 1e3),
            "mlx_lm_tok_s": n / (median_ci(ref_ms)[0] / 1e3),
            "ratio": ratio, "ratio_ci": [lo, hi],
        })

    prompt = rng.integers(0, vocab, size=64).tolist()
    first = int(mx.argmax(_prefill_nexus(model, prompt)[0]).item())
    same = _decode_nexus(model, _prefill_nexus(model, prompt)[1], first, n_decode) == _decode_mlx_lm(
        model, _prefill_mlx_lm(model, prompt)[1], first, n_decode)
    if not same:
        raise SystemExit("greedy decodes differ between the nexus engine and mlx-lm")
    nexus_ms, ref_ms = [], []
    for _ in range(trials):
        cache = _prefill_nexus(model, prompt)[1]
        nexus_ms.append(_timed(lambda c=cache: _decode_nexus(model, c, first, n_decode))[0])
        ref_cache = _prefill_mlx_lm(model, prompt)[1]
        ref_ms.append(_timed(lambda c=ref_cache: _decode_mlx_lm(model, c, first, n_decode))[0])
    ratio, lo, hi = ratio_ci(ref_ms, nexus_ms)
    decode = {
        "tokens": n_decode,
        "nexus_tok_s": n_decode / (median_ci(nexus_ms)[0] / 1e3),
        "mlx_lm_tok_s": n_decode / (median_ci(ref_ms)[0] / 1e3),
        "ratio": ratio, "ratio_ci": [lo, hi],
    }
    emit("engine", {"model": "default (SmolLM2-135M-Instruct, float32)", "trials": trials,
                    "prefill": prefill_rows, "decode": decode, "max_logit_diff": max_diff,
                    "greedy_identical": same}, args.quick)


if __name__ == "__main__":
    main()
