"""Fill-in-the-middle prompts for code models whose vocabulary names the FIM tokens.

Contract: ``fim_token_ids(tokenizer)`` returns the ids of the prefix, suffix and middle tokens
when the tokenizer's vocabulary has one of :data:`FIM_SPELLINGS` whole (Qwen2.5-Coder's
``<|fim_prefix|>`` family, StarCoder's ``<fim_prefix>`` family), else None.
``fim_prompt(tokenizer, prefix_ids, suffix)`` lays a prompt out prefix-suffix-middle (PSM), the
order these models were trained on: ``<prefix> prefix <suffix> suffix <middle>``; the model then
writes the middle and ends it with an end-of-sequence id. The suffix is encoded without special
tokens. None when the tokenizer has no FIM tokens. It knows nothing about models or sessions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

FIM_SPELLINGS: tuple[tuple[str, str, str], ...] = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, SantaCoder
)


def _vocab(tokenizer: Any) -> dict[str, int]:
    get = getattr(tokenizer, "get_vocab", None)
    vocab = get() if callable(get) else getattr(tokenizer, "vocab", None)
    return dict(vocab) if isinstance(vocab, dict) else {}


def fim_token_ids(tokenizer: Any) -> tuple[int, int, int] | None:
    """The (prefix, suffix, middle) token ids, or None (module docstring)."""
    vocab = _vocab(tokenizer)
    for names in FIM_SPELLINGS:
        if all(name in vocab for name in names):
            prefix, suffix, middle = (int(vocab[name]) for name in names)
            return prefix, suffix, middle
    return None


def fim_prompt(tokenizer: Any, prefix_ids: Sequence[int], suffix: str) -> list[int] | None:
    """``<prefix> prefix_ids <suffix> suffix <middle>`` as ids, or None without FIM tokens."""
    ids = fim_token_ids(tokenizer)
    if ids is None:
        return None
    prefix_token, suffix_token, middle_token = ids
    suffix_ids = list(tokenizer.encode(suffix, add_special_tokens=False)) if suffix else []
    return [prefix_token, *prefix_ids, suffix_token, *suffix_ids, middle_token]
