"""Weight twins for a loaded model: which of its matrices decode steps read from one-byte codes.

Contract: ``attach_twins(model)`` builds the twin (:mod:`nexus_mlx.kernels.weight_twins`) of
every float32 weight matrix a few-row product reads: each layer's projections (the fused q/k/v
and gate/up arrays, and their modules' row views), and the output head (the embedding matrix
where the head is tied to it; an untied embedding is only gathered from, so it gets none). A
matrix that is not an exact grid (weights trained or stored in float) is left as it is and named
in the report. It returns a :class:`TwinReport` and is idempotent (a second call returns the
first report). The twins live as long as the model: when it is collected they are unregistered
and freed. ``detach_twins(model)`` drops them sooner.

It applies only where the shim reads twins (Linux CPU with the BLAS shim loaded, default device
CPU, float32 weights) and ``NEXUS_MLX_WEIGHT_TWINS`` is not ``0``; elsewhere it attaches nothing
and says why. Nothing else changes: the model's modules, arrays and results are the same (a product
that reads a twin sums the same float32 weights in another order).

Cost: the twins take 1.25 bytes a weight (blocks of 32) or 1.5 (blocks of 16) beside the
float32 matrices, and building them reads every matrix once (a few seconds per GB). A weight
replaced after attaching (``load_weights``) is read from its new float32 array: correct, slower.
It knows nothing about files, tokenizers or caches.
"""

from __future__ import annotations

import os
import time
import weakref
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from nexus_mlx._platform import blas
from nexus_mlx.kernels import weight_twins
from nexus_mlx.models.fused import fused_layer

ENV_VAR = "NEXUS_MLX_WEIGHT_TWINS"
_ATTR = "_nexus_weight_twins"


@dataclass(frozen=True)
class TwinReport:
    """What :func:`attach_twins` did."""

    matrices: int  # matrices products now read from twins (row views included)
    encoded: int  # twins built (one per distinct buffer)
    declined: tuple[str, ...]  # matrices left to float32: not an exact grid
    twin_bytes: int  # bytes of the twins built
    weight_bytes: int  # float32 bytes of the matrices they stand for
    seconds: float
    reason: str  # one sentence: attached, or why not


@dataclass
class _Attached:
    report: TwinReport
    keys: list[tuple[int, int, int]]
    finalizer: weakref.finalize


def _matrices(model: nn.Module) -> list[tuple[str, mx.array]]:
    """The model's float32 two-dimensional parameters, by name."""
    params: list[tuple[str, mx.array]]
    params = tree_flatten(model.parameters())  # type: ignore[assignment]
    return [(n, a) for n, a in params if a.ndim == 2 and a.dtype == mx.float32]


def _applies(model: nn.Module) -> str | None:
    """Why twins do not apply to ``model`` here, or None."""
    if os.environ.get(ENV_VAR, "1").strip() == "0":
        return f"turned off by {ENV_VAR}=0"
    if not blas.BLAS_STATUS.loaded or not blas.twin_routing():
        return "the BLAS shim is not loaded or does not read twins"
    if mx.default_device() != mx.cpu:
        return "the default device is not the CPU"
    if not _matrices(model):
        return "the model has no float32 weight matrices"
    return None


def _candidates(model: nn.Module) -> list[tuple[str, mx.array]]:
    """The matrices few-row products read, whole fused arrays first, largest first."""
    layers = getattr(model, "layers", None) or []
    fused: list[tuple[str, mx.array]] = []
    for i in range(len(layers)):
        layer = fused_layer(model, i)  # fuses the model first, so the views below are current
        if layer is None:
            continue
        for part, projection in (("qkv", layer.attention), ("gate_up", layer.mlp)):
            if projection is not None and projection.weight.dtype == mx.float32:
                fused.append((f"layers.{i}.{part}", projection.weight))
    params = _matrices(model)
    tied = not any(n.endswith("lm_head.weight") for n, _ in params)
    params = [(n, a) for n, a in params if tied or not n.endswith("embed_tokens.weight")]
    return sorted(fused, key=lambda p: -p[1].size) + sorted(params, key=lambda p: -p[1].size)


def _detach(keys: list[tuple[int, int, int]]) -> None:
    for key in keys:
        weight_twins.unregister_key(key)


def attach_twins(model: nn.Module) -> TwinReport:
    """Build and register the twins of ``model``'s matrices (module docstring)."""
    attached = model.__dict__.get(_ATTR)
    if attached is not None:
        return attached.report
    start = time.perf_counter()
    why_not = _applies(model)
    if why_not is not None:
        return TwinReport(0, 0, (), 0, 0, 0.0, f"no twins: {why_not}")
    keys: list[tuple[int, int, int]] = []
    declined: list[str] = []
    encoded = twin_bytes = weight_bytes = 0
    for name, array in _candidates(model):  # whole fused arrays first: their views share codes
        if weight_twins.registered_key(array) is not None:
            continue
        if weight_twins.register_view(array):
            keys.append(weight_twins.registered_key(array))  # type: ignore[arg-type]
            continue
        twin = weight_twins.encode_twin(weight_twins.host_matrix(array))
        if twin is None or not weight_twins.register(array, twin, check=False):
            declined.append(name)
            continue
        keys.append(weight_twins.registered_key(array))  # type: ignore[arg-type]
        encoded += 1
        twin_bytes += twin.nbytes
        weight_bytes += array.nbytes
    report = TwinReport(len(keys), encoded, tuple(declined), twin_bytes, weight_bytes,
                        time.perf_counter() - start,
                        f"{len(keys)} matrices read from twins ({twin_bytes / 2**20:.0f} MiB "
                        f"for {weight_bytes / 2**20:.0f} MiB of float32)"
                        + (f"; {len(declined)} left to float32" if declined else ""))
    finalizer = weakref.finalize(model, _detach, keys)
    object.__setattr__(model, _ATTR, _Attached(report, keys, finalizer))
    return report


def detach_twins(model: nn.Module) -> bool:
    """Unregister and free ``model``'s twins now; whether it had any."""
    attached = model.__dict__.pop(_ATTR, None)
    if attached is None:
        return False
    attached.finalizer()  # runs _detach once, and never again at collection
    return bool(attached.keys)


def twin_report(model: nn.Module) -> TwinReport | None:
    """The report of the twins attached to ``model``, or None."""
    attached = model.__dict__.get(_ATTR)
    return attached.report if attached is not None else None
