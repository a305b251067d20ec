"""Build an mlx-lm model module from a config dict and a weight dict.

Contract: ``build_model(config, weights, dtype, quantization)`` returns the mlx-lm ``Model`` of
the config's architecture with every weight loaded (strict: no missing or unexpected keys), in
evaluation mode. Quantized weights arrive as MLX triplets (``<p>.weight`` packed uint32,
``<p>.scales``, ``<p>.biases``) described by ``quantization[<p>] = (group_size, bits)``; with a
float ``dtype`` they are dequantized, otherwise the matching layers are quantized in place.

It does not know where weights come from (GGUF, safetensors) nor anything about tokenizers.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from nexus_mlx.errors import ModelFormatError

# model_type in a config -> the mlx-lm module implementing it. The engine (models/arch.py)
# supports exactly these.
MLX_LM_MODULES: dict[str, str] = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma2": "gemma2",
    "gemma3_text": "gemma3_text",
}


def default_dtype() -> mx.Dtype | None:
    """float32 on CPU (MLX's CPU half/quantized matmuls are 10-100x slower); None (keep the
    file's precision) on a GPU."""
    return mx.float32 if mx.default_device() == mx.cpu else None


def model_classes(config: Mapping[str, Any]) -> tuple[Any, Any]:
    """The mlx-lm (Model, ModelArgs) classes for ``config['model_type']``."""
    model_type = config.get("model_type")
    module_name = MLX_LM_MODULES.get(str(model_type))
    if module_name is None:
        raise ModelFormatError(
            f"model_type {model_type!r} is not supported; supported: {sorted(MLX_LM_MODULES)}"
        )
    module = importlib.import_module(f"mlx_lm.models.{module_name}")
    return module.Model, module.ModelArgs


def _dequantize_triplets(
    weights: dict[str, mx.array], quantization: Mapping[str, tuple[int, int]], dtype: mx.Dtype
) -> dict[str, mx.array]:
    out = dict(weights)
    for prefix, (group_size, bits) in quantization.items():
        keys = [f"{prefix}.weight", f"{prefix}.scales", f"{prefix}.biases"]
        missing = [k for k in keys if k not in out]
        if missing:
            raise ModelFormatError(f"quantized tensor {prefix!r} lacks {missing}")
        w, scales, biases = (out.pop(k) for k in keys)
        # in float32: float16 scales would round every dequantized weight to float16
        scales, biases = scales.astype(mx.float32), biases.astype(mx.float32)
        out[f"{prefix}.weight"] = mx.dequantize(
            w, scales, biases, group_size=group_size, bits=bits
        ).astype(dtype)
    return out


def _quantize_layers(model: nn.Module, quantization: Mapping[str, tuple[int, int]]) -> None:
    by_params = {}
    for prefix, (group_size, bits) in quantization.items():
        by_params[prefix] = {"group_size": group_size, "bits": bits}

    def predicate(path: str, module: nn.Module) -> bool | dict[str, int]:
        return by_params.get(path, False)

    nn.quantize(model, class_predicate=predicate)


def build_model(
    config: Mapping[str, Any],
    weights: Mapping[str, mx.array],
    dtype: mx.Dtype | None = None,
    quantization: Mapping[str, tuple[int, int]] | None = None,
) -> nn.Module:
    """Instantiate the mlx-lm model for ``config`` and load ``weights`` into it.

    ``dtype`` None keeps quantized layers quantized and float tensors as stored; a float dtype
    dequantizes everything and casts every floating tensor to it.
    """
    model_cls, args_cls = model_classes(config)
    model = model_cls(args_cls.from_dict(dict(config)))
    quantization = dict(quantization or {})
    tensors = dict(weights)
    if dtype is not None and quantization:
        tensors = _dequantize_triplets(tensors, quantization, dtype)
        quantization = {}
    if hasattr(model, "sanitize"):
        tensors = model.sanitize(tensors)
    if quantization:
        _quantize_layers(model, quantization)
    if dtype is not None:
        tensors = {
            k: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v
            for k, v in tensors.items()
        }
    try:
        model.load_weights(list(tensors.items()), strict=True)
    except ValueError as exc:
        raise ModelFormatError(f"weights do not match the {config.get('model_type')} model: {exc}") from exc
    mx.eval(model.parameters())
    model.eval()
    return model
