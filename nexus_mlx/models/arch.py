"""What the engine needs to know about a loaded mlx-lm model, per architecture.

Contract: ``model_plan(model)`` reads an mlx-lm ``Model`` of a supported architecture (llama,
qwen2, qwen3, gemma2, gemma3_text) and returns a frozen :class:`ModelPlan`: shapes, one
:class:`LayerPlan` per layer (RoPE regime, sliding window, attention soft-cap, QK-norm), the
embedding scale, the final logit soft-cap and the V layout the cache should use. The plan is
computed once and memoised on the model object.

The plan mirrors what mlx-lm's modules compute, so that ``models.forward`` can reuse the module's
own projections, norms and MLPs while controlling positions and the cache. Like mlx-lm, gemma2
layers attend globally: Gemma-2's 4,096-token sliding window is not modelled (it only matters
past 4,096 tokens).

It does not know about caches, positions or tokenizers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from nexus_mlx.errors import ModelFormatError
from nexus_mlx.kv.rope import RopeSpec

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma2", "gemma3_text")
SWIGLU_ARCHITECTURES = ("llama", "qwen2", "qwen3")  # MLP: down(silu(gate(x)) * up(x))
_PLAN_ATTR = "_nexus_model_plan"


@dataclass(frozen=True)
class LayerPlan:
    rope: RopeSpec
    window: int | None  # a key at p is visible from q only if 0 <= q - p < window
    softcap: float | None  # attention logit soft-cap (tanh), forbids fused SDPA
    qk_norm: bool
    scale: float  # attention score scale


@dataclass(frozen=True)
class ModelPlan:
    architecture: str
    num_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position: int | None
    layers: tuple[LayerPlan, ...]
    embed_scale: float | None  # gemma multiplies embeddings by sqrt(hidden)
    final_softcap: float | None
    sandwich_norms: bool  # gemma: norms after attention/MLP outputs and before the MLP
    tied_embeddings: bool

    @property
    def v_layout(self) -> str:
        """'transposed' (token-innermost V) for soft-capped models, as llama.cpp does without
        flash attention; 'row' otherwise."""
        return "transposed" if any(layer.softcap for layer in self.layers) else "row"

    @property
    def rope_specs(self) -> tuple[RopeSpec, ...]:
        return tuple(layer.rope for layer in self.layers)


def model_plan(model: nn.Module) -> ModelPlan:
    """The memoised :class:`ModelPlan` of an mlx-lm model."""
    plan = model.__dict__.get(_PLAN_ATTR)
    if plan is None:
        plan = _build_plan(model)
        object.__setattr__(model, _PLAN_ATTR, plan)
    return plan


def _arch_of(model: nn.Module) -> str:
    arch = getattr(model, "model_type", None) or getattr(getattr(model, "args", None), "model_type", None)
    if arch == "mistral":
        arch = "llama"
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelFormatError(
            f"architecture {arch!r} is not supported by the engine; supported: {SUPPORTED_ARCHITECTURES}"
        )
    return str(arch)


def _rope(args: Any, head_dim: int, base: float, scaling: Any, traditional: bool) -> RopeSpec:
    return RopeSpec.from_config(
        head_dim=head_dim,
        base=base,
        traditional=traditional,
        scaling_config=scaling,
        max_position_embeddings=getattr(args, "max_position_embeddings", None),
    )


def _layer_plans(arch: str, model: nn.Module, args: Any, head_dim: int) -> tuple[LayerPlan, ...]:
    plans = []
    for layer in model.layers:
        attn = layer.self_attn
        window = None
        softcap = None
        base, scaling = args.rope_theta, getattr(args, "rope_scaling", None)
        traditional = bool(getattr(args, "rope_traditional", False))
        if arch == "llama" and getattr(layer, "use_sliding", False):
            window = args.sliding_window
        elif arch == "gemma2":
            softcap = float(args.attn_logit_softcapping)
        elif arch == "gemma3_text" and attn.is_sliding:
            window, base, scaling = args.sliding_window, args.rope_local_base_freq, None
        if arch in ("qwen3", "gemma3_text"):
            traditional = False
        plans.append(
            LayerPlan(
                rope=_rope(args, head_dim, base, scaling, traditional),
                window=int(window) if window else None,
                softcap=softcap,
                qk_norm=arch in ("qwen3", "gemma3_text"),
                scale=float(attn.scale),
            )
        )
    return tuple(plans)


def _build_plan(model: nn.Module) -> ModelPlan:
    arch = _arch_of(model)
    args = model.args
    attn0 = model.layers[0].self_attn
    head_dim = int(getattr(attn0, "head_dim", 0) or args.hidden_size // args.num_attention_heads)
    embed_scale = None
    if arch == "gemma2":
        embed_scale = args.hidden_size**0.5
    elif arch == "gemma3_text":  # mlx-lm rounds the scale through bfloat16
        embed_scale = mx.array(args.hidden_size**0.5, mx.bfloat16).astype(mx.float32).item()
    tied = "lm_head" not in model
    return ModelPlan(
        architecture=arch,
        num_layers=len(model.layers),
        hidden_size=int(args.hidden_size),
        n_heads=int(attn0.n_heads),
        n_kv_heads=int(attn0.n_kv_heads),
        head_dim=head_dim,
        vocab_size=int(args.vocab_size),
        max_position=getattr(args, "max_position_embeddings", None),
        layers=_layer_plans(arch, model, args, head_dim),
        embed_scale=embed_scale,
        final_softcap=float(args.final_logit_softcapping) if arch == "gemma2" else None,
        sandwich_norms=arch in ("gemma2", "gemma3_text"),
        tied_embeddings=tied,
    )
