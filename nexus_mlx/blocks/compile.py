"""Compile text (a tool schema) into a :class:`CompiledBlock`, and directories of ``.atb`` files.

Contract:
- ``compile_block(model, tokenizer, text, anchor=None, context=None)`` prefills the optional
  preceding ``context`` at positions ``0..c-1`` and then ``text``'s tokens at positions
  ``anchor..anchor+S-1`` (default ``anchor = c``) through the nexus engine, and returns the K/V
  of the text as a block. Splicing it at ``anchor`` after exactly ``context`` is output-exact.
- ``compile_directory(model, tokenizer, items, out_dir)`` writes one ``<name>.atb`` per item,
  skipping files that are already up to date for this model, text, anchor and context
  (checked from the file's verified header, never from its name or mtime).

Block dtype defaults to the model's compute dtype (float32 on CPU, so an anchored splice is
exact); pass ``dtype="float16"`` for the paper's F16 blocks. It does not splice or route.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from nexus_mlx.blocks.atb import CompiledBlock, block_from_cache, read_header, write_block
from nexus_mlx.errors import FormatError, PositionError
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


def compile_block(
    model: nn.Module,
    tokenizer: Any,
    text: TextOrTokens,
    *,
    anchor: int | None = None,
    context: TextOrTokens | None = None,
    dtype: str | None = None,
) -> CompiledBlock:
    """Prefill ``context`` then ``text`` at ``anchor`` and capture the text's K/V."""
    ctx = encode_text(tokenizer, context) if context is not None else []
    tokens = encode_text(tokenizer, text)
    if not tokens:
        raise FormatError("the text to compile encodes to no tokens")
    anchor = len(ctx) if anchor is None else anchor
    if anchor < len(ctx):
        raise PositionError(f"anchor {anchor} would overlap the {len(ctx)}-token context")
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


def block_path(out_dir: Path, name: str) -> Path:
    """``<out_dir>/<name>.atb`` with characters unsafe in file names replaced by ``_``."""
    return out_dir / f"{_SAFE_NAME.sub('_', name)}.atb"


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
    """Compile every ``name -> text`` item into ``out_dir/<name>.atb`` (atomic writes)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ctx = encode_text(tokenizer, context) if context is not None else []
    dtype_name = _dtype_name(model, dtype)
    written, fresh = [], []
    names: Iterable[str] = list(items)
    for name in progress(names) if progress else names:
        path = block_path(out, name)
        tokens = encode_text(tokenizer, items[name])
        if _is_up_to_date(path, model, tokens, len(ctx), ctx, dtype_name):
            fresh.append(name)
            continue
        block = compile_block(model, tokenizer, tokens, context=ctx, dtype=dtype_name)
        write_block(path, block)
        written.append(name)
    return CompileReport(tuple(written), tuple(fresh))
