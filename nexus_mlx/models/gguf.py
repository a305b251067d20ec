"""Load GGUF model files (llama.cpp's format) as mlx-lm weights, config and tokenizer.

Contract: ``read_gguf(path)`` parses the file (``gguf_format``), renames every tensor to its
mlx-lm module path (``blk.0.attn_q.weight`` -> ``model.layers.0.self_attn.q_proj.weight``),
undoes llama.cpp's conversion-time transforms (the Q/K row permutation of llama-architecture
files, applied to packed weights, scales and biases alike; the ``+1`` folded into Gemma RMSNorm
weights), maps the metadata to an HF-style ``config.json`` dict and rebuilds the tokenizer
(``gguf_tokenizer``). ``load_gguf(path, dtype)`` turns that into an mlx-lm model via
:func:`build_model`. Unknown architectures and tensors raise
:class:`ModelFormatError` naming them; missing or nonsensical metadata raises
:class:`ModelFormatError`.

Supported: llama, qwen2, qwen3, gemma2, gemma3 (-> mlx-lm ``gemma3_text``). It does not know:
split (multi-file) GGUFs, llama3-style ``rope_freqs`` factors, per-layer head counts, where a file
comes from (``packages``, ``load``). mlx-lm's gemma2 attends globally (no sliding window).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.tokenizer_utils import TokenizerWrapper

from nexus_mlx.errors import ModelFormatError
from nexus_mlx.models.build import build_model
from nexus_mlx.models.gguf_format import GGUFFile, convert_tensor, parse_gguf
from nexus_mlx.models.gguf_tokenizer import TOKENIZER_ARRAYS, build_tokenizer

__all__ = ["ARCHITECTURES", "GGUFContents", "gguf_config", "load_gguf", "mlx_name", "read_gguf"]

# --------------------------------------------------------------------------- architectures


@dataclass(frozen=True)
class _Arch:
    model_type: str  # mlx-lm model_type
    permute_qk: bool  # llama.cpp interleaved Q/K rows for its NORM RoPE
    norm_offset: float  # folded into every "*norm.weight" by the converter
    ffn_norm: str  # what blk.N.ffn_norm is in the HF model


ARCHITECTURES: dict[str, _Arch] = {
    "llama": _Arch("llama", True, 0.0, "post_attention_layernorm"),
    "qwen2": _Arch("qwen2", False, 0.0, "post_attention_layernorm"),
    "qwen3": _Arch("qwen3", False, 0.0, "post_attention_layernorm"),
    "gemma2": _Arch("gemma2", False, 1.0, "pre_feedforward_layernorm"),
    "gemma3": _Arch("gemma3_text", False, 1.0, "pre_feedforward_layernorm"),
}

_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.([a-z_]+)\.(weight|bias)")


def mlx_name(gguf_name: str, arch: str) -> str:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight`` (for ``arch``)."""
    spec = ARCHITECTURES[arch]
    module, _, kind = gguf_name.rpartition(".")
    if module in _GLOBAL_NAMES and kind == "weight":
        return f"{_GLOBAL_NAMES[module]}.{kind}"
    match = _BLOCK_RE.fullmatch(gguf_name)
    names = dict(_BLOCK_NAMES, ffn_norm=spec.ffn_norm)
    if match is None or match[2] not in names:
        if gguf_name == "rope_freqs.weight":
            raise ModelFormatError(
                f"{gguf_name!r} (llama3-style per-frequency RoPE factors) is not supported"
            )
        raise ModelFormatError(
            f"tensor {gguf_name!r} has no counterpart in the mlx-lm {spec.model_type} model"
        )
    return f"model.layers.{match[1]}.{names[match[2]]}.{match[3]}"


