"""Write a loaded model as an mlx-lm model directory that ``mlx_lm.load`` reads back exactly.

Contract: ``save_mlx_lm(model, tokenizer, out)`` writes, atomically, a directory holding

- ``model.safetensors`` (or ``model-0000i-of-0000n.safetensors`` shards past
  ``max_shard_bytes``) plus ``model.safetensors.index.json``: every parameter under the name the
  mlx-lm module of the architecture uses (our models *are* mlx-lm modules, so these are their own
  parameter paths; llama.cpp's Q/K row permutation and Gemma's folded ``+1`` were undone when
  the GGUF was read, see ``models.gguf``), in the dtype the model holds it;
- ``config.json``: the model's mlx-lm ``ModelArgs`` as a dict (``ModelArgs.from_dict`` reads it
  back to the same args), ``eos_token_id`` (every end-of-sequence id the tokenizer stops on),
  ``nexus_mlx`` (provenance: source spec and dtype; readers ignore it) and, when layers are
  quantized, mlx-lm's ``quantization`` block: a default ``group_size`` / ``bits`` / ``mode`` and
  one entry per quantized module, so ``mlx_lm.utils.load_model`` rebuilds exactly those layers
  as ``QuantizedLinear`` / ``QuantizedEmbedding`` and loads the packed weights, scales and
  biases unchanged;
- ``tokenizer.json`` (the ``tokenizers`` backend: vocabulary, merges, pre-tokenizer, decoder,
  added / special tokens, BOS post-processing) and ``tokenizer_config.json``
  (``PreTrainedTokenizerFast``, the special tokens, the chat template inline, the context
  length), which Hugging Face ``transformers`` 4.x and 5.x both load.

Dtype (of :func:`convert_model`, which loads a spec first): ``"auto"`` keeps what
``nexus_mlx.load`` computes with here (float32 on CPU: quantized GGUF layers are dequantized;
the file's precision on a GPU: Q4_0 / Q4_1 / Q8_0 layers stay quantized), ``None`` always keeps
the file's precision (quantized layers saved quantized, with the ``quantization`` block), an MLX
float dtype dequantizes everything and casts to it.

Atomic: everything is written to a hidden temporary directory beside ``out``, checked by
building the directory's model with mlx-lm's own ``load_model`` (strict: every weight name and
shape) and its tokenizer with mlx-lm's ``load_tokenizer`` (same ids on a probe text, same chat
prompt), and only then renamed to ``out``. An existing ``out`` must be empty, or be a model
directory (it holds ``config.json``) and ``force`` given; a failure leaves ``out`` as it was.
Caller errors raise :class:`ArgumentError`; a model or tokenizer that cannot be written in
mlx-lm's form raises :class:`ModelFormatError`.

It does not know GGUF, HTTP, or how the directory will be served; a tokenizer without a
``tokenizers`` backend (a slow Python tokenizer) is refused. mlx-lm picks its streaming
detokenizer from ``tokenizer.json``'s decoder; where ``models.gguf_tokenizer`` chose the naive
one (a vocabulary with repeated spellings), mlx-lm's choice differs in streaming only.
``config.json`` holds the ModelArgs values as they are; ``transformers`` (which mlx-lm's
tokenizer loader runs) also validates it against its own config class, so a value of the wrong
type there (a float Gemma ``query_pre_attn_scalar``; checkpoints and the GGUF loader write an
int) fails the check after writing, and nothing is published.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from nexus_mlx.errors import ArgumentError, ModelFormatError, TokenError
from nexus_mlx.models.load import DtypeArg, load
from nexus_mlx.models.tokenizer import backend_of, eos_token_ids

DEFAULT_SHARD_BYTES = 5 << 30  # mlx-lm's own shard size
WEIGHTS_INDEX = "model.safetensors.index.json"
PROBE_TEXT = "Hello, world! 12345 naïve café — <tag> \n\ttabs"
PROBE_CHAT = [{"role": "system", "content": "You are terse."},
              {"role": "user", "content": "What time is it in Tokyo?"}]


@dataclass(frozen=True)
class Converted:
    """What :func:`save_mlx_lm` wrote."""

    path: Path
    files: tuple[str, ...]  # file names inside ``path``
    tensors: int  # stored arrays (a quantized layer stores weight, scales, biases)
    nbytes: int  # bytes of all stored arrays
    dtypes: tuple[str, ...]  # the distinct dtypes stored, sorted
    quantized_layers: int


# ---------------------------------------------------------------------------- output directory


def check_output_dir(out: str | os.PathLike[str], force: bool = False) -> Path:
    """``out`` as a path that :func:`save_mlx_lm` may write: absent, an empty directory, or
    (with ``force``) an existing model directory. Raises :class:`ArgumentError` otherwise."""
    path = Path(out).expanduser()
    if not str(out).strip():
        raise ArgumentError("the output directory is empty; give a path such as models/smollm2")
    if path.exists() and not path.is_dir():
        raise ArgumentError(f"output {str(path)!r} is an existing file; give a new directory")
    if path.is_dir() and any(path.iterdir()):
        if not force:
            raise ArgumentError(f"output directory {str(path)!r} is not empty; pass --force "
                                "(force=True) to replace the model directory there, or choose "
                                "a new path")
        if not (path / "config.json").is_file():
            raise ArgumentError(f"output directory {str(path)!r} is not empty and holds no "
                                "config.json, so it is not a model directory; it is never "
                                "replaced, even with --force: choose a new path")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ArgumentError(f"cannot create {str(path)!r}: {str(parent)!r} is not a writable "
                            "directory")
    return path


# ---------------------------------------------------------------------------- config


def quantized_modules(model: nn.Module) -> dict[str, dict[str, Any]]:
    """Module path -> ``{"group_size", "bits", "mode"}`` of every quantized layer."""
    out: dict[str, dict[str, Any]] = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.QuantizedLinear | nn.QuantizedEmbedding):
            out[name] = {"group_size": int(module.group_size), "bits": int(module.bits),
                         "mode": str(getattr(module, "mode", "affine"))}
    return dict(sorted(out.items()))


def quantization_block(model: nn.Module) -> dict[str, Any] | None:
    """mlx-lm's ``config["quantization"]``: the most common setting as the default, then one
    entry per quantized module (None when nothing is quantized)."""
    layers = quantized_modules(model)
    if not layers:
        return None
    common = Counter(tuple(v.items()) for v in layers.values()).most_common(1)[0][0]
    return {**dict(common), **layers}


def _json_value(value: Any) -> Any:
    raise ModelFormatError(f"the model's config holds {value!r} ({type(value).__name__}), "
                           "which config.json cannot store")


def mlx_lm_config(model: nn.Module, tokenizer: Any, provenance: Mapping[str, Any] | None = None
                  ) -> dict[str, Any]:
    """The ``config.json`` dict of ``model`` (see the module docstring)."""
    args = getattr(model, "args", None)
    if args is None or not dataclasses.is_dataclass(args) or isinstance(args, type):
        raise ModelFormatError(f"{type(model).__name__} has no mlx-lm ModelArgs dataclass at "
                               "model.args; only mlx-lm models can be written as mlx-lm folders")
    config: dict[str, Any] = dataclasses.asdict(args)
    if not config.get("model_type"):
        raise ModelFormatError("the model's args name no model_type")
    eos = eos_token_ids(tokenizer)
    if eos:
        config["eos_token_id"] = list(eos) if len(eos) > 1 else eos[0]
    if (block := quantization_block(model)) is not None:
        config["quantization"] = block
    if provenance:
        config["nexus_mlx"] = dict(provenance)
    json.dumps(config, default=_json_value)  # fail here, before anything is written
    return config


# ---------------------------------------------------------------------------- tokenizer


def _special(hf: Any, role: str) -> str | None:
    value = getattr(hf, f"{role}_token", None)
    return str(value) if value is not None else None


def tokenizer_files(tokenizer: Any) -> dict[str, str]:
    """``{"tokenizer.json": ..., "tokenizer_config.json": ...}`` as text."""
    try:
        backend = backend_of(tokenizer)
    except TokenError as exc:
        raise ModelFormatError(f"the tokenizer cannot be written as tokenizer.json: {exc}") from exc
    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
    for role in ("bos", "eos", "unk", "pad"):
        if (token := _special(hf, role)) is not None:
            config[f"{role}_token"] = token
    template = getattr(hf, "chat_template", None)
    if isinstance(template, str):
        config["chat_template"] = template
    elif isinstance(template, Mapping):  # named templates, in Hugging Face's list form
        config["chat_template"] = [{"name": k, "template": v} for k, v in template.items()]
    config["clean_up_tokenization_spaces"] = bool(getattr(hf, "clean_up_tokenization_spaces",
                                                          False))
    max_length = getattr(hf, "model_max_length", None)
    if isinstance(max_length, int) and max_length < 1 << 40:
        config["model_max_length"] = max_length
    return {"tokenizer.json": backend.to_str(pretty=True),
            "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False) + "\n"}


# ---------------------------------------------------------------------------- weights


def weight_shards(weights: Mapping[str, mx.array], max_bytes: int) -> list[dict[str, mx.array]]:
    """Arrays in name order, cut into shards of at most ``max_bytes`` (an array larger than
    that gets a shard of its own)."""
    shards: list[dict[str, mx.array]] = [{}]
    size = 0
    for name in sorted(weights):
        array = weights[name]
        if shards[-1] and size + array.nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = array
        size += array.nbytes
    return shards


def _write_weights(folder: Path, weights: Mapping[str, mx.array], max_bytes: int) -> list[str]:
    shards = weight_shards(weights, max_bytes)
    names = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    weight_map = {}
    for name, shard in zip(names, shards, strict=True):
        mx.save_safetensors(str(folder / name), shard, metadata={"format": "mlx"})
        weight_map.update(dict.fromkeys(shard, name))
    index = {"metadata": {"total_size": sum(int(v.nbytes) for v in weights.values())},
             "weight_map": dict(sorted(weight_map.items()))}
    (folder / WEIGHTS_INDEX).write_text(json.dumps(index, indent=2) + "\n")
    return [*names, WEIGHTS_INDEX]


# ---------------------------------------------------------------------------- checking, publishing


def _verify(folder: Path, tokenizer: Any, weights: Mapping[str, mx.array]) -> None:
    """Build the folder's model and tokenizer the way mlx-lm does and compare what matters."""
    from mlx_lm.utils import load_model, load_tokenizer

    config = json.loads((folder / "config.json").read_text())
    try:
        reloaded, _ = load_model(folder, lazy=True)
        reread = load_tokenizer(folder, eos_token_ids=config.get("eos_token_id"))
    except Exception as exc:  # whatever mlx-lm or transformers raise: the folder is unusable
        detail = " ".join(str(exc).split())[:300]
        raise ModelFormatError(f"mlx-lm cannot load the written folder: {type(exc).__name__}: "
                               f"{detail}") from exc
    stored = dict(tree_flatten(reloaded.parameters()))
    mismatched = sorted(k for k in weights if k not in stored or stored[k].shape != weights[k].shape
                        or stored[k].dtype != weights[k].dtype)
    if mismatched or len(stored) != len(weights):
        raise ModelFormatError(f"mlx-lm rebuilds other parameters than were written: "
                               f"{mismatched[:5]} (of {len(mismatched)}), {len(stored)} stored "
                               f"vs {len(weights)} written")
    if list(reread.encode(PROBE_TEXT)) != list(tokenizer.encode(PROBE_TEXT)):
        raise ModelFormatError("the written tokenizer encodes a probe text differently")
    if getattr(tokenizer, "chat_template", None) is not None:
        ours = tokenizer.apply_chat_template(PROBE_CHAT, tokenize=False, add_generation_prompt=True)
        theirs = reread.apply_chat_template(PROBE_CHAT, tokenize=False, add_generation_prompt=True)
        if ours != theirs:
            raise ModelFormatError("the written chat template renders a probe chat differently")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _publish(tmp: Path, out: Path, force: bool) -> None:
    """Rename ``tmp`` to ``out``; an existing ``out`` (empty, or a model folder with ``force``)
    is moved aside first and restored if the rename fails."""
    check_output_dir(out, force)  # again: the folder may have changed while we wrote
    if not out.exists():
        os.rename(tmp, out)
        return
    aside = out.with_name(f".{out.name}.replaced-{uuid.uuid4().hex[:8]}")
    os.rename(out, aside)
    try:
        os.rename(tmp, out)
    except BaseException:
        os.rename(aside, out)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def save_mlx_lm(model: nn.Module, tokenizer: Any, out: str | os.PathLike[str], *,
                force: bool = False, max_shard_bytes: int = DEFAULT_SHARD_BYTES,
                provenance: Mapping[str, Any] | None = None, verify: bool = True) -> Converted:
    """Write ``model`` and ``tokenizer`` to ``out`` as an mlx-lm directory (module docstring)."""
    if isinstance(max_shard_bytes, bool) or not isinstance(max_shard_bytes, int) \
            or max_shard_bytes < 1:
        raise ArgumentError(f"max_shard_bytes must be a positive integer, got {max_shard_bytes!r}")
    path = check_output_dir(out, force)
    config = mlx_lm_config(model, tokenizer, provenance)
    texts = tokenizer_files(tokenizer)
    weights = dict(tree_flatten(model.parameters()))
    mx.eval(list(weights.values()))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent))
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private; the result should not be
        files = _write_weights(tmp, weights, max_shard_bytes)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        for name, text in texts.items():
            (tmp / name).write_text(text, encoding="utf-8")
        files += ["config.json", *texts]
        if verify:
            _verify(tmp, tokenizer, weights)
        _publish(tmp, path, force)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already once published
    return Converted(path=path, files=tuple(sorted(files)), tensors=len(weights),
                     nbytes=sum(int(v.nbytes) for v in weights.values()),
                     dtypes=tuple(sorted({str(v.dtype).removeprefix("mlx.core.")
                                          for v in weights.values()})),
                     quantized_layers=len(quantized_modules(model)))


def convert_model(spec: str | os.PathLike[str], out: str | os.PathLike[str], *,
                  dtype: DtypeArg = "auto", force: bool = False,
                  max_shard_bytes: int = DEFAULT_SHARD_BYTES) -> Converted:
    """``nexus_mlx.load(spec, dtype)`` written to ``out`` by :func:`save_mlx_lm`. The output
    directory is checked before the model loads; it may not be the model directory read."""
    path = check_output_dir(out, force)
    source = Path(spec).expanduser()
    if source.is_dir() and path.exists() and source.resolve() == path.resolve():
        raise ArgumentError(f"the output directory {str(path)!r} is the model directory being "
                            "converted; choose another --out")
    model, tokenizer = load(spec, dtype)
    kind = ("auto" if isinstance(dtype, str) else "keep" if dtype is None
            else str(dtype).removeprefix("mlx.core."))
    provenance = {"source": str(spec), "dtype": kind}
    return save_mlx_lm(model, tokenizer, path, force=force, max_shard_bytes=max_shard_bytes,
                       provenance=provenance)
