"""Tool-name FSM: a radix trie over tool names that masks logits to tokens continuing a valid name.

Contract: ``NameFSM(names, tokenizer, terminator='"')`` accepts exactly the token sequences whose
decoded bytes spell ``name + terminator`` for one of ``names``. The trie is built over *bytes*,
not over one tokenization, so every split of a name into vocabulary tokens is accepted (the
canonical one and any other the model prefers): token ``t`` is allowed in a state iff the bytes
generated so far followed by ``t``'s bytes are still a prefix of some ``name + terminator``. The
terminator is what the generated text puts after the name (``'"'`` when the name is a JSON string
value after ``{"name": "``; :mod:`nexus_mlx.decode.tool_call` uses ``'", "arguments":'``), so a
token merging the end of a name with the terminator (``",``) is allowed, and a name that is a
prefix of another (``get_issue`` / ``get_issue_comments``) is only complete once its terminator is
matched. After completion nothing is allowed. Special tokens (``<|im_end|>``) never are.

``allowed_mask()`` is a ``(V,)`` bool array; ``accept_token(id) -> bool`` (``False`` leaves the
state unchanged: rule 6 of the house style); ``is_complete()``, ``matched_name()``, ``reset()``,
``logits_processor()`` (mlx-lm's ``(tokens, logits) -> logits``, allowing only end-of-sequence
once complete). Masks are computed lazily per
trie state and cached: a state's mask is the union, over the targets still reachable, of the ids
of every non-empty prefix of the remaining bytes (a dict lookup each), so a fresh state costs a few
thousand lookups and a revisited one a dict hit.

:class:`TokenVocab` is the byte view of a vocabulary that the FSM (and the JSON constraint) use:
byte-level BPE tokens through GPT-2's byte table, SentencePiece pieces with ``▁`` as a space and
``<0xNN>`` as that byte. It does not know grammars, JSON, tools or models.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import mlx.core as mx
import numpy as np

from nexus_mlx.errors import TokenError, ToolError
from nexus_mlx.models.tokenizer import SPM_SPACE, eos_token_ids, gpt2_unicode_to_byte


def backend_tokenizer(tokenizer: Any) -> Any:
    """The ``tokenizers.Tokenizer`` behind an mlx-lm wrapper, a fast HF tokenizer, or itself."""
    inner = getattr(tokenizer, "_tokenizer", tokenizer)
    backend = getattr(inner, "backend_tokenizer", inner)
    if not (hasattr(backend, "id_to_token") and hasattr(backend, "to_str")):
        raise TokenError(f"{type(tokenizer).__name__} has no `tokenizers` backend to read")
    return backend


def _decoder_kinds(spec: dict[str, Any] | None) -> list[str]:
    if not spec:
        return []
    if spec.get("type") == "Sequence":
        return [str(d.get("type")) for d in spec.get("decoders", [])]
    return [str(spec.get("type"))]


def _piece_bytes(piece: str, byte_level: bool) -> bytes:
    if byte_level:
        table = gpt2_unicode_to_byte()
        if all(c in table for c in piece):
            return bytes(table[c] for c in piece)
        return piece.encode("utf-8")  # an added token outside the byte alphabet is kept as is
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        try:
            return bytes([int(piece[3:5], 16)])
        except ValueError:
            pass
    return piece.replace(SPM_SPACE, " ").encode("utf-8")


@dataclass(frozen=True, eq=False)
class TokenVocab:
    """Every token's bytes (``b""`` for special tokens), the special and end-of-sequence ids."""

    token_bytes: tuple[bytes, ...]
    special_ids: frozenset[int]
    eos_ids: tuple[int, ...]
    by_bytes: dict[bytes, tuple[int, ...]] = field(init=False, repr=False)
    max_token_bytes: int = field(init=False)

    def __post_init__(self) -> None:
        groups: dict[bytes, list[int]] = {}
        for i, data in enumerate(self.token_bytes):
            if data and i not in self.special_ids:
                groups.setdefault(data, []).append(i)
        object.__setattr__(self, "by_bytes", {k: tuple(v) for k, v in groups.items()})
        object.__setattr__(self, "max_token_bytes", max(map(len, groups), default=0))

    @property
    def size(self) -> int:
        return len(self.token_bytes)

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> TokenVocab:
        """Read the vocabulary of ``tokenizer`` (see :func:`vocab_of` for the cached version)."""
        backend = backend_tokenizer(tokenizer)
        spec = json.loads(backend.to_str())
        kinds = _decoder_kinds(spec.get("decoder"))
        byte_level = "ByteLevel" in kinds
        if not byte_level and not {"Metaspace", "Replace", "ByteFallback"} & set(kinds):
            raise TokenError(f"cannot read token bytes through decoder {kinds or None}")
        size = backend.get_vocab_size(with_added_tokens=True)
        special = frozenset(int(t["id"]) for t in spec.get("added_tokens", []) if t.get("special"))
        pieces = [backend.id_to_token(i) for i in range(size)]
        data = tuple(
            b"" if (i in special or p is None) else _piece_bytes(p, byte_level)
            for i, p in enumerate(pieces)
        )
        return cls(data, special, eos_token_ids(tokenizer))


