"""Token ids -> the exact text they decode to, and each token's character span in it.

Contract: ``token_char_spans(tokenizer, ids) -> (text, spans)`` where ``text`` equals what the
tokenizer's ``tokenizers`` backend decodes ``ids`` to (special tokens kept; this is
``tokenizer.decode(ids)`` whenever Hugging Face's optional ``clean_up_tokenization_spaces`` is
off, as it is for every tokenizer nexus-mlx builds) and ``spans`` is an ``(n, 2)`` int64 array of
half-open character ranges, one per token, in order. It runs in O(total length): each token is
turned into the bytes it contributes, the bytes are joined and decoded once, and byte offsets
are mapped to character offsets.

Decoders emulated (read from the backend's serialized decoder):

- ``ByteLevel`` (GPT-2 byte-level BPE): every character of the piece is mapped through the
  inverse of GPT-2's bytes<->unicode table; a piece with a character outside the table (an added
  token such as ``"a b"``) contributes its own UTF-8 bytes, as ``tokenizers`` does. The joined
  bytes are decoded with replacement: each maximal invalid subsequence becomes one U+FFFD.
- SentencePiece: ``Replace`` (``▁`` -> space), ``ByteFallback`` (a run of ``<0xNN>`` tokens is
  decoded together; an invalid run becomes one U+FFFD per byte token), ``Fuse``, ``Strip``
  (after ``Fuse`` it strips the whole text, else each token), and ``Metaspace`` (``▁`` -> space,
  the first token's leading space dropped unless ``prepend_scheme`` is ``"never"``).

Added / special tokens go through the same decoder as every other piece (their content is
their piece), exactly as ``tokenizers`` decodes them.

Span rule: a token's span covers every character at least one of its bytes belongs to. A token
whose bytes split a multi-byte character (or an invalid sequence that became one U+FFFD) shares
that character with its neighbour, so consecutive spans either touch or overlap by exactly that
one character; a token contributing no bytes gets the empty span at its position. Spans are
non-decreasing in both ends and together cover the whole text.

Chat prompts: ``chat_ids(tokenizer, messages)`` / ``chat_text(tokenizer, messages)`` render chat
messages (a string is one user message) with the assistant's turn opened, through the
tokenizer's chat template. A tokenizer without one (a base model such as the packaged
``gemma3-270m``) gets :data:`FALLBACK_CHAT_FORMAT` instead of transformers' ``ValueError``.

It does not know WordPiece / CTC / BPE-suffix decoders (they raise :class:`TokenError`),
Hugging Face's clean-up of spaces before punctuation, or what the text means (``repair.units``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from nexus_mlx.errors import TokenError

_BYTE_FALLBACK_LEN = 6  # "<0xNN>"
SPM_SPACE = "\u2581"
REPLACEMENT = "\ufffd".encode("utf-8")


@lru_cache(maxsize=1)
def gpt2_unicode_to_byte() -> dict[str, int]:
    """The inverse of GPT-2's ``bytes_to_unicode`` table: printable character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table: dict[str, int] = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def backend_of(tokenizer: Any) -> Any:
    """The ``tokenizers.Tokenizer`` behind an mlx-lm ``TokenizerWrapper``, a Hugging Face fast
    tokenizer, or the backend itself."""
    inner = getattr(tokenizer, "_tokenizer", tokenizer)  # TokenizerWrapper -> HF tokenizer
    backend = getattr(inner, "backend_tokenizer", inner)
    if not (hasattr(backend, "id_to_token") and hasattr(backend, "decoder")):
        raise TokenError(f"{type(tokenizer).__name__} has no `tokenizers` backend to read")
    return backend


def decoder_steps(backend: Any) -> list[dict[str, Any]]:
    """The backend's decoder as a flat list of serialized steps (a ``Sequence`` unrolled)."""
    if backend.decoder is None:
        raise TokenError("the tokenizer has no decoder; cannot tell how its pieces join")
    spec = json.loads(backend.decoder.__getstate__())
    return list(spec["decoders"]) if spec.get("type") == "Sequence" else [spec]


# ----------------------------------------------------------------------------- per-token pieces


def _pieces(backend: Any, ids: Sequence[int]) -> list[str]:
    pieces = []
    for i in ids:
        piece = backend.id_to_token(int(i))
        if piece is None:
            raise TokenError(f"token id {int(i)} is not in the vocabulary "
                                 f"(size {backend.get_vocab_size()})")
        pieces.append(piece)
    return pieces


def _byte_level(pieces: list[str]) -> list[bytes]:
    table = gpt2_unicode_to_byte()
    out = []
    for piece in pieces:
        if all(c in table for c in piece):
            out.append(bytes(table[c] for c in piece))
        else:  # tokenizers keeps such a piece (an added token) as its own UTF-8
            out.append(piece.encode("utf-8"))
    return out


