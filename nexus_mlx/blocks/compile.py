"""Compile text (a tool schema) into a :class:`CompiledBlock`, and directories of ``.atb`` files.

Contract:
- ``compile_block(model, tokenizer, text, anchor=None, context=None)`` prefills the optional
  preceding ``context`` at positions ``0..c-1`` and then ``text``'s tokens at positions
  ``anchor..anchor+S-1`` (default ``anchor = c``) through the nexus engine, and returns the K/V
  of the text as a block. Splicing it at ``anchor`` after exactly ``context`` is output-exact.
- ``compile_directory(model, tokenizer, items, out_dir)`` writes one block file per item
  (:func:`block_path`), skipping files that are already up to date for this model, text, anchor
  and context (checked from the file's verified header, never from its name or mtime). Every
  item is tokenized and checked to fit the model's positions before any block is compiled.
- Block file names are unique even on case-insensitive file systems (macOS, Windows): a name
  that is lower-case and file-safe is kept (``list_issues`` -> ``list_issues.atb``); any other
  gets its file-safe form plus ``+`` and a hash of the exact name (``T1`` ->
  ``T1+<10 hex>.atb``), and ``+`` never occurs in a kept name.
- A text that does not fit the model's position limit raises :class:`PositionError` naming the
  item (``compile_directory``) or the ``name`` given, its token count and the limit.

Block dtype defaults to the model's compute dtype (float32 on CPU, so an anchored splice is
exact); pass ``dtype="float16"`` for the paper's F16 blocks. It does not splice or route.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from nexus_mlx.blocks.atb import read_header, write_block
from nexus_mlx.blocks.block import CompiledBlock, block_from_cache
from nexus_mlx.errors import ArgumentError, FormatError, PositionError
from nexus_mlx.models.arch import model_plan
from nexus_mlx.models.fingerprint import model_fingerprint
from nexus_mlx.models.forward import compute_dtype, forward, make_cache

TextOrTokens = str | Sequence[int]


def encode_text(tokenizer: Any, text: TextOrTokens) -> list[int]:
    """Token ids of ``text`` without special tokens (ids pass through)."""
    if isinstance(text, str):
        return list(tokenizer.encode(text, add_special_tokens=False))
    return [int(t) for t in text]


def _dtype_name(model: nn.Module, dtype: str | None) -> str:
    if dtype is not None:
        return dtype
    return "float32" if compute_dtype(model) == mx.float32 else "float16"


def check_fits(model: nn.Module, n_tokens: int, anchor: int, name: str | None = None) -> None:
    """Raise :class:`PositionError` unless ``n_tokens`` text tokens at ``anchor..`` fit the
    model's positions (``max_position_embeddings``); the message names ``name`` and the limit."""
    limit = model_plan(model).max_position
    if limit is None or anchor + n_tokens <= limit:
        return
    what = "the text to compile" if name is None else f"block {name!r}"
    raise PositionError(
        f"{what} encodes to {n_tokens} tokens at positions {anchor}..{anchor + n_tokens - 1}, "
        f"past the model's limit of {limit} positions (max_position_embeddings): "
        f"{anchor + n_tokens - limit} too many; shorten it (long enums and descriptions) or "
        "leave this tool to a text prefill"
    )


def compile_block(
    model: nn.Module,
    tokenizer: Any,
    text: TextOrTokens,
    *,
    anchor: int | None = None,
    context: TextOrTokens | None = None,
    dtype: str | None = None,
    name: str | None = None,
) -> CompiledBlock:
    """Prefill ``context`` then ``text`` at ``anchor`` and capture the text's K/V (``name``
    only labels errors)."""
    ctx = encode_text(tokenizer, context) if context is not None else []
    tokens = encode_text(tokenizer, text)
    what = "the text to compile" if name is None else f"block {name!r}"
    if not tokens:
        raise FormatError(f"{what} encodes to no tokens")
    anchor = len(ctx) if anchor is None else anchor
    if anchor < len(ctx):
        raise PositionError(f"{what}: anchor {anchor} would overlap the {len(ctx)}-token context")
    check_fits(model, len(tokens), anchor, name)
    cache = make_cache(model)
    if ctx:
        forward(model, ctx, cache, logits="last")
    forward(model, tokens, cache, positions=range(anchor, anchor + len(tokens)), logits="last")
    block = block_from_cache(model, cache, len(ctx), dtype=_dtype_name(model, dtype))
    mx.eval(block.k, block.v)
    return block


