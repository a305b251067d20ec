"""Benchmark: SLB scan latency (native SIMD INT8 vs numpy INT8 and fp32) and INT8 recall.

Contract: ``python bench/slb_latency.py [--quick]`` builds, for N = 250, 4,076 and 100,000
synthetic unit vectors (dim 384, Gaussian then L2-normalised; seed 0), a
``SemanticLookasideBuffer`` and times one top-k query (k = 5) per call, from a float32 query to
indices and scores:

- ``slb_scan``: ``SemanticLookasideBuffer.scan`` as an agent calls it (validation, native scan);
- ``native_<isa>``: the fused native call (quantize, SIMD scan, heap top-k) for every ISA this
  CPU runs (``avx512vnni``, ``avx2``, ``scalar`` on x86-64 with VNNI);
- ``numpy_int8``: query quantization, ``np.matmul(codes, q, dtype=int32)`` and a top-k;
  ``numpy_int8_matmul``: the matmul alone;
- ``numpy_fp32``: ``vectors @ q`` and a top-k; ``numpy_fp32_matmul``: the matmul alone
  (OpenBLAS on one thread unless ``OPENBLAS_NUM_THREADS`` is set: the native scan uses one).

Each is checked before timing (native and SLB results equal the numpy INT8 reference exactly;
the fp32 top-k equals ``scan_exact``). Results: median microseconds per call with a 95% bootstrap
CI, recall@5 (and @1) of the INT8 scan against the exact fp32 scan for random unit queries and
for "near" queries (a stored vector plus noise of norm 0.3, renormalised), the load average
before and after (timings are noisy while other jobs run), and pass/fail against the targets:
``slb_scan`` <= 20 us at N = 250 and <= 2 ms at N = 100,000. Writes ``results/slb_latency.json``
(``results/quick/`` with ``--quick``) plus a PNG, and prints the JSON as its last stdout line.
"""

import functools
import os

# One BLAS thread, set before numpy loads: the native scan is single-threaded, so this is the
# like-for-like baseline; and on a small machine two OpenBLAS pools (numpy's and the one
# nexus_mlx loads for MLX) otherwise contend, inflating sgemv times several-fold.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from common import arg_parser, emit, median_ci, time_ms  # noqa: I001  (before mlx)

import subprocess
from collections.abc import Callable

import numpy as np

from nexus_mlx.kernels import int8_scan as ks
from nexus_mlx.routing.slb import SemanticLookasideBuffer

DIM = 384
K = 5
SIZES = (250, 4076, 100_000)
TARGET_US = {250: 20.0, 100_000: 2000.0}
NEAR_NOISE = 0.3


