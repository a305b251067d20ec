"""Chat-template wrapping shared by the repair case generators (Erasing-NIAH, multi-hop QA).

Contract: :func:`chat_template_parts` returns the text the tokenizer's chat template puts
before a single user message and between it and the assistant's reply (``("", "\\n")`` without
a template or with ``chat=False``), found by rendering a sentinel; :func:`encode_plain` encodes
text without special tokens. It knows nothing about cases, edits or scoring.
"""

from __future__ import annotations

from typing import Any

_SENTINEL = "\u0000NEXUS-USER\u0000"


def chat_template_parts(tokenizer: Any, chat: bool = True) -> tuple[str, str]:
    """(text before the user's content, text between it and the assistant's reply)."""
    if chat and getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": _SENTINEL}], tokenize=False, add_generation_prompt=True
        )
        head, tail = str(rendered).split(_SENTINEL)
        return head, tail
    return "", "\n"


def encode_plain(tokenizer: Any, text: str) -> list[int]:
    """``text``'s token ids, no special tokens added."""
    return list(tokenizer.encode(text, add_special_tokens=False))
