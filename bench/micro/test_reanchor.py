"""Fused RoPE re-anchor and write of one layer's block keys into a live K cache.

Geometry: SmolLM2-135M's layer (3 KV heads, width 64, RoPE base 1e5), a 235-token block (the
GitHub ``add_sub_issue`` schema's length) moved from anchor 0 to position 700 in a 1,024-row
float32 cache. Reference: the keys rotated at their new positions from scratch
(``apply_rope(x, at + t)``); every other cache row unchanged.
"""

import mlx.core as mx
import numpy as np

from nexus_mlx.kernels.reanchor_write import reanchor_write, reanchored_rows
from nexus_mlx.kv.rope import RopeSpec, apply_rope

H, S, D, C = 3, 235, 64, 1024
M0, AT = 0, 700
SPEC = RopeSpec(head_dim=D, dims=D, base=100000.0)


def _setup():
    rng = np.random.default_rng(0)
    x = mx.array(rng.standard_normal((1, H, S, D), dtype=np.float32))  # (1, H, S, D) unrotated
    block_k = apply_rope(x, np.arange(M0, M0 + S), SPEC)[0]  # (H, S, D) rotated at the anchor
    expected = apply_rope(x, np.arange(AT, AT + S), SPEC)[0]  # (H, S, D) rotated at AT
    cache_k = mx.array(rng.standard_normal((H, C, D), dtype=np.float32))  # (H, C, D)
    mx.eval(block_k, expected, cache_k)
    return block_k, expected, cache_k


def test_reanchor_rows(benchmark):
    block_k, expected, _ = _setup()
    rows = reanchored_rows(block_k, AT - M0, SPEC, mx.float32)
    np.testing.assert_allclose(np.array(rows), np.array(expected), atol=2e-5)

    benchmark.extra_info.update({"heads": H, "tokens": S, "head_dim": D})
    benchmark(lambda: mx.eval(reanchored_rows(block_k, AT - M0, SPEC, mx.float32)))


def test_reanchor_write(benchmark):
    block_k, expected, cache_k = _setup()
    out = np.array(reanchor_write(cache_k, block_k, AT, AT - M0, SPEC))
    np.testing.assert_allclose(out[:, AT : AT + S], np.array(expected), atol=2e-5)
    before = np.array(cache_k)
    np.testing.assert_array_equal(out[:, :AT], before[:, :AT])
    np.testing.assert_array_equal(out[:, AT + S :], before[:, AT + S :])

    benchmark.extra_info.update({"heads": H, "tokens": S, "head_dim": D, "cache_rows": C})
    benchmark(lambda: mx.eval(reanchor_write(cache_k, block_k, AT, AT - M0, SPEC)))
