"""What this machine allows: the fp32 GEMM rate, the one-token weight-streaming rate, and the
FLOP and byte counts of a forward pass, for benchmarks that print their floor.

Contract: ``gemm_gflops()`` times C = A @ B with A, B fp32 2048 x 2048 in MLX (``mx.eval`` inside
the timed call; the measurement of ``bench/blas.py``) and returns the median rate in GFLOP/s;
``stream_gbps()`` times ``x @ W`` with ``x (1, 8192)`` and ``W (8192, 8192)`` fp32 (256 MiB, the
shape of a one-token pass: every weight read once, memory-bound) and returns GB/s. ``counts``
gives a model's non-embedding parameter count, weight bytes and attention shape; ``pass_flops``
the FLOPs of one forward call of ``tokens`` queries over ``keys`` rows (2 x params x tokens for the
weights, 4 x tokens x keys x head_dim x heads x layers for attention); ``pass_floor_ms`` the
roofline time of one call: max(FLOPs / GEMM rate, bytes read / streaming rate), bytes being the
weights plus the K/V rows read once. It knows nothing about executors or caches.
"""

from __future__ import annotations

from common import median_ci, time_ms  # first: loads nexus_mlx + fast BLAS

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from nexus_mlx.models.arch import model_plan


def _median_ms(fn, warmup: int, trials: int) -> float:
    return median_ci(time_ms(fn, warmup, trials))[0]


def gemm_gflops(n: int = 2048, warmup: int = 2, trials: int = 7) -> float:
    """Median fp32 GEMM rate of MLX on the CPU (GFLOP/s)."""
    a = mx.random.normal((n, n), key=mx.random.key(0))
    b = mx.random.normal((n, n), key=mx.random.key(1))
    mx.eval(a, b)
    ms = _median_ms(lambda: mx.eval(mx.matmul(a, b, stream=mx.cpu)), warmup, trials)
    return 2 * n**3 / (ms * 1e-3) / 1e9


def stream_gbps(n: int = 8192, warmup: int = 2, trials: int = 7) -> float:
    """Median rate at which a one-row matmul reads an fp32 weight matrix (GB/s)."""
    x = mx.random.normal((1, n), key=mx.random.key(2))
    w = mx.random.normal((n, n), key=mx.random.key(3))
    mx.eval(x, w)
    ms = _median_ms(lambda: mx.eval(mx.matmul(x, w, stream=mx.cpu)), warmup, trials)
    return n * n * 4 / (ms * 1e-3) / 1e9


@dataclass(frozen=True)
class ModelCounts:
    params: int  # non-embedding parameters (the weights every token multiplies)
    weight_bytes: int  # bytes of those parameters as stored
    layers: int
    heads: int
    kv_heads: int
    head_dim: int


def counts(model: nn.Module) -> ModelCounts:
    """Parameter and attention counts of ``model`` (embeddings excluded: a token gathers one row)."""
    plan = model_plan(model)
    weights = [v for k, v in tree_flatten(model.parameters()) if "embed_tokens" not in k]
    return ModelCounts(sum(v.size for v in weights), sum(v.nbytes for v in weights),
                       plan.num_layers, plan.n_heads, plan.n_kv_heads, plan.head_dim)


def pass_flops(c: ModelCounts, tokens: int, keys: int) -> float:
    """FLOPs of one forward call: weights (2 x params x tokens) + attention (QK and PV)."""
    return 2.0 * c.params * tokens + 4.0 * tokens * keys * c.head_dim * c.heads * c.layers


def pass_floor_ms(c: ModelCounts, tokens: int, keys: int, gflops: float, gbps: float) -> float:
    """Roofline time of one call: compute-bound or weight/K-V-streaming-bound, whichever is
    slower (fp32 K/V rows read once per layer)."""
    kv_bytes = 2.0 * keys * c.kv_heads * c.head_dim * 4 * c.layers
    compute = pass_flops(c, tokens, keys) / (gflops * 1e9)
    memory = (c.weight_bytes + kv_bytes) / (gbps * 1e9)
    return max(compute, memory) * 1e3
