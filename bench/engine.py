"""Prefill and decode throughput of the default model: nexus engine vs mlx-lm's own forward.

Both arms run the same weights (float32 on CPU) on the same tokens, interleaved trial by trial
(the machine is shared: read the ratios; the load average is recorded). A ratio is the median of
the per-trial ratios, its CI a bootstrap over trials (``paired_ratio_ci``).
- Prefill of N tokens into an empty cache, chunked as each library chunks a long prompt: nexus
  ``forward`` (runs of ``PREFILL_CHUNK`` in position order), mlx-lm's model called on chunks of its
  ``prefill_step_size`` (2,048, the default of ``generate_step``) with the cache evaluated after
  each, as ``generate_step`` does. Time ends when the last token's logits are evaluated.
- Decode: ``nexus_mlx.decode.generate_tokens`` against ``mlx_lm.generate_step`` (both greedy),
  after the same prompt, for ``n_decode`` tokens; timed from the first token to the last (the
  decode steps only), tokens/s = (n_decode - 1) / time. Our greedy loop picks ids with the
  certified head (:mod:`~nexus_mlx.decode.certified_head`; ``certified_share``: the steps it
  certified); a third arm, ``full_head``, runs it with ``certified_head=False`` (the full
  projection, pipelined with ``mx.async_eval`` as ``generate_step`` is), so the head's part of
  the ratio shows (``full_head_ratio``: that arm against mlx-lm).
Correctness first: last-token logits agree (max |diff| recorded) and the greedy tokens of both
decoders are identical before any timing. Memory: K/V bytes of each prefill and the peak RSS.
Both arms share the model after the engine's first forward has fused its projections
(:mod:`~nexus_mlx.models.fused`: the module weights become views, mlx-lm's forward is unchanged);
``fused_projections`` records whether it did (``NEXUS_MLX_FUSE=0`` runs the engine unfused).
JSON: {"prefill": [{"tokens", "nexus_ms", "mlx_lm_ms", "ratio", "ratio_ci", "kv_bytes"}],
       "decode": [{"context", "tokens", "nexus_tok_s", "mlx_lm_tok_s", "ratio", "ratio_ci",
                   "full_head_tok_s", "full_head_ratio", "full_head_ratio_ci",
                   "certified_share"}],
       "max_logit_diff", "peak_rss_mib", "loadavg"}; ratio > 1: nexus faster.
``--quick``: 128 and 1,024 tokens, 3 trials, 8 decode tokens; ``--lengths`` overrides the lengths;
``--decode-only`` skips the prefill rows;
``--model M`` runs any ``nexus_mlx.load`` spec (default SmolLM2), ``--tag T`` writes
``results/engine_<T>.json``.
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
    tagged_name,
)

import os
import resource
import time

import mlx.core as mx
import numpy as np
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache

from nexus_mlx import load, make_cache
from nexus_mlx.decode.generate import GenerationStats, generate_tokens
from nexus_mlx.models.forward import PREFILL_CHUNK, forward
from nexus_mlx.models.fused import ENV_VAR as FUSE_ENV

MLX_LM_STEP = 2048  # mlx_lm.generate_step's default prefill_step_size


def _prefill_nexus(model, tokens):
    cache = make_cache(model)
    out = forward(model, tokens, cache, logits="last")
    mx.eval(out)
    return out[0, -1], cache


def _prefill_mlx_lm(model, tokens):
    cache = make_prompt_cache(model)
    ids = mx.array(tokens)
    for start in range(0, len(tokens), MLX_LM_STEP):
        out = model(ids[start:start + MLX_LM_STEP][None], cache=cache)
        if start + MLX_LM_STEP < len(tokens):
            mx.eval([c.state for c in cache])
    out = out[:, -1:, :]
    mx.eval(out)
    return out[0, -1], cache


def _drain(tokens) -> tuple[list[int], float]:
    """Consume a token generator: the ids and the ms from the first id to the last (the decode
    steps alone; the prompt's prefill is before the first id)."""
    out, first = [], 0.0
    for tok in tokens:
        if not out:
            first = time.perf_counter()
        out.append(int(tok))
    return out, (time.perf_counter() - first) * 1e3


def _decode_nexus(model, prompt, n, stats=None):
    return _drain(generate_tokens(model, prompt, make_cache(model), max_tokens=n, stats=stats))


def _decode_full_head(model, prompt, n):
    return _drain(generate_tokens(model, prompt, make_cache(model), max_tokens=n,
                                  certified_head=False))


def _decode_mlx_lm(model, prompt, n):
    return _drain(tok for tok, _ in generate_step(mx.array(prompt), model, max_tokens=n))


def _timed(fn):
    start = time.perf_counter()
    result = fn()
    return (time.perf_counter() - start) * 1e3, result


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def prefill_row(model, tokens, trials):
    nexus_ms, ref_ms = [], []
    for trial in range(trials):  # interleaved, alternating which arm goes first
        arms = [(_prefill_nexus, nexus_ms), (_prefill_mlx_lm, ref_ms)]
        for fn, sink in arms if trial % 2 == 0 else arms[::-1]:
            sink.append(_timed(lambda f=fn: f(model, tokens))[0])
    ratio, lo, hi = paired_ratio_ci(ref_ms, nexus_ms)  # > 1: nexus faster
    n = len(tokens)
    return {
        "tokens": n, "nexus_ms": median_ci(nexus_ms)[0], "mlx_lm_ms": median_ci(ref_ms)[0],
        "nexus_tok_s": n / (median_ci(nexus_ms)[0] / 1e3),
        "mlx_lm_tok_s": n / (median_ci(ref_ms)[0] / 1e3),
        "ratio": ratio, "ratio_ci": [lo, hi], "nexus_trials_ms": nexus_ms,
        "mlx_lm_trials_ms": ref_ms,
    }


def decode_row(model, prompt, n_decode, trials):
    stats = GenerationStats()
    ours = _decode_nexus(model, prompt, n_decode, stats)[0]
    full, ref = _decode_full_head(model, prompt, n_decode)[0], _decode_mlx_lm(model, prompt,
                                                                                n_decode)[0]
    if not ours == full == ref:
        raise SystemExit(f"greedy decodes differ after {len(prompt)} tokens: {ours} (ours), "
                         f"{full} (full head) vs {ref}")
    times: dict[str, list[float]] = {"nexus": [], "full_head": [], "mlx_lm": []}
    arms = [(_decode_nexus, "nexus"), (_decode_full_head, "full_head"), (_decode_mlx_lm, "mlx_lm")]
    for trial in range(trials):  # interleaved, rotating which arm goes first
        for fn, name in arms[trial % 3:] + arms[:trial % 3]:
            times[name].append(fn(model, prompt, n_decode)[1])
    ratio, lo, hi = paired_ratio_ci(times["mlx_lm"], times["nexus"])
    full_ratio, full_lo, full_hi = paired_ratio_ci(times["mlx_lm"], times["full_head"])
    steps = n_decode - 1
    rate = {name: steps / (median_ci(ms)[0] / 1e3) for name, ms in times.items()}
    return {
        "context": len(prompt), "tokens": n_decode,
        "nexus_tok_s": rate["nexus"], "mlx_lm_tok_s": rate["mlx_lm"],
        "ratio": ratio, "ratio_ci": [lo, hi], "greedy_identical": True,
        "full_head_tok_s": rate["full_head"], "full_head_ratio": full_ratio,
        "full_head_ratio_ci": [full_lo, full_hi],
        "certified_share": stats.certified_tokens / stats.generated_tokens,
        "nexus_trials_ms": times["nexus"], "full_head_trials_ms": times["full_head"],
        "mlx_lm_trials_ms": times["mlx_lm"],
    }


def main() -> None:
    parser = arg_parser(__doc__.splitlines()[0])
    parser.add_argument("--lengths", default=None, help="comma-separated prefill lengths")
    add_tag_argument(parser)
    parser.add_argument("--decode-only", action="store_true", help="skip the prefill rows")
    add_model_argument(parser)
    args = parser.parse_args()
    lengths = [128, 1024] if args.quick else [256, 1024, 4096, 8192]
    if args.lengths:
        lengths = [int(x) for x in args.lengths.split(",")]
    if args.decode_only:
        lengths = []
    trials = 3 if args.quick else 10
    long_trials = 3 if args.quick else 5  # 4K and 8K trials take tens of seconds each
    n_decode = 8 if args.quick else 32
    load_start = os.getloadavg()
    model, tokenizer = load(args.model)
    rng = np.random.default_rng(0)
    vocab = model.args.vocab_size

    prefill_rows = []
    max_diff = 0.0
    for n in lengths:
        tokens = rng.integers(0, vocab, size=n).tolist()
        a, cache = _prefill_nexus(model, tokens)
        b, _ = _prefill_mlx_lm(model, tokens)
        diff = float(mx.abs(a - b).max())
        max_diff = max(max_diff, diff)
        row = prefill_row(model, tokens, trials if n <= 1024 else long_trials)
        row.update({"max_logit_diff": diff, "kv_bytes": cache.nbytes,
                    "peak_rss_mib": peak_rss_mib()})
        prefill_rows.append(row)
        print(f"prefill {n:5d}: nexus {row['nexus_ms']:8.1f} ms, mlx-lm {row['mlx_lm_ms']:8.1f} "
              f"ms, ratio {row['ratio']:.2f}x [{row['ratio_ci'][0]:.2f}, {row['ratio_ci'][1]:.2f}]",
              flush=True)

    decode_rows = []
    contexts = [64] if args.quick else [64, 1024]
    for n in contexts:
        prompt = rng.integers(0, vocab, size=n).tolist()
        row = decode_row(model, prompt, n_decode, trials)
        decode_rows.append(row)
        print(f"decode after {n:5d}: nexus {row['nexus_tok_s']:.2f} tok/s (full head "
              f"{row['full_head_tok_s']:.2f}), mlx-lm {row['mlx_lm_tok_s']:.2f} tok/s, ratio "
              f"{row['ratio']:.2f}x [{row['ratio_ci'][0]:.2f}, {row['ratio_ci'][1]:.2f}], "
              f"certified {row['certified_share']:.0%}", flush=True)
    emit(tagged_name("engine", args.tag), {
                    **model_record(args.model, model), "trials": trials,
                    "long_trials": long_trials, "nexus_chunk": PREFILL_CHUNK,
                    "mlx_lm_prefill_step": MLX_LM_STEP,
                    "fused_projections": os.environ.get(FUSE_ENV, "1") != "0",
                    "prefill": prefill_rows,
                    "decode": decode_rows,
                    "max_logit_diff": max_diff if prefill_rows else None,
                    "greedy_identical": True, "peak_rss_mib": peak_rss_mib(),
                    "loadavg": {"start": list(load_start), "end": list(os.getloadavg())}},
         args.quick)


if __name__ == "__main__":
    main()
