"""Saving and loading a live session: its cache rows, token ids and settings, checked strictly.

Contract: ``save_session(session, path)`` writes one safetensors file (the live K/V of every layer,
the token ids, the per-row stale flags, the next-token logits) with JSON metadata (format version,
the model's fingerprint, a digest of the chat template, dtype, V layout and the session's
settings). The file is written to a temporary name beside ``path`` and renamed into place, so a
crash never leaves a half-written session under ``path``; ``path`` keeps the name it is given,
whatever its suffix; ``annotations`` (a JSON object: what the caller wants back with the session,
such as a server pool's bookkeeping) are stored beside it. ``load_session(model, tokenizer, path)``
refuses, before building anything, a file that is not a session of this version
(:class:`FormatError`, naming the field), or one made for another model, template or dtype
(:class:`ModelMismatchError`, listing every difference). A loaded session continues exactly where
the saved one stopped. ``read_session`` does the same and returns a :class:`SavedSession`: the
session and its annotations.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from nexus_mlx.agent.session import Session
from nexus_mlx.errors import ArgumentError, FormatError, ModelMismatchError
from nexus_mlx.models.arch import model_plan
from nexus_mlx.models.fingerprint import model_fingerprint
from nexus_mlx.models.forward import make_cache

FORMAT = "nexus-mlx-session"
SETTINGS = frozenset({"policy", "budget", "allocator", "min_reuse", "guard"})  # saved with it
VERSION = 2  # 2: per-row stale flags


def template_digest(tokenizer: Any) -> str:
    """SHA-256 of the tokenizer's chat template (of ``""`` when it has none)."""
    template = getattr(tokenizer, "chat_template", None)
    return hashlib.sha256(str(template or "").encode()).hexdigest()


def _identity(session: Session) -> dict[str, Any]:
    cache = session.cache
    return {
        "model": model_fingerprint(session.model).as_dict(),
        "template": template_digest(session.tokenizer),
        "dtype": str(cache.dtype),
        "v_layout": cache.v_layout,
        "layers": cache.num_layers,
    }


@dataclass(frozen=True)
class SavedSession:
    session: Session
    annotations: dict[str, Any]  # what the saver stored beside it ({} when nothing)


def save_session(session: Session, path: str | os.PathLike[str],
                 annotations: Mapping[str, Any] | None = None) -> Path:
    """Write ``session`` (and ``annotations``) to ``path`` atomically; returns the path."""
    target = Path(path)
    notes = json.loads(json.dumps(dict(annotations or {})))  # JSON now, or a TypeError now
    with session.lock:
        cache = session.cache
        n = cache.n_past
        arrays: dict[str, mx.array] = {
            "tokens": mx.array(cache.tokens[:n].astype(np.int32)),
            "stale": mx.array(session.editor.flags().astype(np.uint8)),
        }
        if session.editor.logits is not None:
            arrays["next_logits"] = session.editor.logits.astype(mx.float32)
        for layer in range(cache.num_layers):
            arrays[f"k.{layer}"] = cache.keys(layer)
            arrays[f"v.{layer}"] = cache.values(layer)
        meta = {"format": FORMAT, "version": VERSION, "n_past": n, **_identity(session),
                "settings": {name: getattr(session, name) for name in sorted(SETTINGS)},
                "annotations": notes}
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=target.name, suffix=".partial.safetensors",
                                   dir=target.parent)
        os.close(fd)
        try:
            mx.save_safetensors(tmp, arrays, metadata={"nexus": json.dumps(meta)})
            _sync(tmp)  # on disk before it takes the name: a crash leaves the old file or the new
            os.replace(tmp, target)
            with contextlib.suppress(OSError):  # the rename made durable, where a directory
                _sync(target.parent)             # can be opened and synced
        finally:
            Path(tmp).unlink(missing_ok=True)
    return target