def _byte_token(piece: bytes) -> int | None:
    """The byte a ``<0xNN>`` piece stands for, else None."""
    if len(piece) == _BYTE_FALLBACK_LEN and piece.startswith(b"<0x") and piece.endswith(b">"):
        try:
            return int(piece[3:5], 16)
        except ValueError:
            return None
    return None


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _byte_fallback(pieces: list[bytes]) -> list[bytes]:
    """Runs of ``<0xNN>`` pieces -> their bytes if the run is valid UTF-8, else U+FFFD each."""
    out = list(pieces)
    values = [_byte_token(p) for p in pieces]
    k = 0
    while k < len(pieces):
        if values[k] is None:
            k += 1
            continue
        stop = k
        while stop < len(pieces) and values[stop] is not None:
            stop += 1
        run = bytes(v for v in values[k:stop] if v is not None)
        valid = _is_utf8(run)
        for offset in range(stop - k):
            out[k + offset] = run[offset: offset + 1] if valid else REPLACEMENT
        k = stop
    return out


def _strip_lead(pieces: list[bytes], content: bytes, count: int) -> list[bytes]:
    """Drop up to ``count`` leading ``content`` units of the joined pieces, piece by piece."""
    out = list(pieces)
    for k, piece in enumerate(out):
        while count and piece.startswith(content):
            piece, count = piece[len(content):], count - 1
        out[k] = piece
        if piece or not count:
            break
    return out


def _strip_one(piece: bytes, content: bytes, start: int, stop: int) -> bytes:
    [reversed_piece] = _strip_lead([piece[::-1]], content[::-1], stop)
    [piece] = _strip_lead([reversed_piece[::-1]], content, start)
    return piece


def _strip(pieces: list[bytes], step: dict[str, Any], fused: bool) -> list[bytes]:
    """``Strip``: on each piece, or (after ``Fuse``) on the joined text, keeping attribution."""
    content, start, stop = step["content"].encode("utf-8"), int(step["start"]), int(step["stop"])
    if not fused:
        return [_strip_one(p, content, start, stop) for p in pieces]
    tail = _strip_lead([p[::-1] for p in reversed(pieces)], content[::-1], stop)
    return _strip_lead([p[::-1] for p in reversed(tail)], content, start)


def _metaspace(pieces: list[bytes], step: dict[str, Any]) -> list[bytes]:
    """``Metaspace``: ``▁`` -> space; the first piece loses its leading space unless told not to."""
    replacement = step.get("replacement", SPM_SPACE).encode("utf-8")
    out = [p.replace(replacement, b" ") for p in pieces]
    if out and step.get("prepend_scheme", "always") != "never" and out[0].startswith(b" "):
        out[0] = out[0][1:]
    return out


def token_bytes(tokenizer: Any, ids: Sequence[int]) -> list[bytes]:
    """The bytes each token contributes to the decoded text (before UTF-8 decoding)."""
    backend = backend_of(tokenizer)
    steps = decoder_steps(backend)
    if [s["type"] for s in steps] == ["ByteLevel"]:
        return _byte_level(_pieces(backend, ids))
    pieces = [p.encode("utf-8") for p in _pieces(backend, ids)]
    fused = False
    for step in steps:
        kind = step["type"]
        if kind == "Replace" and "String" in step["pattern"]:
            old, new = step["pattern"]["String"].encode("utf-8"), step["content"].encode("utf-8")
            pieces = [p.replace(old, new) for p in pieces]
        elif kind == "ByteFallback":
            pieces = _byte_fallback(pieces)
        elif kind == "Fuse":
            fused = True
        elif kind == "Strip":
            pieces = _strip(pieces, step, fused)
        elif kind == "Metaspace":
            pieces = _metaspace(pieces, step)
        else:
            raise TokenError(f"decoder step {kind!r} is not supported (ByteLevel alone, or "
                                 "Replace with a string pattern, ByteFallback, Fuse, Strip, Metaspace)")
    return pieces


# ----------------------------------------------------------------------------- bytes -> chars


def decode_marking_starts(data: bytes) -> tuple[str, np.ndarray]:
    """Decode with replacement (one U+FFFD per maximal invalid subsequence, as Rust's
    ``from_utf8_lossy``) and mark, per byte, whether it starts a character of the text."""
    starts = (np.frombuffer(data, dtype=np.uint8) & 0xC0) != 0x80  # (N,) lead bytes
    parts: list[str] = []
    pos = 0
    while pos < len(data):
        try:
            parts.append(data[pos:].decode("utf-8"))
            break
        except UnicodeDecodeError as exc:
            bad0, bad1 = pos + exc.start, pos + exc.end
            parts.append(data[pos:bad0].decode("utf-8") + "\ufffd")
            starts[bad0] = True
            starts[bad0 + 1: bad1] = False
            pos = bad1
    return "".join(parts), starts