_VOCABS: weakref.WeakKeyDictionary[Any, TokenVocab] = weakref.WeakKeyDictionary()


def token_bytes(tokenizer: Any, token: int) -> bytes:
    """``token``'s UTF-8 bytes; a special token's (which has none in the vocabulary): its text."""
    vocab = vocab_of(tokenizer)
    data = vocab.token_bytes[token]
    if data and token not in vocab.special_ids:
        return data
    return str(tokenizer.decode([token])).encode()


def vocab_of(tokenizer: Any) -> TokenVocab:
    """:class:`TokenVocab` of ``tokenizer``, cached per tokenizer object (a vocab passes through)."""
    if isinstance(tokenizer, TokenVocab):
        return tokenizer
    try:
        return _VOCABS[tokenizer]
    except (KeyError, TypeError):
        pass
    vocab = TokenVocab.from_tokenizer(tokenizer)
    try:
        _VOCABS[tokenizer] = vocab
    except TypeError:  # not weak-referenceable: no caching
        pass
    return vocab


def mask_logits(logits: mx.array, mask: mx.array) -> mx.array:
    """``logits`` ``(1, V')`` with every id where the bool ``mask`` ``(V,)`` is False set to -inf.

    Ids beyond ``V`` (a model head wider than the tokenizer) are masked too."""
    width = logits.shape[-1]
    if mask.shape[0] < width:
        mask = mx.concatenate([mask, mx.zeros((width - mask.shape[0],), dtype=mx.bool_)])
    elif mask.shape[0] > width:
        mask = mask[:width]
    return mx.where(mask, logits, mx.array(-mx.inf, dtype=logits.dtype))


def history_tracker() -> Callable[[mx.array], list[int]]:
    """For logits processors: ``f(tokens)`` returns the ids appended to the history since the
    previous call (none on the first call, whose history is the prompt)."""
    seen: list[int] = []

    def new_tokens(tokens: mx.array) -> list[int]:
        n = int(tokens.size)
        if not seen:
            seen.append(n)
            return []
        start, seen[0] = seen[0], max(seen[0], n)
        return cast(list[int], tokens.reshape(-1)[start:n].tolist()) if n > start else []

    return new_tokens


# ----------------------------------------------------------------------------- radix trie


class _Node:
    """A radix-trie node: edges keyed by their first byte; ``target`` ends here when set."""

    __slots__ = ("edges", "target")

    def __init__(self) -> None:
        self.edges: dict[int, tuple[bytes, _Node]] = {}
        self.target: int | None = None


