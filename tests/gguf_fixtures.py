"""Tiny random-weight GGUF files written the way llama.cpp's converter writes them.

``tiny_checkpoint(arch)`` makes an HF-named float32 checkpoint (config + weights) for a supported
architecture; ``write_gguf`` writes it as the converter would: tensor names from gguf-py's own
``TensorNameMap`` (not from the loader's table), Q/K rows permuted for llama, ``+1`` on Gemma
norm weights, 2-D weights in the requested type (1-D ones stay F32), a tiny tokenizer in the
metadata. ``expected_weights`` reads back what was written (dequantized by gguf-py) and undoes the
converter with the converter's own formulas: the reference the loader must reproduce.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT
from mlx.utils import tree_flatten

from nexus_mlx.models.build import model_classes

GGUF_ARCH = {
    "llama": gguf.MODEL_ARCH.LLAMA,
    "qwen2": gguf.MODEL_ARCH.QWEN2,
    "qwen3": gguf.MODEL_ARCH.QWEN3,
    "gemma2": gguf.MODEL_ARCH.GEMMA2,
    "gemma3": gguf.MODEL_ARCH.GEMMA3,
}
GEMMA = ("gemma2", "gemma3")

# ----------------------------------------------------------------------------- tokenizers

BYTE_LEVEL_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BYTE_LEVEL_MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "1 2", "Ġ Ġ", "ĠĠ ĠĠ", "Ċ Ċ"]
CHATML = (
    "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def byte_alphabet() -> list[str]:
    """GPT-2's byte -> printable character table, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def byte_level_vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges): 3 control tokens, 256 byte symbols, one token per merge."""
    tokens = BYTE_LEVEL_SPECIALS + byte_alphabet() + [m.replace(" ", "") for m in BYTE_LEVEL_MERGES]
    types = [3] * 3 + [1] * (len(tokens) - 3)
    return tokens, types, list(BYTE_LEVEL_MERGES)


SPM_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
SPM_PIECES = ["▁t", "he", "▁the", "in", "▁a", "an", "▁an", "at", "▁", "t", "h", "e", "a", "n",
              "i", "s", "o"]
SPM_USER = ["\n", "  "]  # user-defined, stored with real spaces as the converter does


def spm_vocab() -> tuple[list[str], list[int], list[float]]:
    """(tokens, types, scores) of a SentencePiece-BPE vocabulary: merges first, then chars."""
    tokens = SPM_SPECIALS + [f"<0x{b:02X}>" for b in range(256)] + SPM_PIECES + SPM_USER
    types = [3, 3, 3, 2, 3, 3] + [6] * 256 + [1] * len(SPM_PIECES) + [4] * len(SPM_USER)
    scores = [0.0] * (6 + 256) + [-float(i) for i in range(len(SPM_PIECES))] + [0.0] * len(SPM_USER)
    return tokens, types, scores


def vocab_size(arch: str) -> int:
    return len(spm_vocab()[0] if arch in GEMMA else byte_level_vocab()[0])


def add_tokenizer(w: gguf.GGUFWriter, arch: str, **options: Any) -> None:
    """The tokenizer metadata of the converter: gpt2 for llama/qwen, llama (SPM) for gemma."""
    if arch in GEMMA:
        tokens, types, scores = spm_vocab()
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(2)
        w.add_eos_token_id(1)
        w.add_unk_token_id(3)
        w.add_pad_token_id(0)
        w.add_add_bos_token(options.get("add_bos", True))
        w.add_add_space_prefix(options.get("add_space_prefix", False))
    else:
        tokens, types, merges = byte_level_vocab()
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(options.get("pre", "smollm"))
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        w.add_pad_token_id(2)
        w.add_add_bos_token(options.get("add_bos", False))
        w.add_chat_template(CHATML)


# ----------------------------------------------------------------------------- checkpoints


