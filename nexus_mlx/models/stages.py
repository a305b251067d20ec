"""Per-stage, per-layer timing of a forward pass at ``mx.eval`` boundaries.

Contract: pass a :class:`StageProfile` as ``profile=`` to ``models.forward.forward`` (or
``forward_hidden``); every stage of every layer (``qkv``, ``rope``, ``write``, ``scores``,
``softmax``, ``pv`` or, on the blocked CPU path, ``attention``, ``o_proj``, ``mlp``, plus
``embed`` and ``head``) is then evaluated where it ends and the wall time since the previous
boundary is added to ``totals[stage]`` and ``layers[layer][stage]`` (milliseconds). Profiling
changes what it measures a little (every boundary is a sync, so nothing overlaps across
stages); without a profile nothing is evaluated and no clock is read. It knows nothing about
what the stages compute.
"""

from __future__ import annotations

import time
from collections import defaultdict

import mlx.core as mx


class StageProfile:
    """Accumulated stage times of one or more forward calls (milliseconds)."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self.layers: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.calls = 0
        self._last: float | None = None

    def start(self) -> None:
        """Begin timing at a boundary (the forward pass calls this once its inputs exist)."""
        self.calls += 1
        self._last = time.perf_counter()

    def mark(self, stage: str, layer: int | None, *arrays: mx.array) -> None:
        """Evaluate ``arrays`` and charge the time since the last boundary to ``stage``."""
        mx.eval(*arrays)
        now = time.perf_counter()
        spent = (now - (self._last if self._last is not None else now)) * 1e3
        self.totals[stage] += spent
        if layer is not None:
            self.layers[layer][stage] += spent
        self._last = now

    def as_dict(self) -> dict[str, object]:
        """``{"calls", "total_ms", "stages_ms", "layers_ms"}``, per call on average."""
        per = max(self.calls, 1)
        return {
            "calls": self.calls,
            "total_ms": sum(self.totals.values()) / per,
            "stages_ms": {k: v / per for k, v in self.totals.items()},
            "layers_ms": [{k: v / per for k, v in self.layers[i].items()}
                          for i in sorted(self.layers)],
        }