def _unit(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.standard_normal((n, d), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def _topk(scores: np.ndarray, k: int) -> np.ndarray:
    """Top-k indices best first (argpartition then a sort of the k: the usual numpy idiom)."""
    part = np.argpartition(-scores, k - 1)[:k] if k < scores.shape[0] else np.arange(len(scores))
    return part[np.argsort(-scores[part], kind="stable")]


def _load() -> dict[str, object]:
    one, five, fifteen = os.getloadavg()
    try:
        text = subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        text = ""
    cores = os.cpu_count() or 1
    return {"load_1m": one, "load_5m": five, "load_15m": fifteen, "uptime": text,
            "high": one > 0.5 * cores}


def _trials(n: int, method: str, quick: bool) -> tuple[int, int]:
    """(warmup, trials) per call: enough calls for a stable median, bounded wall time."""
    slow = method.startswith("numpy_int8") or method == "native_scalar"
    if n <= 250:
        return (50, 400) if quick else (200, 3000)
    if n <= 5000:
        return (10, 100) if quick else (50, 600)
    if slow:
        return (1, 5) if quick else (2, 25)
    return (3, 30) if quick else (10, 200)


def _check(slb: SemanticLookasideBuffer, queries: np.ndarray) -> None:
    """Every timed path must agree before it is timed."""
    native = ks.native_scan()
    codes, sums, scales = slb.scan_arrays
    for q in queries[:3]:
        want_idx, want_scores, _ = ks.search_reference(codes, scales, q, K)
        got = slb.scan(q, K)
        if not (np.array_equal(got[0], want_idx) and np.array_equal(got[1], want_scores)):
            raise SystemExit(f"slb.scan disagrees with the numpy reference at N={len(slb)}")
        if native is not None:
            bound = native.bind(codes, sums, scales, DIM)
            for isa in native.isas:
                idx, scores, _ = bound.search(q, K, isa)
                if not (np.array_equal(idx, want_idx) and np.array_equal(scores, want_scores)):
                    raise SystemExit(f"native {isa} disagrees with the reference at N={len(slb)}")
        exact_idx, _ = slb.scan_exact(q, K)
        if not np.array_equal(_topk(slb.vectors @ q, K), exact_idx):
            raise SystemExit("the fp32 argpartition top-k disagrees with scan_exact")


def _native_call(bound: ks.BoundScan, isa: str, q: np.ndarray) -> object:
    return bound.search(q, K, isa)


def _methods(
    slb: SemanticLookasideBuffer, queries: np.ndarray
) -> dict[str, Callable[[np.ndarray], object]]:
    vectors = np.ascontiguousarray(slb.vectors)
    codes = np.ascontiguousarray(slb.codes)  # (N, D) int8, unpadded as a numpy user holds it
    scales = slb.scales
    qcodes = ks.quantize_rows(queries[:1])[0][0]  # (D,) int8: the matmul-only baseline's query

    def numpy_int8(q: np.ndarray) -> object:
        qc, qs = ks.quantize_rows(q[None, :])
        dots = np.matmul(codes, qc[0], dtype=np.int32)  # (N,)
        keys = dots.astype(np.float32) * scales
        idx = _topk(keys, K)
        return idx, keys[idx] * qs[0]

    methods: dict[str, Callable[[np.ndarray], object]] = {
        "slb_scan": lambda q: slb.scan(q, K),
    }
    native = ks.native_scan()
    if native is not None:
        bound = native.bind(*slb.scan_arrays, DIM)
        for isa in native.isas:
            methods[f"native_{isa}"] = functools.partial(_native_call, bound, isa)
    methods["numpy_int8"] = numpy_int8
    methods["numpy_int8_matmul"] = lambda q: np.matmul(codes, qcodes, dtype=np.int32)
    methods["numpy_fp32"] = lambda q: _topk(vectors @ q, K)
    methods["numpy_fp32_matmul"] = lambda q: vectors @ q
    return methods


def _time_us(
    fn: Callable[[np.ndarray], object], queries: np.ndarray, warmup: int, trials: int
) -> list[float]:
    """Microseconds per call, the queries taken in turn (so no single query's cache state
    decides)."""
    state = {"i": 0}

    def call() -> None:
        i = state["i"]
        state["i"] = i + 1
        fn(queries[i % len(queries)])

    return [t * 1e3 for t in time_ms(call, warmup=warmup, trials=trials)]


def _recall(slb: SemanticLookasideBuffer, rng: np.random.Generator, n_queries: int) -> dict:
    random_q = _unit(rng, n_queries, DIM)
    picks = rng.integers(0, len(slb), n_queries)
    near = slb.vectors[picks] + NEAR_NOISE * _unit(rng, n_queries, DIM)
    near /= np.linalg.norm(near, axis=1, keepdims=True)
    return {
        "queries": n_queries,
        "random_recall_at_5": slb.recall_at_k(random_q, K),
        "random_recall_at_1": slb.recall_at_k(random_q, 1),
        "near_recall_at_5": slb.recall_at_k(near, K),
        "near_recall_at_1": slb.recall_at_k(near, 1),
    }


def _plot(per_size: dict[int, dict[str, dict]], quick: bool) -> str | None:
    try:
        from plots import error_bars, figure, save
    except ImportError:  # matplotlib (or the helper) missing: the JSON is the result
        return None
    fig, ax = figure(1, width=8.0)
    methods = list(next(iter(per_size.values())).keys())
    width = 0.8 / len(methods)
    for j, method in enumerate(methods):
        med = [per_size[n][method]["median_us"] for n in SIZES]
        ci = [per_size[n][method]["ci_us"] for n in SIZES]
        xs = np.arange(len(SIZES)) + (j - (len(methods) - 1) / 2) * width
        ax.bar(xs, med, width, yerr=error_bars(med, ci), label=method, capsize=2)
    ax.set_yscale("log")
    ax.set_xticks(np.arange(len(SIZES)), [f"N = {n:,}" for n in SIZES])
    ax.set_ylabel("median latency per top-5 query (us)")
    ax.set_title("SLB scan, dim 384, k = 5")
    ax.legend(fontsize=7, ncol=2)
    return str(save(fig, "slb_latency", quick))


def main() -> dict[str, object]:
    """Run the benchmark; return the emitted result."""
    args = arg_parser("SLB scan latency: native SIMD INT8 vs numpy").parse_args()
    load_before = _load()
    rng = np.random.default_rng(0)
    status = ks.native_status()
    per_size: dict[int, dict[str, dict]] = {}
    recall: dict[int, dict] = {}
    for n in SIZES:
        slb = SemanticLookasideBuffer(DIM, "synthetic-gaussian-unit")
        slb.add([f"tool_{i}" for i in range(n)], _unit(rng, n, DIM))
        queries = _unit(rng, 64, DIM)
        _check(slb, queries)
        per_size[n] = {}
        for method, fn in _methods(slb, queries).items():
            warmup, trials = _trials(n, method, args.quick)
            us = _time_us(fn, queries, warmup, trials)
            med, lo, hi = median_ci(us)
            per_size[n][method] = {"median_us": med, "ci_us": [lo, hi], "trials": trials}
        recall[n] = _recall(slb, rng, 50 if args.quick else 200)
        del slb
    targets = {
        f"slb_scan_N{n}_le_{TARGET_US[n]:g}us": per_size[n]["slb_scan"]["median_us"] <= TARGET_US[n]
        for n in TARGET_US
    }
    payload: dict[str, object] = {
        "dim": DIM,
        "k": K,
        "sizes": list(SIZES),
        "latency_us": {str(n): per_size[n] for n in SIZES},
        "recall": {str(n): recall[n] for n in SIZES},
        "targets_us": {str(n): t for n, t in TARGET_US.items()},
        "targets_met": targets,
        "native": {"loaded": status.loaded, "isas": list(status.isas), "best": status.best,
                   "path": status.path, "reason": status.reason},
        "load_before": load_before,
        "load_after": _load(),
    }
    payload["figure"] = _plot(per_size, args.quick)
    return emit("slb_latency", payload, args.quick)


if __name__ == "__main__":
    main()