def tiny_config(
    arch: str, *, hidden: int = 64, ffn: int = 96, tied: bool = True, bias: bool = False
) -> dict[str, Any]:
    """An HF config.json for a 2-layer model; qwen3 / gemma heads are wider than hidden/heads."""
    wide = hidden // 2
    config: dict[str, Any] = {
        "hidden_size": hidden, "num_hidden_layers": 2, "intermediate_size": ffn,
        "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
        "vocab_size": vocab_size(arch), "max_position_embeddings": 512,
        "tie_word_embeddings": tied, "head_dim": hidden // 4,
    }
    extra: dict[str, dict[str, Any]] = {
        "llama": {"model_type": "llama", "rope_theta": 5000.0, "attention_bias": bias},
        "qwen2": {"model_type": "qwen2", "rope_theta": 1000000.0},
        "qwen3": {"model_type": "qwen3", "rope_theta": 1000000.0, "head_dim": wide},
        "gemma2": {"model_type": "gemma2", "rope_theta": 10000.0, "head_dim": wide,
                   "query_pre_attn_scalar": wide, "attn_logit_softcapping": 20.0,
                   "final_logit_softcapping": 5.0, "rms_norm_eps": 1e-6},
        "gemma3": {"model_type": "gemma3_text", "rope_theta": 1000000.0, "head_dim": wide,
                   "query_pre_attn_scalar": wide, "sliding_window": 4,
                   "sliding_window_pattern": 2, "rope_local_base_freq": 10000.0,
                   "rms_norm_eps": 1e-6},
    }
    return {**config, **extra[arch]}


