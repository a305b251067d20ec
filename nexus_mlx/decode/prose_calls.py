"""Calls a reply writes as prose instead of in the call format, and answers that must be words.

Small models often describe a call instead of making it: they write
``{"name": "get_time", "arguments": {...}}`` in their prose or a code fence, sometimes with the
tool's name slightly wrong (``git.diff_unstaged`` for ``git.git_diff_unstaged``,
``get_current_time`` for ``time.get_current_time``).

Contract:
- :func:`resolved_name` maps a written name to the one offered tool it means, or None: the name
  itself when offered; else, compared case-insensitively as words (split at anything that is not
  a letter or a digit), the only offered name whose words contain the written ones in order and
  end with the same word. No match or several: None (never a guess between tools).
- :func:`intended_calls` lists the calls a reply's prose (outside call tags) writes as
  ``{"name": ..., "arguments": {...}}`` objects whose name resolves to an offered tool, named by
  that tool, in order, each distinct one once; arguments that are not an object read as ``{}``.
  They are what the model meant, not checked calls: a caller asks for them again in the format,
  where the name and the arguments are constrained.
- :func:`prose_answer` is a logits processor for a turn that must answer in words: its first
  token begins with a letter or a digit (not JSON, a fence or a call).

It does not run the model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import mlx.core as mx
import numpy as np

from nexus_mlx.decode.call_format import ParsedCall, without_calls
from nexus_mlx.decode.name_fsm import TokenVocab, mask_logits, vocab_of

_WORD_SPLIT = re.compile(r"[^a-z0-9]+")


def _words(name: str) -> list[str]:
    return [w for w in _WORD_SPLIT.split(name.lower()) if w]


def _contains_in_order(words: Sequence[str], within: Sequence[str]) -> bool:
    remaining = iter(within)
    return all(word in remaining for word in words)  # each found after the previous one


def resolved_name(written: str, offered: Sequence[str]) -> str | None:
    """The offered tool ``written`` names (see the module docstring), or None."""
    if written in offered:
        return written
    words = _words(written)
    if not words:
        return None
    matches = [name for name in dict.fromkeys(offered)
               if (tool := _words(name)) and tool[-1] == words[-1]
               and _contains_in_order(words, tool)]
    return matches[0] if len(matches) == 1 else None


def intended_calls(text: str, names: Sequence[str]) -> list[ParsedCall]:
    """The calls ``text`` writes as JSON in its prose (see the module docstring)."""
    decoder = json.JSONDecoder()
    found: list[ParsedCall] = []
    prose = without_calls(text)
    index = prose.find("{")
    while index != -1:
        try:
            value, end = decoder.raw_decode(prose, index)
        except ValueError:
            index = prose.find("{", index + 1)
            continue
        written = value.get("name") if isinstance(value, dict) else None
        name = resolved_name(written, names) if isinstance(written, str) else None
        if name is not None:
            arguments = value.get("arguments")
            call = ParsedCall(name, dict(arguments) if isinstance(arguments, dict) else {})
            if call not in found:
                found.append(call)
        index = prose.find("{", end)
    return found


@lru_cache(maxsize=8)
def _prose_openers(vocab: TokenVocab) -> mx.array:
    """``(V,)`` bool: the ids that may open a prose answer (see :func:`prose_answer`)."""
    keep = np.array([raw.decode("utf-8", errors="replace").lstrip()[:1].isalnum()
                     for raw in vocab.token_bytes], dtype=bool)
    keep[sorted(vocab.special_ids)] = False
    return mx.array(keep)


def prose_answer(tokenizer: Any) -> Callable[[mx.array, mx.array], mx.array]:
    """A logits processor ``(ids so far, logits (1, V)) -> logits`` that lets the first id only
    be a token whose text (after leading whitespace) begins with a letter or a digit: not JSON,
    a code fence, a call or any other punctuation, and no special token (the end of the turn
    included: the answer is not empty). Later ids are free."""
    openers = _prose_openers(vocab_of(tokenizer))

    def process(ids: mx.array, logits: mx.array) -> mx.array:
        return logits if ids.size else mask_logits(logits, openers)

    return process
