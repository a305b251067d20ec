"""Byte-level scanning of generated JSON text for the schema constraint.

Contract: :class:`JsonScanner` tracks whether generated JSON text is inside a string value (and of which
key), token by token, from the tokens' bytes; the helpers decode JSON string bytes and find the
vocabulary ids that start with given bytes (sorted-vocabulary bisection) or close a string.
Internal to :mod:`.json_constraint`; it knows nothing about grammars or models.
"""

from __future__ import annotations

import bisect
import json
from functools import lru_cache

import numpy as np

from nexus_mlx.decode.name_fsm import TokenVocab


class JsonScanner:
    """Tracks where generated JSON text is: inside a string value (and of which key) or not."""

    def __init__(self) -> None:
        self.keys: list[str | None] = []  # per open container: the key its values belong to
        self.kinds: list[str] = []  # "o" / "a"
        self.expect_key = False
        self.in_string = False
        self.is_key = False
        self.escape = False
        self.raw = bytearray()

    def copy(self) -> JsonScanner:
        twin = JsonScanner()
        twin.keys, twin.kinds = list(self.keys), list(self.kinds)
        twin.expect_key, twin.in_string = self.expect_key, self.in_string
        twin.is_key, twin.escape, twin.raw = self.is_key, self.escape, bytearray(self.raw)
        return twin

    def feed(self, data: bytes) -> list[tuple[bytes, str | None]]:
        """Advance over ``data``; returns the value strings it closed (raw bytes, their key)."""
        closed: list[tuple[bytes, str | None]] = []
        for c in data:
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif c == 0x5C:  # backslash
                    self.escape = True
                elif c == 0x22:  # closing quote
                    self.in_string = False
                    if self.is_key and self.keys:
                        self.keys[-1] = decode_json_string(bytes(self.raw))
                    elif not self.is_key:
                        closed.append((bytes(self.raw), self.key))
                    continue
                self.raw.append(c)
            elif c == 0x22:
                self.in_string, self.escape = True, False
                self.is_key = bool(self.kinds) and self.kinds[-1] == "o" and self.expect_key
                self.raw.clear()
            elif c in b"{[":
                inherited = self.keys[-1] if self.keys else None
                self.kinds.append("o" if c == 0x7B else "a")
                self.keys.append(None if c == 0x7B else inherited)
                self.expect_key = c == 0x7B
            elif c in b"}]":
                if self.kinds:
                    self.kinds.pop()
                    self.keys.pop()
                self.expect_key = False
            elif c == 0x3A:  # colon
                self.expect_key = False
            elif c == 0x2C and self.kinds and self.kinds[-1] == "o":
                self.expect_key = True
        return closed

    @property
    def in_value_string(self) -> bool:
        return self.in_string and not self.is_key

    @property
    def key(self) -> str | None:
        return self.keys[-1] if self.keys else None


def decode_json_string(raw: bytes) -> str | None:
    if b"\\" not in raw:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
    try:
        value = json.loads(b'"' + raw + b'"')
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, str) else None


@lru_cache(maxsize=8)
def _sorted_vocab(vocab: TokenVocab) -> tuple[list[bytes], np.ndarray]:
    order = sorted(vocab.by_bytes)
    ids = [vocab.by_bytes[k] for k in order]
    return order, np.array([i[0] for i in ids], dtype=np.int64)


def ids_with_prefix(vocab: TokenVocab, prefix: bytes) -> np.ndarray:
    """Ids of the (first of equal) tokens whose bytes start with ``prefix``."""
    keys, ids = _sorted_vocab(vocab)
    lo = bisect.bisect_left(keys, prefix)
    hi = lo
    while hi < len(keys) and keys[hi].startswith(prefix):
        hi += 1
    extra = [j for k in keys[lo:hi] for j in vocab.by_bytes[k][1:]]
    return np.concatenate([ids[lo:hi], np.array(extra, dtype=np.int64)])


@lru_cache(maxsize=8)
def quote_ids(
    vocab: TokenVocab,
) -> tuple[np.ndarray, np.ndarray, tuple[bytes, ...], tuple[bytes, ...]]:
    """The (non-special) tokens containing a double quote, the only ones that can open or close
    a string: ids, whether each has exactly one, the bytes before the first and after the last."""
    ids = [i for i, data in enumerate(vocab.token_bytes)
           if b'"' in data and i not in vocab.special_ids]
    data = [vocab.token_bytes[i] for i in ids]
    single = np.array([d.count(b'"') == 1 for d in data], dtype=bool)
    tails = tuple(d[: d.index(b'"')] for d in data)
    heads = tuple(d[d.rindex(b'"') + 1:] for d in data)
    return np.array(ids, dtype=np.int64), single, tails, heads