def _sync(path: str | Path) -> None:
    """fsync a file (or a directory, on platforms that open one)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read(path: Path) -> tuple[dict[str, mx.array], dict[str, Any]]:
    try:
        # the format is fixed: mx.load would otherwise read it from the name (".npz", ...)
        loaded: Any = mx.load(str(path), format="safetensors", return_metadata=True)
    except Exception as exc:  # mx.load raises plain errors on files it cannot parse
        raise FormatError(f"{path} is not a readable safetensors file: {exc}") from None
    arrays = cast(dict[str, mx.array], loaded[0])
    metadata = cast(dict[str, str], loaded[1])
    try:
        meta = json.loads(metadata["nexus"])
    except (KeyError, TypeError, ValueError):
        raise FormatError(f"{path} has no nexus-mlx session metadata") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise FormatError(f"{path} is not a nexus-mlx session (format {meta.get('format')!r})")
    if meta.get("version") != VERSION:
        raise FormatError(f"{path} is session format version {meta.get('version')!r}; this "
                          f"nexus-mlx reads version {VERSION}")
    return arrays, meta


def _check_arrays(path: Path, arrays: dict[str, mx.array], meta: dict[str, Any],
                  expected: Session) -> None:
    n, cache = meta.get("n_past"), expected.cache
    if not isinstance(n, int) or n < 0 or "tokens" not in arrays or arrays["tokens"].shape != (n,):
        raise FormatError(f"{path}: field n_past / tokens is inconsistent")
    if "stale" not in arrays or arrays["stale"].shape != (n,):
        raise FormatError(f"{path}: field stale is missing or not ({n},)")
    shape = (1, cache.n_kv_heads, n, cache.head_dim)
    for layer in range(cache.num_layers):
        for kind in ("k", "v"):
            got = arrays.get(f"{kind}.{layer}")
            if got is None or tuple(got.shape) != shape or got.dtype != cache.dtype:
                raise FormatError(f"{path}: field {kind}.{layer} is missing or not {shape} "
                                  f"{cache.dtype}")
    logits, vocab = arrays.get("next_logits"), model_plan(expected.model).vocab_size
    if n and (logits is None or tuple(logits.shape) != (vocab,)):
        raise FormatError(f"{path}: field next_logits is missing or not ({vocab},)")


def load_session(model: nn.Module, tokenizer: Any, path: str | os.PathLike[str]) -> Session:
    """The session saved at ``path``, for ``model`` and ``tokenizer`` (see the module docstring)."""
    return read_session(model, tokenizer, path).session


def read_session(model: nn.Module, tokenizer: Any, path: str | os.PathLike[str]) -> SavedSession:
    """:func:`load_session` with the annotations saved beside the session."""
    source = Path(path)
    arrays, meta = _read(source)
    settings = meta.get("settings")
    if not isinstance(settings, dict):
        raise FormatError(f"{source}: field settings is missing")
    unknown = sorted(set(settings) - SETTINGS)
    if unknown:
        raise FormatError(f"{source}: field settings has unknown keys {unknown}")
    try:
        session = Session(model, tokenizer, **settings)
    except ArgumentError as exc:
        raise FormatError(f"{source}: field settings is invalid: {exc}") from None
    mine = _identity(session)
    differ = [f"{key}: file {meta.get(key)!r} != here {mine[key]!r}" for key in mine
              if meta.get(key) != mine[key]]
    if differ:
        raise ModelMismatchError(f"{source} was saved for another model or template: "
                                 + "; ".join(differ))
    _check_arrays(source, arrays, meta, session)
    n = int(meta["n_past"])
    cache = make_cache(model)
    if n:
        keys = [arrays[f"k.{layer}"] for layer in range(cache.num_layers)]
        values = [arrays[f"v.{layer}"] for layer in range(cache.num_layers)]
        cache.write(np.arange(n), keys, values, tokens=np.array(arrays["tokens"]).astype(np.int64))
        cache.evaluate()
        session.editor.logits = arrays["next_logits"]
    session.cache = cache
    session.editor.set_flags(np.array(arrays["stale"]).astype(bool))
    notes = meta.get("annotations", {})
    if not isinstance(notes, dict):
        raise FormatError(f"{source}: field annotations is not an object")
    return SavedSession(session, notes)