def _insert(root: _Node, key: bytes, index: int) -> None:
    node, rest = root, key
    while rest:
        edge = node.edges.get(rest[0])
        if edge is None:
            leaf = _Node()
            node.edges[rest[0]] = (rest, leaf)
            node = leaf
            rest = b""
            break
        label, child = edge
        common = 0
        limit = min(len(label), len(rest))
        while common < limit and label[common] == rest[common]:
            common += 1
        if common < len(label):  # split the edge at the divergence point
            middle = _Node()
            middle.edges[label[common]] = (label[common:], child)
            node.edges[rest[0]] = (label[:common], middle)
            child = middle
        node, rest = child, rest[common:]
    node.target = index


@dataclass(frozen=True)
class _Cursor:
    """A trie position: at ``node`` (``depth == 0``) or ``depth`` bytes into the edge ``key``."""

    node: _Node
    key: int = -1
    depth: int = 0


def _walk(cursor: _Cursor, data: bytes) -> _Cursor | None:
    node, key, depth = cursor.node, cursor.key, cursor.depth
    pos = 0
    while pos < len(data):
        if depth == 0:
            if data[pos] not in node.edges:
                return None
            key = data[pos]
        label, child = node.edges[key]
        take = min(len(label) - depth, len(data) - pos)
        if label[depth: depth + take] != data[pos: pos + take]:
            return None
        pos += take
        depth += take
        if depth == len(label):
            node, key, depth = child, -1, 0
    return _Cursor(node, key, depth)


def _suffixes(cursor: _Cursor) -> list[tuple[bytes, int]]:
    """Every (remaining bytes, target index) reachable from ``cursor``."""
    out: list[tuple[bytes, int]] = []
    if cursor.depth:
        label, child = cursor.node.edges[cursor.key]
        start = [(label[cursor.depth:], child)]
    else:
        if cursor.node.target is not None:
            out.append((b"", cursor.node.target))
        start = [(label, child) for label, child in cursor.node.edges.values()]
    stack = start
    while stack:
        prefix, node = stack.pop()
        if node.target is not None:
            out.append((prefix, node.target))
        stack.extend((prefix + label, child) for label, child in node.edges.values())
    return out