def tiny_checkpoint(arch: str, seed: int = 0, **kw: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(HF config, HF-named float32 weights) with random values; norms near their identity."""
    config = tiny_config(arch, **kw)
    model_cls, args_cls = model_classes(config)
    model = model_cls(args_cls.from_dict(config))
    rng = np.random.default_rng(seed)
    weights = {}
    for name, value in tree_flatten(model.parameters()):
        if name == "lm_head.weight" and config["tie_word_embeddings"]:
            continue  # gemma3's module holds lm_head until sanitize() drops it
        w = (0.2 * rng.standard_normal(value.shape)).astype(np.float32)
        if "norm" in name and arch not in GEMMA:
            w += 1.0
        weights[name] = w
    return config, weights


# ----------------------------------------------------------------------------- writing


def converter_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute``: half-split RoPE rows -> interleaved, per head."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def converter_unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_tensors(arch: str, config: dict[str, Any], weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = gguf.get_tensor_name_map(GGUF_ARCH[arch], config["num_hidden_layers"])
    out = {}
    for name, w in weights.items():
        w = w.copy()
        if arch == "llama" and ".q_proj." in name:
            w = converter_permute(w, config["num_attention_heads"])
        if arch == "llama" and ".k_proj." in name:
            w = converter_permute(w, config["num_key_value_heads"])
        if arch in GEMMA and name.endswith("norm.weight"):
            w = w + 1.0
        target = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert target is not None, name
        out[target] = w
    return out


def tensor_type(name: str, w: np.ndarray, qtype: QT | dict[str, QT]) -> QT:
    """The type a tensor is stored in: 1-D always F32; ``qtype`` may map name substrings."""
    if w.ndim == 1:
        return QT.F32
    if isinstance(qtype, dict):
        return next((t for key, t in qtype.items() if key in name), QT.F32)
    return qtype


def encode_tensor(w: np.ndarray, qtype: QT, rng: np.random.Generator) -> np.ndarray:
    """Raw tensor data: floats as themselves, gguf-py quantization, random K-quant blocks."""
    if qtype == QT.F32:
        return w
    if qtype == QT.F16:
        return w.astype(np.float16)
    try:
        return gguf.quants.quantize(w, qtype)
    except NotImplementedError:  # gguf-py cannot quantize K-quants: random valid blocks
        return random_blocks(w.shape, qtype, rng)


def random_blocks(shape: tuple[int, ...], qtype: QT, rng: np.random.Generator) -> np.ndarray:
    """Random blocks of ``qtype`` whose float16 scale fields hold small finite values."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = shape[0] * shape[1] // block
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    scale_at = {QT.Q8_1: (0, 2), QT.Q4_K: (0, 2), QT.Q5_K: (0, 2), QT.Q6_K: (208,), QT.Q2_K: (80, 82),
                QT.Q3_K: (108,)}[qtype]
    for at in scale_at:
        d = (0.0004 * rng.random(n_blocks) + 0.0001).astype(np.float16)
        raw[:, at : at + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(shape[0], -1)


def write_gguf(
    path: Path, arch: str, config: dict[str, Any], weights: dict[str, np.ndarray],
    qtype: QT | dict[str, QT] = QT.F32, seed: int = 0, metadata: dict[str, Any] | None = None,
    extra_tensors: dict[str, np.ndarray] | None = None, **tokenizer_options: Any,
) -> Path:
    """Write ``weights`` as llama.cpp's converter would (see the module docstring), plus any
    ``metadata`` (str / float / int values) and raw ``extra_tensors``."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[GGUF_ARCH[arch]])
    for key, value in (metadata or {}).items():
        {str: w.add_string, float: w.add_float32, int: w.add_uint32}[type(value)](key, value)
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_block_count(config["num_hidden_layers"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_head_count_kv(config["num_key_value_heads"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_rope_freq_base(config["rope_theta"])
    w.add_key_length(config["head_dim"])
    w.add_value_length(config["head_dim"])
    w.add_rope_dimension_count(config["head_dim"])
    if arch == "gemma2":
        w.add_attn_logit_softcapping(config["attn_logit_softcapping"])
        w.add_final_logit_softcapping(config["final_logit_softcapping"])
        w.add_sliding_window(4096)
    if arch == "gemma3":
        w.add_sliding_window(config["sliding_window"])
        w.add_sliding_window_pattern(config["sliding_window_pattern"])
    add_tokenizer(w, arch, **tokenizer_options)
    for name, tensor in _gguf_tensors(arch, config, weights).items():
        t = tensor_type(name, tensor, qtype)
        raw = encode_tensor(tensor, t, rng)
        if t in (QT.F32, QT.F16):
            w.add_tensor(name, raw)
        else:
            w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=t)
    for name, tensor in (extra_tensors or {}).items():
        w.add_tensor(name, tensor)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ----------------------------------------------------------------------------- reading back


def expected_weights(
    path: Path, arch: str, config: dict[str, Any], hf_names: Iterable[str]
) -> dict[str, np.ndarray]:
    """HF-named float32 weights the file holds: gguf-py's reader and dequantizer, then the
    converter's transforms undone with its own formulas."""
    names = gguf.get_tensor_name_map(GGUF_ARCH[arch], config["num_hidden_layers"])
    hf_of = {names.get_name(n, try_suffixes=(".weight", ".bias")): n for n in hf_names}
    out = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        w = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(shape).astype(np.float32)
        hf_name = hf_of[t.name]
        if arch == "llama" and ".q_proj." in hf_name:
            w = converter_unpermute(w, config["num_attention_heads"])
        if arch == "llama" and ".k_proj." in hf_name:
            w = converter_unpermute(w, config["num_key_value_heads"])
        if arch in GEMMA and hf_name.endswith("norm.weight"):
            w = w - 1.0
        out[hf_name] = w
    return out



def transformers_tokenizer(metadata: dict[str, Any]) -> Any:
    """transformers' GGUF tokenizer conversion of ``metadata`` (parsed by our reader): the
    independent oracle the GGUF tokenizer tests compare against (``tokenizers`` backend)."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_TOKENIZER_MAPPING,
        convert_gguf_tokenizer,
    )

    plain = {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in metadata.items()}
    fields = {name: plain[f"tokenizer.{key}"]
              for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
              if f"tokenizer.{key}" in plain}
    backend, _ = convert_gguf_tokenizer(plain["general.architecture"], fields)
    return backend
