"""Benchmark: MLX CPU fp32 matmul (after ``import nexus_mlx``) against numpy's.

Contract: ``python bench/blas.py [--quick]`` times C = A @ B with A, B fp32 2048 x 2048 in MLX
(``mx.eval`` inside the timed call) and in numpy, after checking MLX's C against numpy's. Writes
``results/blas.json`` (``results/quick/blas.json`` with ``--quick``) and prints the same object as
its last stdout line: medians ``mlx_fp32_ms`` / ``numpy_fp32_ms`` with bootstrap CIs, ``ratio`` =
median(mlx) / median(numpy) with its CI, the BLAS status and machine info. Acceptance target on
Linux: ratio <= 2.0 (the reference BLAS MLX ships is ~50x slower than numpy).
"""

from common import arg_parser, emit, median_ci, ratio_ci, time_ms  # noqa: I001  (before mlx)

import time

import mlx.core as mx
import numpy as np

from nexus_mlx._platform.blas import BLAS_STATUS, shim_call_counts

N = 2048
SETTLE_S = 0.5


def main() -> dict[str, object]:
    """Run the benchmark; return the emitted result."""
    args = arg_parser("MLX CPU fp32 matmul vs numpy (BLAS check)").parse_args()
    warmup, trials = (1, 5) if args.quick else (3, 20)

    rng = np.random.default_rng(0)
    a_np = rng.standard_normal((N, N), dtype=np.float32)
    b_np = rng.standard_normal((N, N), dtype=np.float32)
    a, b = mx.array(a_np), mx.array(b_np)
    mx.eval(a, b)

    expected = a_np @ b_np
    got = np.array(mx.matmul(a, b, stream=mx.cpu))
    max_abs_err = float(np.max(np.abs(got - expected)))
    if not np.allclose(got, expected, rtol=1e-4, atol=1e-3):
        raise SystemExit(f"MLX matmul disagrees with numpy: max abs error {max_abs_err}")

    def run_mlx() -> None:
        mx.eval(mx.matmul(a, b, stream=mx.cpu))

    def run_numpy() -> None:
        np.matmul(a_np, b_np)

    # MLX and numpy each own an OpenBLAS thread pool; idle pool threads busy-wait briefly after
    # work, so let one pool go quiet before timing the other.
    time.sleep(SETTLE_S)
    mlx_ms = time_ms(run_mlx, warmup=warmup, trials=trials)
    time.sleep(SETTLE_S)
    numpy_ms = time_ms(run_numpy, warmup=warmup, trials=trials)
    mlx_med, mlx_lo, mlx_hi = median_ci(mlx_ms)
    np_med, np_lo, np_hi = median_ci(numpy_ms)
    ratio, ratio_lo, ratio_hi = ratio_ci(mlx_ms, numpy_ms)
    return emit(
        "blas",
        {
            "mlx_fp32_ms": mlx_med,
            "mlx_fp32_ci": [mlx_lo, mlx_hi],
            "numpy_fp32_ms": np_med,
            "numpy_fp32_ci": [np_lo, np_hi],
            "ratio": ratio,
            "ratio_ci": [ratio_lo, ratio_hi],
            "target_ratio": 2.0,
            "n": N,
            "warmup": warmup,
            "trials": trials,
            "max_abs_err": max_abs_err,
            "blas_loaded": BLAS_STATUS.loaded,
            "shim_calls": shim_call_counts(),
            "mlx_fp32_trials_ms": mlx_ms,
            "numpy_fp32_trials_ms": numpy_ms,
        },
        args.quick,
    )


if __name__ == "__main__":
    main()