class NameFSM:
    """Constrain generation to one of ``names`` followed by ``terminator`` (module docstring)."""

    def __init__(self, names: Iterable[str], tokenizer: Any, *, terminator: str = '"') -> None:
        self.names: tuple[str, ...] = tuple(names)
        if not self.names:
            raise ToolError("NameFSM needs at least one name")
        if not isinstance(terminator, str) or not terminator:
            raise ToolError(f"terminator must be a non-empty string, got {terminator!r}")
        dupes = sorted({n for n in self.names if self.names.count(n) > 1})
        if dupes:
            raise ToolError(f"duplicate names: {dupes}")
        self.terminator = terminator
        self.vocab = vocab_of(tokenizer)
        targets = [(n + terminator).encode("utf-8") for n in self.names]
        ordered = sorted(range(len(targets)), key=lambda i: targets[i])
        for a, b in zip(ordered, ordered[1:], strict=False):
            if targets[b].startswith(targets[a]):
                raise ToolError(f"{targets[a]!r} is a prefix of {targets[b]!r}: completion "
                                   "would be ambiguous; use a terminator the names do not contain")
        self._root = _Node()
        for index, target in enumerate(targets):
            _insert(self._root, target, index)
        self._masks: dict[bytes, np.ndarray] = {}
        self._mx_masks: dict[bytes, mx.array] = {}
        self.reset()

    # -- state -----------------------------------------------------------------------------
    def reset(self) -> None:
        """Back to the empty prefix."""
        self._cursor = _Cursor(self._root)
        self._prefix = b""
        self.tokens: list[int] = []

    @property
    def prefix(self) -> bytes:
        """The bytes accepted so far."""
        return self._prefix

    def is_complete(self) -> bool:
        """A full ``name + terminator`` has been accepted."""
        return self._cursor.depth == 0 and self._cursor.node.target is not None

    def matched_name(self) -> str | None:
        """The accepted name once complete, else ``None``."""
        target = self._cursor.node.target if self.is_complete() else None
        return None if target is None else self.names[target]

    def candidates(self) -> list[str]:
        """Names still consistent with the accepted prefix, in the order given."""
        return [self.names[i] for i in sorted(t for _, t in _suffixes(self._cursor))]

    def remaining(self) -> bytes | None:
        """The bytes left when exactly one target is still reachable, else ``None``."""
        options = _suffixes(self._cursor)
        return options[0][0] if len(options) == 1 else None

    # -- masks -----------------------------------------------------------------------------
    def _compute_mask(self) -> np.ndarray:
        mask = np.zeros(self.vocab.size, dtype=bool)
        if self.is_complete():
            return mask
        lookup, longest = self.vocab.by_bytes, self.vocab.max_token_bytes
        seen: set[bytes] = set()
        for rest, _ in _suffixes(self._cursor):
            for k in range(1, min(len(rest), longest) + 1):
                piece = rest[:k]
                if piece in seen:
                    continue
                seen.add(piece)
                ids = lookup.get(piece)
                if ids:
                    mask[list(ids)] = True
        return mask

    def allowed_mask(self) -> np.ndarray:
        """``(V,)`` bool: the tokens that keep the text a prefix of some ``name + terminator``.

        The array is cached and shared: do not modify it."""
        mask = self._masks.get(self._prefix)
        if mask is None:
            mask = self._compute_mask()
            mask.flags.writeable = False
            self._masks[self._prefix] = mask
        return mask

    def allowed_mask_mx(self) -> mx.array:
        """:meth:`allowed_mask` as a cached MLX bool array (for :func:`mask_logits`)."""
        cached = self._mx_masks.get(self._prefix)
        if cached is None:
            cached = mx.array(self.allowed_mask())
            self._mx_masks[self._prefix] = cached
        return cached

    def allowed_tokens(self) -> np.ndarray:
        """Ids of the allowed tokens, ascending."""
        return np.flatnonzero(self.allowed_mask())

    # -- transitions -----------------------------------------------------------------------
    def accept_token(self, token: int) -> bool:
        """Advance by ``token``; ``False`` (state unchanged) when it cannot continue a name."""
        token = int(token)
        if self.is_complete() or not 0 <= token < self.vocab.size:
            return False
        if token in self.vocab.special_ids:
            return False
        data = self.vocab.token_bytes[token]
        if not data:
            return False
        moved = _walk(self._cursor, data)
        if moved is None:
            return False
        self._cursor = moved
        self._prefix += data
        self.tokens.append(token)
        return True

    def accept_tokens(self, tokens: Sequence[int]) -> int:
        """Accept tokens in order until one is rejected; returns how many were accepted."""
        for n, token in enumerate(tokens):
            if not self.accept_token(token):
                return n
        return len(tokens)

    def logits_processor(self) -> Callable[[mx.array, mx.array], mx.array]:
        """An mlx-lm logits processor: feeds each newly sampled token (the tokens after the
        history seen on the first call) to :meth:`accept_token`, then masks the logits.

        Once the name is complete only end-of-sequence ids are allowed, so ``generate_tokens``
        stops there. A sampled token the FSM rejects (a sampler ignoring the mask) leaves the
        state as is."""
        new_tokens = history_tracker()
        eos = np.zeros(self.vocab.size, dtype=bool)
        eos[list(self.vocab.eos_ids)] = True
        eos_mask = mx.array(eos)

        def process(tokens: mx.array, logits: mx.array) -> mx.array:
            for token in new_tokens(tokens):
                self.accept_token(token)
            return mask_logits(logits, eos_mask if self.is_complete() else self.allowed_mask_mx())

        return process