def _unpermute_rows(rows: int, n_heads: int) -> np.ndarray:
    """Row order that undoes llama.cpp's ``permute`` (per head: interleaved -> half-split)."""
    if n_heads <= 0 or rows % (2 * n_heads):
        raise ModelFormatError(f"cannot un-permute {rows} Q/K rows over {n_heads} heads")
    idx = np.arange(rows).reshape(n_heads, rows // n_heads // 2, 2)
    return idx.transpose(0, 2, 1).reshape(-1)


# --------------------------------------------------------------------------- config


def _meta(md: dict[str, Any], key: str, path: Path, default: Any = ...) -> float:
    """A numeric metadata value (a per-layer array must hold one value)."""
    value = md.get(key, default)
    if value is ...:
        raise ModelFormatError(f"GGUF file {path} lacks the metadata key {key!r}")
    if isinstance(value, np.ndarray) and value.dtype.kind in "iuf":
        if value.size == 0 or not (value == value.flat[0]).all():
            raise ModelFormatError(f"{key} varies per layer ({value.tolist()})")
        value = value.flat[0].item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ModelFormatError(f"GGUF file {path}: metadata {key} = {value!r} is not a number")
    return value


def _rope_scaling(md: dict[str, Any], a: str, path: Path) -> dict[str, Any] | None:
    """``rope.scaling.*`` as an HF ``rope_scaling`` dict (None: no scaling)."""
    kind = md.get(f"{a}.rope.scaling.type", "none")
    if kind == "none":
        return None
    factor = _positive(md, f"{a}.rope.scaling.factor", path, 1.0)
    if kind == "linear":
        return None if factor == 1.0 else {"type": "linear", "factor": factor}
    if kind == "yarn":
        out: dict[str, Any] = {"type": "yarn", "factor": factor}
        for gguf_key, hf_key in (("original_context_length", "original_max_position_embeddings"),
                                 ("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
            if f"{a}.rope.scaling.{gguf_key}" in md:
                value = _positive(md, f"{a}.rope.scaling.{gguf_key}", path)
                out[hf_key] = int(value) if hf_key.startswith("original") else value
        return out
    raise ModelFormatError(f"{path}: {a}.rope.scaling.type {kind!r} is not supported")


def _sliding_pattern(md: dict[str, Any], a: str, n_layers: int, path: Path) -> int:
    """Gemma 3's period of local/global layers (llama.cpp's default: 6)."""
    key = f"{a}.attention.sliding_window_pattern"
    value = md.get(key, 6)
    if isinstance(value, np.ndarray) and value.dtype == bool:  # per-layer "is sliding" flags
        flags = value.tolist()
        n = flags.index(False) + 1 if False in flags else n_layers + 1
        if flags != [(i + 1) % n != 0 for i in range(len(flags))]:
            raise ModelFormatError(f"sliding window layer pattern {flags} is not periodic")
    else:
        n = int(_meta(md, key, path, 6))
    if not 1 <= n <= n_layers:  # mlx-lm's gemma3_text indexes layer n-1 for the global mask
        raise ModelFormatError(
            f"{path}: sliding window pattern {n} does not fit {n_layers} layers (mlx-lm needs 1..{n_layers})"
        )
    return n


def _count(md: dict[str, Any], key: str, path: Path, default: Any = ...) -> int:
    value = _meta(md, key, path, default)
    if value != int(value) or value <= 0:
        raise ModelFormatError(f"GGUF file {path}: metadata {key} = {value!r} is not a positive count")
    return int(value)


def _positive(md: dict[str, Any], key: str, path: Path, default: Any = ...) -> float:
    value = float(_meta(md, key, path, default))
    if not 0 < value < float("inf"):
        raise ModelFormatError(f"GGUF file {path}: metadata {key} = {value!r} is not a positive number")
    return value


def _shape_config(file: GGUFFile, a: str) -> dict[str, Any]:
    """Sizes every architecture shares, checked for consistency."""
    md, path = file.metadata, file.path
    if "token_embd.weight" not in file.tensors:
        raise ModelFormatError(f"GGUF file {path} has no token_embd.weight tensor")
    hidden = _count(md, f"{a}.embedding_length", path)
    heads = _count(md, f"{a}.attention.head_count", path)
    kv_heads = _count(md, f"{a}.attention.head_count_kv", path, heads)
    head_dim = _count(md, f"{a}.attention.key_length", path, max(hidden // heads, 1))
    if heads % kv_heads:
        raise ModelFormatError(f"GGUF file {path}: {heads} query heads over {kv_heads} KV heads")
    if _count(md, f"{a}.rope.dimension_count", path, head_dim) != head_dim:
        raise ModelFormatError(f"{path}: partial RoPE (rotary dims != head dim {head_dim})")
    return {
        "hidden_size": hidden,
        "num_hidden_layers": _count(md, f"{a}.block_count", path),
        "intermediate_size": _count(md, f"{a}.feed_forward_length", path),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": file.tensors["token_embd.weight"].shape[0],
        "max_position_embeddings": _count(md, f"{a}.context_length", path),
    }


def gguf_config(file: GGUFFile, arch: str) -> dict[str, Any]:
    """The HF/mlx-lm ``config.json`` dict this file's metadata describes."""
    md, path, a = file.metadata, file.path, arch
    config: dict[str, Any] = {
        "model_type": ARCHITECTURES[arch].model_type,
        **_shape_config(file, a),
        "rms_norm_eps": _positive(md, f"{a}.attention.layer_norm_rms_epsilon", path),
        "rope_theta": _positive(md, f"{a}.rope.freq_base", path, 10000.0),
        "rope_traditional": False,  # after un-permuting, every supported file is half-split
        "tie_word_embeddings": "output.weight" not in file.tensors,
    }
    hidden, heads, head_dim, n_layers = (config[k] for k in (
        "hidden_size", "num_attention_heads", "head_dim", "num_hidden_layers"))
    if (scaling := _rope_scaling(md, a, path)) is not None:
        config["rope_scaling"] = scaling
    if arch == "qwen2" and head_dim * heads != hidden:
        raise ModelFormatError(f"{path}: qwen2 with head_dim {head_dim} * {heads} != {hidden}")
    if arch == "llama":
        config["attention_bias"] = "blk.0.attn_q.bias" in file.tensors
        config["mlp_bias"] = "blk.0.ffn_up.bias" in file.tensors
    if arch in ("gemma2", "gemma3"):
        # llama.cpp scales queries by 1/sqrt(hidden/heads) for the 27B models only
        big = n_layers == {"gemma2": 46, "gemma3": 62}[arch]
        config["query_pre_attn_scalar"] = hidden // heads if big else head_dim
        config["sliding_window"] = _count(md, f"{a}.attention.sliding_window", path)
    if arch == "gemma2":
        config["attn_logit_softcapping"] = _positive(md, f"{a}.attn_logit_softcapping", path, 50.0)
        config["final_logit_softcapping"] = _positive(md, f"{a}.final_logit_softcapping", path, 30.0)
    if arch == "gemma3":
        config["sliding_window_pattern"] = _sliding_pattern(md, a, n_layers, path)
        config["rope_local_base_freq"] = _positive(md, f"{a}.rope.freq_base_swa", path, 10000.0)
    return config


# --------------------------------------------------------------------------- public API


@dataclass
class GGUFContents:
    """Everything a GGUF file holds, in mlx-lm terms."""

    config: dict[str, Any]  # HF/mlx-lm config.json form, with model_type
    weights: dict[str, mx.array]  # mlx-lm parameter names
    quantization: dict[str, tuple[int, int]]  # module path -> (group_size, bits)
    metadata: dict[str, Any]  # GGUF metadata without the big tokenizer arrays, + tensor types
    tokenizer: TokenizerWrapper


def _transform(
    arrays: dict[str, mx.array], gguf_name: str, arch: str, config: dict[str, Any]
) -> dict[str, mx.array]:
    """Undo the converter: Q/K row permutation (llama), +1 on Gemma norm weights."""
    spec = ARCHITECTURES[arch]
    match = _BLOCK_RE.fullmatch(gguf_name)
    if spec.permute_qk and match is not None and match[2] in ("attn_q", "attn_k"):
        heads = config["num_attention_heads" if match[2] == "attn_q" else "num_key_value_heads"]
        order = mx.array(_unpermute_rows(arrays["weight"].shape[0], heads))
        arrays = {k: v[order] for k, v in arrays.items()}  # rows: packed, scales, biases alike
    if spec.norm_offset and gguf_name.endswith("norm.weight"):
        w = arrays["weight"]
        if len(arrays) > 1:
            raise ModelFormatError(f"norm tensor {gguf_name!r} is quantized")
        arrays = {"weight": (w.astype(mx.float32) - spec.norm_offset).astype(w.dtype)}
    return arrays


def _tensors(
    file: GGUFFile, arch: str, config: dict[str, Any], dequantize_dtype: mx.Dtype
) -> tuple[dict[str, mx.array], dict[str, tuple[int, int]]]:
    """Every tensor converted, converter transforms undone, under its mlx-lm name."""
    weights: dict[str, mx.array] = {}
    quantization: dict[str, tuple[int, int]] = {}
    for name, info in file.tensors.items():
        target = mlx_name(name, arch)
        arrays, quant = convert_tensor(file, info, dequantize_dtype)
        arrays = _transform(arrays, name, arch, config)
        if quant is None:
            weights[target] = arrays["weight"]
            continue
        if not target.endswith(".weight"):
            raise ModelFormatError(f"tensor {name!r} in {file.path} is a quantized bias")
        prefix = target.rpartition(".")[0]
        quantization[prefix] = quant
        weights.update({f"{prefix}.{part}": v for part, v in arrays.items()})
    return weights, quantization


def read_gguf(path: str | Path, dequantize_dtype: mx.Dtype = mx.float32) -> GGUFContents:
    """Parse ``path`` into config, mlx-lm-named weights, quantization map and tokenizer.

    Tensors of types MLX cannot hold quantized (K-quants, Q5_*, IQ*) are dequantized to
    ``dequantize_dtype``.
    """
    file = parse_gguf(path)
    md = file.metadata
    if _meta(md, "split.count", file.path, 1) > 1:
        raise ModelFormatError(f"{file.path} is one shard of a split GGUF; merge it first")
    arch = md.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelFormatError(
            f"GGUF architecture {arch!r} in {file.path} is not supported; "
            f"supported: {sorted(ARCHITECTURES)}"
        )
    config = gguf_config(file, arch)
    weights, quantization = _tensors(file, arch, config, dequantize_dtype)
    metadata = {k: v for k, v in md.items() if k not in TOKENIZER_ARRAYS}
    metadata["tensor_types"] = {n: i.qtype.name for n, i in file.tensors.items()}
    return GGUFContents(config, weights, quantization, metadata, build_tokenizer(md, file.path))


def load_gguf(path: str | Path, dtype: mx.Dtype | None) -> tuple[nn.Module, TokenizerWrapper]:
    """``(mlx-lm model, TokenizerWrapper)`` for a GGUF file.

    ``dtype`` None keeps Q4_0/Q4_1/Q8_0 layers quantized and float tensors as stored (others are
    dequantized to float16); a float dtype dequantizes everything and casts to it.
    """
    contents = read_gguf(path, dequantize_dtype=dtype or mx.float16)
    model = build_model(contents.config, contents.weights, dtype, contents.quantization)
    return model, contents.tokenizer
