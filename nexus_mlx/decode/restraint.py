"""Restraint on optional arguments: small models fill optional arguments with invented values.

Contract: at a *member choice* (an arguments object that may end now or take another member,
``JsonConstraint.member_choice``), :func:`restrained` keeps a sampled token that goes on only
when it beats the best token that ends the object by ``nats`` in the step's logits; otherwise it
returns that ending. :func:`member_ids` lists, per vocabulary, the ids that end an object and
those that go on. Tokens elsewhere (a value being written) are never touched.

It does not know grammars, schemas or models (``json_constraint`` and ``tool_call`` do).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from nexus_mlx.decode.name_fsm import TokenVocab
from nexus_mlx.errors import ArgumentError

DEFAULT_OPTIONAL_MARGIN = 2.0
"""Nats an argument past the required ones must win by (:func:`restrained`). 5 was chosen on
GitHub MCP queries before grounding (results/function_calling_*_margin5.json); with grounding, 2
was chosen on 60 Seal-Tools queries (0, 2, 5 tried) and held on 60 held-out ones and the 78
GitHub ones: one call gained on each set, none lost (results/function_calling_*_qwen_m2*.json)."""


def checked_margin(nats: float) -> float:
    """``nats`` as a float; :class:`ArgumentError` unless it is >= 0 (0: restraint off)."""
    if not nats >= 0:
        raise ArgumentError(f"optional_margin must be >= 0 nats, got {nats!r}")
    return float(nats)


def restrained(token: int, row: np.ndarray, choice: tuple[np.ndarray, np.ndarray] | None,
               nats: float) -> int:
    """``token``, unless at a member choice (``JsonConstraint.member_choice``) it goes on
    to another member without beating the best way to end the object by ``nats`` in ``row``
    (the step's logits, shape (V,)): then that best ending. Small models fill optional
    arguments with invented values; this adds a member only where the model prefers it
    clearly."""
    if choice is None or nats <= 0:
        return token
    ends, goes_on = choice
    if not np.any(goes_on == token):
        return token
    best_end = int(ends[np.argmax(row[ends])])
    return token if row[token] - row[best_end] > nats else best_end


@lru_cache(maxsize=16)
def member_ids(vocab: TokenVocab, in_string: bool) -> tuple[np.ndarray, np.ndarray]:
    """Ids that end an object or go on to its next member, from outside a string (``}``;
    ``,`` or ``"``, after any whitespace) or from inside a value string (``"}``; ``",``, the
    quote first)."""
    ends, goes_on = [], []
    on: tuple[bytes, ...] = (b",",) if in_string else (b",", b'"')
    for token, raw in enumerate(vocab.token_bytes):
        if in_string:  # the quote must come first: a space before it would be string content
            if not raw.startswith(b'"'):
                continue
            raw = raw[1:]
        head = raw.lstrip()[:1]
        if head == b"}":
            ends.append(token)
        elif head in on:
            goes_on.append(token)
    return np.array(ends, dtype=np.int64), np.array(goes_on, dtype=np.int64)
