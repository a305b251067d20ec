"""Tiny random-weight models built from real mlx-lm ``ModelArgs`` (hidden 64, 2 layers,
4 query heads / 2 KV heads), one per supported architecture and RoPE variant."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from nexus_mlx.models.build import model_classes

VOCAB = 128

_COMMON: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "vocab_size": VOCAB,
    "max_position_embeddings": 4096,
}

CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", "rope_theta": 10000.0, "tie_word_embeddings": True},
    "llama-untied": {"model_type": "llama", "rope_theta": 10000.0, "tie_word_embeddings": False},
    "llama-traditional": {"model_type": "llama", "rope_theta": 500.0, "rope_traditional": True},
    "llama-linear": {"model_type": "llama", "rope_scaling": {"type": "linear", "factor": 2.0}},
    "llama-llama3": {
        "model_type": "llama",
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
        },
    },
    "llama-yarn": {
        "model_type": "llama",
        "rope_scaling": {
            "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
            "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.5,
        },
    },
    "llama-sliding": {
        "model_type": "llama",
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 8,
    },
    "qwen2": {"model_type": "qwen2", "rope_theta": 1000000.0, "tie_word_embeddings": False},
    "qwen3": {
        "model_type": "qwen3", "head_dim": 16, "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
    },
    "gemma2": {
        "model_type": "gemma2", "head_dim": 16, "query_pre_attn_scalar": 16.0,
        "attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0,
    },
    "gemma3": {
        "model_type": "gemma3_text", "head_dim": 16, "query_pre_attn_scalar": 16.0,
        "sliding_window": 8, "sliding_window_pattern": 2, "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0},
    },
}

ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma2", "gemma3")


def random_model(config: dict[str, Any], seed: int = 0) -> nn.Module:
    """An evaluated float32 model of ``config`` (mlx-lm keys) with MLX's random initialisation."""
    model_cls, args_cls = model_classes(config)
    mx.random.seed(seed)
    model = model_cls(args_cls.from_dict(config))
    mx.eval(model.parameters())
    model.eval()
    return model


def tiny_model(name: str, seed: int = 0, **overrides: Any) -> nn.Module:
    """A float32 model with MLX's random initialisation and randomised norm weights;
    ``overrides`` replace config keys (``vocab_size=8192``: a larger head)."""
    model = random_model({**_COMMON, **CONFIGS[name], **overrides}, seed)
    if model.model_type == "gemma3_text":  # as when a checkpoint has no lm_head: tied
        model.sanitize({})
    offset = 0.0 if model.model_type in ("gemma2", "gemma3_text") else 1.0  # gemma: (1 + w)
    norms = [
        (key, offset + 0.1 * mx.random.normal(value.shape))
        for key, value in tree_flatten(model.parameters())
        if "norm" in key
    ]
    model.load_weights(norms, strict=False)
    mx.eval(model.parameters())
    model.eval()
    return model
