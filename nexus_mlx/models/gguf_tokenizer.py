"""Rebuild a model's tokenizer from GGUF metadata with the ``tokenizers`` library.

Contract: ``build_tokenizer(metadata, source)`` returns an ``mlx_lm`` ``TokenizerWrapper`` around a
``transformers.PreTrainedTokenizerFast`` (so ``encode``, ``decode``, ``apply_chat_template`` with
the file's ``tokenizer.chat_template``, ``eos_token_ids``, and mlx-lm's ``generate`` all work).
Two vocabulary kinds (``tokenizer.ggml.model``):

- ``"gpt2"``: byte-level BPE. Tokens are spelled in GPT-2's byte-to-unicode alphabet, merges are
  given; text is split by the regex ``tokenizer.ggml.pre`` names (see ``PRE_TOKENIZERS``).
- ``"llama"``: SentencePiece BPE. Tokens use ``▁`` for spaces and carry scores; merges are
  rebuilt (every split of a normal token into two tokens, ranked by the token's score), unknown
  bytes fall back to ``<0xXX>`` tokens. ``add_space_prefix`` prepends ``▁`` to the text.

llama.cpp token types: 1 normal, 2 unknown, 3 control (-> special added tokens), 4 user-defined
(-> added tokens matched whole in the raw text, as llama.cpp does), 5 unused, 6 byte.
``add_bos_token`` / ``add_eos_token`` become a template post-processor.

It does not know tensors, model configs, or any tokenizer kind other than the two above (unigram
``t5``, ``bert`` WordPiece, ``rwkv`` raise :class:`ModelFormatError`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from mlx_lm.tokenizer_utils import (
    BPEStreamingDetokenizer,
    NaiveStreamingDetokenizer,
    SPMStreamingDetokenizer,
    TokenizerWrapper,
)
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, processors
from tokenizers import pre_tokenizers as pre
from transformers import PreTrainedTokenizerFast

from nexus_mlx.errors import ModelFormatError

# metadata arrays that only the tokenizer needs (callers may drop them from what they keep)
TOKENIZER_ARRAYS = frozenset({
    "tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges", "tokenizer.ggml.precompiled_charsmap",
})
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPM_SPACE = "\u2581"
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")

# Split regexes of the byte-level vocabularies (the ones llama.cpp's pre-tokenizer types name).
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre -> (isolate every digit first, split regex, ignore_merges)
PRE_TOKENIZERS: dict[str, tuple[bool, str, bool]] = {
    "gpt-2": (False, _GPT2, False),
    "gpt2": (False, _GPT2, False),
    "smollm": (True, _GPT2, False),
    "starcoder": (True, _GPT2, False),
    "refact": (True, _GPT2, False),
    "qwen2": (False, _QWEN2, False),
    "deepseek-r1-qwen": (False, _QWEN2, False),
    "llama3": (False, _LLAMA3, True),
    "llama-v3": (False, _LLAMA3, True),
    "llama-bpe": (False, _LLAMA3, True),
}
# end-of-turn markers llama.cpp also stops on when they are control tokens
_END_OF_TURN = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|eom_id|>", "<|endoftext|>", "<|end|>")


def _meta(md: Mapping[str, Any], key: str, source: object) -> Any:
    if key not in md:
        raise ModelFormatError(f"GGUF file {source} lacks the tokenizer metadata {key!r}")
    return md[key]


def _strings(md: Mapping[str, Any], key: str, source: object) -> list[str]:
    value = _meta(md, key, source)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ModelFormatError(f"GGUF file {source}: {key} is not a list of strings")
    return value


def _numbers(md: Mapping[str, Any], key: str, n: int, source: object, default: float) -> np.ndarray:
    value = md.get(key, np.full(n, default))
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "iuf" or value.shape != (n,):
        raise ModelFormatError(f"GGUF file {source}: {key} is not {n} numbers")
    return value


def _token_types(md: Mapping[str, Any], n: int, source: object) -> np.ndarray:
    return _numbers(md, "tokenizer.ggml.token_type", n, source, NORMAL).astype(np.int64)


def _vocab(tokens: Sequence[str]) -> dict[str, int]:
    """token -> id; a repeated spelling keeps its first id (later copies are unreachable)."""
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    return vocab


def _bpe(source: object, vocab: dict[str, int], merges: list[Any], **options: Any) -> models.BPE:
    try:
        return models.BPE(vocab, merges, **options)
    except Exception as exc:  # tokenizers raises bare Exception, e.g. a merge of unknown tokens
        raise ModelFormatError(f"GGUF file {source}: inconsistent tokenizer vocabulary: {exc}") from exc


def _byte_level_model(md: Mapping[str, Any], tokens: list[str], source: object) -> Tokenizer:
    name = md.get("tokenizer.ggml.pre", "gpt2")
    name = "gpt2" if name == "default" else name
    if name not in PRE_TOKENIZERS:
        raise ModelFormatError(
            f"GGUF file {source}: tokenizer.ggml.pre {name!r} is not supported; "
            f"supported: {sorted(PRE_TOKENIZERS)}"
        )
    digits, regex, ignore_merges = PRE_TOKENIZERS[name]
    merges = [tuple(m.split(" ", 1)) for m in _strings(md, "tokenizer.ggml.merges", source)]
    if any(len(m) != 2 for m in merges):
        raise ModelFormatError(f"GGUF file {source}: a tokenizer merge is not two tokens")
    tok = Tokenizer(_bpe(source, _vocab(tokens), merges, ignore_merges=ignore_merges))
    steps: list[pre.PreTokenizer] = [pre.Digits(individual_digits=True)] if digits else []
    steps += [pre.Split(Regex(regex), behavior="isolated"),
              pre.ByteLevel(add_prefix_space=False, use_regex=False)]
    tok.pre_tokenizer = pre.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    return tok


def spm_merges(tokens: Sequence[str], scores: np.ndarray, types: np.ndarray) -> list[tuple[str, str]]:
    """BPE merges a SentencePiece vocabulary implies: ``(left, right)`` for every normal token
    ``left + right`` whose halves are tokens, best score first (then lower id, shorter left)."""
    vocab = {t: i for i, t in enumerate(tokens) if types[i] in (NORMAL, UNUSED, BYTE)}
    score, kind = scores.tolist(), types.tolist()
    ranked = []
    for token, i in vocab.items():
        if kind[i] != NORMAL:
            continue
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                ranked.append((-score[i], i, cut, left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _sentencepiece_model(
    md: Mapping[str, Any], tokens: list[str], types: np.ndarray, source: object
) -> Tokenizer:
    if "tokenizer.ggml.scores" not in md:
        raise ModelFormatError(f"GGUF file {source} lacks the tokenizer metadata 'tokenizer.ggml.scores'")
    scores = _numbers(md, "tokenizer.ggml.scores", len(tokens), source, 0.0)
    unk_id = _token_id(md, "unknown", len(tokens))
    unk = tokens[unk_id] if unk_id is not None else None
    tok = Tokenizer(_bpe(source, _vocab(tokens), spm_merges(tokens, scores, types),
                         unk_token=unk, fuse_unk=True, byte_fallback=True))
    steps = [decoders.Replace(SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if _flag(md, "add_space_prefix", True):
        tok.pre_tokenizer = pre.Metaspace(replacement=SPM_SPACE, prepend_scheme="first", split=False)
        steps.append(decoders.Strip(" ", 1, 0))
    else:
        tok.normalizer = normalizers.Replace(" ", SPM_SPACE)
    tok.decoder = decoders.Sequence(steps)
    return tok


def _add_special(tok: Tokenizer, tokens: list[str], types: np.ndarray) -> None:
    """Control tokens become special added tokens, user-defined ones plain added tokens; both
    are matched whole in the raw text before the model sees it (as llama.cpp does)."""
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i in np.nonzero(types == CONTROL)[0]])
    tok.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                    for i in np.nonzero(types == USER_DEFINED)[0]])


def _token_id(md: Mapping[str, Any], key: str, n: int) -> int | None:
    """``tokenizer.ggml.<key>_token_id`` when it names a token, else None."""
    i = md.get(f"tokenizer.ggml.{key}_token_id")
    if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n:
        return i
    return None


def _flag(md: Mapping[str, Any], key: str, default: bool) -> bool:
    value = md.get(f"tokenizer.ggml.{key}", default)
    return value if isinstance(value, bool) else default


def _post_processor(md: Mapping[str, Any], tokens: list[str]) -> processors.PostProcessor | None:
    """BOS / EOS added around every sequence, as ``add_bos_token`` / ``add_eos_token`` say
    (llama.cpp adds BOS to SentencePiece vocabularies unless told not to)."""
    bos, eos = _token_id(md, "bos", len(tokens)), _token_id(md, "eos", len(tokens))
    head = [bos] if bos is not None and _flag(md, "add_bos_token", md["tokenizer.ggml.model"] == "llama") else []
    tail = [eos] if eos is not None and _flag(md, "add_eos_token", False) else []
    if not head and not tail:
        return None
    a, b = [tokens[i] for i in head], [tokens[i] for i in tail]
    return processors.TemplateProcessing(
        single=[*a, "$A", *b], pair=[*a, "$A", *b, *a, "$B:1", *b],
        special_tokens=[(tokens[i], i) for i in head + tail],
    )


def backend_tokenizer(metadata: Mapping[str, Any], source: object = "<metadata>") -> Tokenizer:
    """The ``tokenizers.Tokenizer`` the metadata describes (no BOS/EOS post-processing)."""
    kind = _meta(metadata, "tokenizer.ggml.model", source)
    tokens = _strings(metadata, "tokenizer.ggml.tokens", source)
    types = _token_types(metadata, len(tokens), source)
    if kind == "gpt2":
        tok = _byte_level_model(metadata, tokens, source)
    elif kind == "llama":
        tok = _sentencepiece_model(metadata, tokens, types, source)
    else:
        raise ModelFormatError(
            f"GGUF file {source}: tokenizer.ggml.model {kind!r} is not supported "
            "(supported: 'gpt2' byte-level BPE, 'llama' SentencePiece BPE)"
        )
    _add_special(tok, tokens, types)
    return tok


def _eos_ids(md: Mapping[str, Any], tokens: list[str], types: np.ndarray) -> list[int]:
    ids = [i for k in ("eos", "eot", "eom") if (i := _token_id(md, k, len(tokens))) is not None]
    ids += [i for i, t in enumerate(tokens) if types[i] == CONTROL and t in _END_OF_TURN]
    return sorted(set(ids))


def build_tokenizer(metadata: Mapping[str, Any], source: str | Path = "<metadata>") -> TokenizerWrapper:
    """The GGUF file's tokenizer as an mlx-lm ``TokenizerWrapper``; ``source`` names the file
    in error messages."""
    tok = backend_tokenizer(metadata, source)
    tokens = metadata["tokenizer.ggml.tokens"]
    tok.post_processor = _post_processor(metadata, tokens)
    roles = (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding"))
    specials = {f"{role}_token": tokens[i] for role, key in roles
                if (i := _token_id(metadata, key, len(tokens))) is not None}
    template = metadata.get("tokenizer.chat_template")
    context = metadata.get(f"{metadata.get('general.architecture')}.context_length")
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        chat_template=template if isinstance(template, str) else None,
        clean_up_tokenization_spaces=False,
        model_max_length=context if isinstance(context, int) else 1 << 30,
        **specials,
    )
    types = _token_types(metadata, len(tokens), source)
    return TokenizerWrapper(hf, _detokenizer(metadata, tokens),
                            eos_token_ids=_eos_ids(metadata, tokens, types))


def _detokenizer(md: Mapping[str, Any], tokens: list[str]) -> Any:
    """mlx-lm's linear-time streaming detokenizer for the vocabulary kind, or its naive one
    (re-decodes the tail) where the fast ones would misread the vocabulary: repeated
    spellings (unreachable ids) or ``<0x..>`` tokens that are not byte tokens."""
    if len(set(tokens)) != len(tokens):
        return NaiveStreamingDetokenizer
    if md["tokenizer.ggml.model"] == "gpt2":
        return BPEStreamingDetokenizer
    if any(t.startswith("<0x") and not _BYTE_TOKEN.fullmatch(t) for t in tokens):
        return NaiveStreamingDetokenizer
    return partial(SPMStreamingDetokenizer, trim_space=_flag(md, "add_space_prefix", True))
