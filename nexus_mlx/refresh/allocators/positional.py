"""Allocators that need only positions: LegoLink-adapted.

``legolink``: the suffix is cut into 512-token chunks (counted from the edit seam); tokens are
ranked by their depth from the start of their chunk (shallow first; earlier wins ties), the
tokens a chunk boundary leaves with the least context of their own.
"""

from __future__ import annotations

import numpy as np

from nexus_mlx.refresh.allocators import AllocationRequest, register, top_k_positions

LEGOLINK_CHUNK = 512


@register("legolink")
def legolink(request: AllocationRequest) -> np.ndarray:
    chunk = int(request.options.get("chunk", LEGOLINK_CHUNK))
    depth = np.arange(request.suffix_length) % chunk
    return top_k_positions(-depth.astype(np.float64), request.budget)
