"""Fused input projections: one matmul for q/k/v and one for gate/up, over the module's own weights.

Contract: ``fused_layer(model, i)`` returns layer ``i``'s :class:`FusedLayer` (built once for the
whole model and memoised on it) or None where the layer cannot be fused. Building it
concatenates, layer by layer, the q, k and v weights (and biases) row-wise into one array, and
likewise a SwiGLU MLP's gate and up weights, then rebinds the modules' own ``weight``/``bias``
as row slices of the fused arrays. Row slices of an evaluated array share its buffer, so the
model still holds every value once, and anything that calls the modules (mlx-lm's own forward
included) computes exactly what it did. :meth:`FusedLayer.qkv` and :meth:`FusedLayer.gate_up`
then give the projections from one matmul. Why: in a decode step every projection is a
matrix-vector product, and on the 2-core CPU three small products (SmolLM2's k and v are
192 x 576) cost clearly more than one over the same rows (the decode rows of
``results/engine.json``).

Only plain float ``nn.Linear`` projections of one dtype are fused; a quantized or wrapped
(LoRA) projection leaves that part of its layer unfused. A fused part is used only while the
modules still hold the slices it bound (checked by identity on every call, a few attribute
reads): a weight the caller replaced afterwards (``load_weights``, ``update``) makes the layer
fall back to its modules, never to stale values. ``NEXUS_MLX_FUSE=0`` turns fusing off (read
when a model is first fused). It knows nothing about positions, caches or attention.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from nexus_mlx.models.arch import SWIGLU_ARCHITECTURES, model_plan

ENV_VAR = "NEXUS_MLX_FUSE"
_FUSED_ATTR = "_nexus_fused_layers"


@dataclass(frozen=True)
class FusedProjection:
    """Several ``nn.Linear`` modules over one input, as one weight (and bias) array."""

    modules: tuple[nn.Linear, ...]
    weight: mx.array  # (sum of out features, in features)
    bias: mx.array | None
    splits: tuple[int, ...]  # row offsets between the parts
    weight_views: tuple[mx.array, ...]  # what each module's weight was bound to
    bias_views: tuple[mx.array | None, ...]

    def current(self) -> bool:
        """Whether every module still holds the slices bound at fusion (identity)."""
        parts = zip(self.modules, self.weight_views, self.bias_views, strict=True)
        return all(m.weight is w and (b is None or m.bias is b) for m, w, b in parts)

    def __call__(self, x: mx.array) -> list[mx.array]:
        """Each module's output on ``x (..., in)``, from one matmul."""
        y = x @ self.weight.T if self.bias is None else mx.addmm(self.bias, x, self.weight.T)
        return list(mx.split(y, list(self.splits), axis=-1))


@dataclass(frozen=True)
class FusedLayer:
    attention: FusedProjection | None  # q, k, v
    mlp: FusedProjection | None  # gate, up (SwiGLU only)

    def qkv(self) -> FusedProjection | None:
        return self.attention if self.attention is not None and self.attention.current() else None

    def gate_up(self) -> FusedProjection | None:
        return self.mlp if self.mlp is not None and self.mlp.current() else None


def fused_layer(model: nn.Module, index: int) -> FusedLayer | None:
    """Layer ``index``'s fused projections (the model's layers are fused on first use)."""
    layers = model.__dict__.get(_FUSED_ATTR)
    if layers is None:
        layers = fuse_model(model)
    return layers[index]


def fuse_model(model: nn.Module, *, swiglu: bool | None = None) -> tuple[FusedLayer | None, ...]:
    """Fuse every layer of ``model`` (see the module docstring) and memoise the result on it.
    ``swiglu`` says whether the MLPs are ``down(act(gate(x)) * up(x))`` with gate/up to fuse
    (default: read from the model plan)."""
    if swiglu is None:
        swiglu = model_plan(model).architecture in SWIGLU_ARCHITECTURES
    enabled = os.environ.get(ENV_VAR, "1") != "0"
    layers = tuple(_fuse_layer(layer, swiglu) if enabled else None for layer in model.layers)
    object.__setattr__(model, _FUSED_ATTR, layers)
    return layers


def _fuse_layer(layer: nn.Module, swiglu: bool) -> FusedLayer | None:
    attn = layer.self_attn
    attention = _fuse([attn.q_proj, attn.k_proj, attn.v_proj])
    mlp = _fuse([layer.mlp.gate_proj, layer.mlp.up_proj]) if swiglu else None
    return FusedLayer(attention, mlp) if attention or mlp else None


def _fusable(modules: Sequence[nn.Module]) -> bool:
    if not all(type(m) is nn.Linear for m in modules):
        return False  # quantized, LoRA-wrapped or custom projections keep their own call
    weights = [m.weight for m in modules]
    has_bias = ["bias" in m for m in modules]
    return (len({w.dtype for w in weights}) == 1 and mx.issubdtype(weights[0].dtype, mx.floating)
            and len({w.shape[1] for w in weights}) == 1 and len(set(has_bias)) == 1)


def _fuse(modules: Sequence[nn.Linear]) -> FusedProjection | None:
    """Concatenate the modules' weights and rebind them as views (None if they do not fit)."""
    if not _fusable(modules):
        return None
    rows = [m.weight.shape[0] for m in modules]
    offsets = [sum(rows[:i]) for i in range(len(rows) + 1)]
    weight = mx.concatenate([m.weight for m in modules], axis=0)
    bias = mx.concatenate([m.bias for m in modules]) if "bias" in modules[0] else None
    mx.eval(weight, *([bias] if bias is not None else []))
    weight_views, bias_views = [], []
    for m, lo, hi in zip(modules, offsets, offsets[1:], strict=False):
        m.weight = weight[lo:hi]
        weight_views.append(m.weight)
        if bias is not None:
            m.bias = bias[lo:hi]
        bias_views.append(m.bias if bias is not None else None)
    mx.eval(*weight_views, *[b for b in bias_views if b is not None])  # views share the buffer
    return FusedProjection(tuple(modules), weight, bias, tuple(offsets[1:-1]),
                           tuple(weight_views), tuple(bias_views))
