"""The clean-state oracle (privileged: it looks at the answer).

``oracle``: recompute the whole suffix (Replay) on a scratch copy, then rank suffix tokens by
their all-layer KV deviation ``sum_l ||K_shift - K_replay||^2 + ||V_shift - V_replay||^2``.
It costs more than the repair it guides; it bounds what any allocator could pick.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from nexus_mlx.refresh.allocators import AllocationRequest, register, top_k_positions
from nexus_mlx.refresh.executors import refresh_packed


def kv_deviation(shifted, replayed, start: int) -> np.ndarray:
    """Per-row all-layer squared K/V deviation of rows ``[start, n_past)``, ``(S,)``."""
    total = mx.zeros((shifted.n_past - start,), dtype=mx.float32)
    for layer in range(shifted.num_layers):
        for a, b in ((shifted.keys(layer), replayed.keys(layer)),
                     (shifted.values(layer), replayed.values(layer))):
            diff = (a[0, :, start:, :] - b[0, :, start:, :]).astype(mx.float32)  # (H, S, D)
            total = total + (diff * diff).sum(axis=(0, 2))
    return np.array(total)


@register("oracle")
def oracle(request: AllocationRequest) -> np.ndarray:
    start = request.edit.p0
    replayed = request.shifted.copy()
    refresh_packed(request.model, replayed, np.arange(start, replayed.n_past))
    return top_k_positions(kv_deviation(request.shifted, replayed, start), request.budget)
