"""SLB top-5 scan over N random 384-dim tool vectors (INT8, native SIMD path).

Reference: the scan spelled out in numpy from the buffer's public codes and scales (query
quantized the same way, int32 dot products, ranked by ``dot * row_scale``, ties to the lower
row); indices must match exactly and scores to float32 rounding.
"""

import numpy as np
import pytest

from nexus_mlx.kernels.int8_scan import quantize_rows
from nexus_mlx.routing.slb import SemanticLookasideBuffer

DIM, K = 384, 5


def _unit_rows(n: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _reference(slb: SemanticLookasideBuffer, query: np.ndarray, k: int):
    qcodes, qscale = quantize_rows(query[None, :])  # (1, D), (1,)
    dots = slb.codes[:, :DIM].astype(np.int32) @ qcodes[0].astype(np.int32)  # (N,)
    keys = dots.astype(np.float32) * slb.scales  # (N,)
    order = np.lexsort((np.arange(keys.size), -keys))[:k]
    return order, keys[order] * qscale[0]


@pytest.mark.parametrize("n", [250, 4076])
def test_slb_scan(benchmark, n):
    slb = SemanticLookasideBuffer(DIM, "random-unit-vectors")
    slb.add([f"tool_{i}" for i in range(n)], _unit_rows(n, seed=0))
    queries = _unit_rows(8, seed=1)
    for q in queries:
        idx, scores = slb.scan(q, K)
        ref_idx, ref_scores = _reference(slb, q, K)
        np.testing.assert_array_equal(idx, ref_idx)
        np.testing.assert_allclose(scores, ref_scores, rtol=1e-6)
    assert slb.recall_at_k(queries, K) >= 0.8  # INT8 vs the float32 scan

    benchmark.extra_info.update({"n": n, "dim": DIM, "k": K})
    benchmark(slb.scan, queries[0], K)