def token_char_spans(tokenizer: Any, ids: Sequence[int] | np.ndarray) -> tuple[str, np.ndarray]:
    """``(text, spans)``: the decoded text and each token's half-open character span, ``(n, 2)``."""
    chunks = token_bytes(tokenizer, [int(i) for i in np.asarray(ids).reshape(-1)])
    data = b"".join(chunks)
    text, starts = decode_marking_starts(data)
    before = np.concatenate([[0], np.cumsum(starts)]).astype(np.int64)  # (N + 1,) chars begun
    assert before[-1] == len(text)
    lengths = np.array([len(c) for c in chunks], dtype=np.int64)  # (n,)
    ends = np.cumsum(lengths)  # (n,) byte offset after each token
    begins = ends - lengths
    first = before[np.minimum(begins + 1, len(data))] - 1  # char holding a token's first byte
    lo = np.where(lengths > 0, first, before[begins])
    spans = np.stack([lo, before[ends]], axis=1) if len(chunks) else np.zeros((0, 2), np.int64)
    return text, spans.astype(np.int64)


# ----------------------------------------------------------------------------- chat prompts

FALLBACK_CHAT_FORMAT = "{role}: {content}\n"
"""The prompt of a tokenizer without a chat template: the BOS token's text when the tokenizer
adds one, each message as ``"{role}: {content}\n"``, then ``"assistant:"`` (the assistant's
turn opened)."""
FALLBACK_ASSISTANT = "assistant:"


def _messages(messages: Sequence[Mapping[str, str]] | str) -> list[dict[str, str]]:
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    return [dict(m) for m in messages]


def has_chat_template(tokenizer: Any) -> bool:
    """Whether the tokenizer renders chat itself: mlx-lm's ``has_chat_template`` when it has
    one, else a set ``chat_template`` (a Hugging Face tokenizer)."""
    known = getattr(tokenizer, "has_chat_template", None)
    if isinstance(known, bool):
        return known
    return getattr(tokenizer, "chat_template", None) is not None


def _bos_text(tokenizer: Any) -> str:
    """The BOS token's text when encoding adds it (a chat template puts it first), else ``""``."""
    bos_id, bos = getattr(tokenizer, "bos_token_id", None), getattr(tokenizer, "bos_token", None)
    if bos_id is None or not isinstance(bos, str):
        return ""
    return bos if list(tokenizer.encode("a"))[:1] == [bos_id] else ""


def chat_text(tokenizer: Any, messages: Sequence[Mapping[str, str]] | str) -> str:
    """The prompt text of chat ``messages`` (a string is one user message), the assistant's turn
    opened: the chat template's rendering, or :data:`FALLBACK_CHAT_FORMAT` without one."""
    msgs = _messages(messages)
    if has_chat_template(tokenizer):
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        return str(text)
    turns = "".join(FALLBACK_CHAT_FORMAT.format(role=m.get("role", ""),
                                                content=m.get("content", "")) for m in msgs)
    return _bos_text(tokenizer) + turns + FALLBACK_ASSISTANT


def chat_ids(tokenizer: Any, messages: Sequence[Mapping[str, str]] | str) -> list[int]:
    """Token ids of chat ``messages`` (a string is one user message) through the tokenizer's
    chat template, the assistant's turn opened; without a template, the ids of
    :func:`chat_text`'s fallback transcript (special-token text such as the BOS kept)."""
    if not has_chat_template(tokenizer):
        return list(tokenizer.encode(chat_text(tokenizer, messages), add_special_tokens=False))
    prompt = tokenizer.apply_chat_template(_messages(messages), add_generation_prompt=True,
                                           tokenize=True)
    if isinstance(prompt, Mapping):  # some tokenizers return a BatchEncoding
        prompt = prompt["input_ids"]
    return list(prompt)


def eos_token_ids(tokenizer: Any) -> tuple[int, ...]:
    """The tokenizer's end-of-sequence ids, sorted: ``eos_token_ids`` when it has several (GGUF
    tokenizers, mlx-lm's wrapper), else ``eos_token_id``; empty when it names none."""
    ids = getattr(tokenizer, "eos_token_ids", None)
    if ids:
        return tuple(sorted(int(i) for i in ids))
    single = getattr(tokenizer, "eos_token_id", None)
    return () if single is None else (int(single),)