@dataclass(frozen=True)
class CompileReport:
    written: tuple[str, ...]
    up_to_date: tuple[str, ...]


_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")
_KEPT_NAME = re.compile(r"[a-z0-9_][a-z0-9._-]{0,99}")
HASH_SEP = "+"  # never in a kept name, so kept and hashed stems cannot meet
HASH_DIGITS = 10


def block_file_name(name: str) -> str:
    """The file name of ``name``'s block: ``<name>.atb`` when ``name`` is lower-case and
    file-safe (at most 100 characters, not starting with ``.`` or ``-``), else its file-safe
    form (``_`` for unsafe runs, cut to 100) + ``+`` + the first 10 hex digits of the SHA-256 of
    ``name``. Distinct names give names that differ even when case is ignored."""
    if _KEPT_NAME.fullmatch(name):
        return f"{name}.atb"
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_DIGITS]
    return f"{_SAFE_NAME.sub('_', name)[:100]}{HASH_SEP}{digest}.atb"


def block_path(out_dir: str | Path, name: str) -> Path:
    """``out_dir / block_file_name(name)``."""
    return Path(out_dir) / block_file_name(name)


def _is_up_to_date(path: Path, model: nn.Module, tokens: list[int], anchor: int,
                   context: list[int], dtype: str) -> bool:
    try:
        header = read_header(path)
    except (OSError, FormatError):
        return False
    return (
        header.fingerprint == model_fingerprint(model)
        and list(header.tokens) == tokens
        and header.m0 == anchor
        and list(header.context) == context
        and header.dtype == dtype
    )


def compile_directory(
    model: nn.Module,
    tokenizer: Any,
    items: Mapping[str, TextOrTokens],
    out_dir: str | Path,
    *,
    context: TextOrTokens | None = None,
    dtype: str | None = None,
    progress: Callable[[Iterable[Any]], Iterable[Any]] | None = None,
) -> CompileReport:
    """Compile every ``name -> text`` item into ``block_path(out_dir, name)`` (atomic writes)."""
    out = Path(out_dir)
    ctx = encode_text(tokenizer, context) if context is not None else []
    dtype_name = _dtype_name(model, dtype)
    names = list(items)
    paths = {name: block_path(out, name) for name in names}
    seen: dict[str, str] = {}
    for name, path in paths.items():
        other = seen.setdefault(path.name.casefold(), name)
        if other != name:  # a hash collision: never seen, but never overwrite silently
            raise ArgumentError(f"blocks {other!r} and {name!r} would share the file {path.name}")
    encoded = {}
    for name in names:
        encoded[name] = encode_text(tokenizer, items[name])
        if not encoded[name]:
            raise FormatError(f"block {name!r}: the text encodes to no tokens")
        check_fits(model, len(encoded[name]), len(ctx), name)
    out.mkdir(parents=True, exist_ok=True)
    written, fresh = [], []
    for name in progress(names) if progress else names:
        path, tokens = paths[name], encoded[name]
        if _is_up_to_date(path, model, tokens, len(ctx), ctx, dtype_name):
            fresh.append(name)
            continue
        block = compile_block(model, tokenizer, tokens, context=ctx, dtype=dtype_name, name=name)
        write_block(path, block)
        written.append(name)
    return CompileReport(tuple(written), tuple(fresh))
