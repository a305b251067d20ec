"""An on-disk cache of a registry's document embeddings, keyed by their content.

Contract:
- :func:`embedding_key` is the hex SHA-256 of everything that decides the vectors: the embedder
  id, the embedder's fingerprint (its config, tokenizer and weights:
  :attr:`~nexus_mlx.routing.embedder.Embedder.fingerprint`), its document prefix and token limit
  (they change the exact text it reads), and the exact list of texts, in order, each
  length-prefixed. Any changed, added, removed or reordered text, or another encoder under the
  same id, gives another key; nothing else does.
- :class:`EmbeddingCache` keeps one ``<key>.npz`` per key in a folder (default
  ``<user cache dir>/embeddings``: ``$NEXUS_MLX_CACHE``, else ``$XDG_CACHE_HOME/nexus-mlx``, else
  ``~/.cache/nexus-mlx``, as :func:`nexus_mlx.models.packages.cache_dir`). ``read`` returns the
  stored float32 ``(N, D)`` vectors, or None when the file is absent, unreadable, truncated,
  written for another key or count, or holds non-finite values: a corrupt file is ignored and
  rebuilt, never trusted. ``write`` is atomic (temporary file in the same folder, then rename)
  and best effort: an unwritable folder returns False instead of failing the caller.
- :class:`CachedDocumentEmbedder` wraps any embedder: ``embed(texts, kind="document")`` is
  served from the cache when the key is there (the wrapped embedder is not called), else embeds
  (in chunks, reporting to an optional progress bar), stores and returns the vectors; query
  embeddings pass straight through. ``hit`` records what the last document call did. An
  embedder without a ``fingerprint`` string cannot say which weights it runs, so it is never
  cached (every call embeds; ``hit`` stays None): a name alone would let two encoders share.

It does not know what a tool is, how the vectors are used, or when a cache file is obsolete:
files of old registries stay until the user deletes the folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from nexus_mlx.models.packages import cache_dir

CACHE_FORMAT = "nexus-mlx/embeddings"
CACHE_VERSION = 1
CHUNK = 256
"""Texts embedded per progress step on a cache miss."""


class Progress(Protocol):
    """What a progress bar needs to offer (``tqdm`` does)."""

    def update(self, n: int) -> Any: ...

    def close(self) -> Any: ...


ProgressFactory = Callable[[int], Progress]
"""Called with the number of texts to embed, on a cache miss only."""


def default_folder() -> Path:
    """``<user cache dir>/embeddings`` (see the module docstring)."""
    return cache_dir() / "embeddings"


def embedder_fingerprint(embedder: Any) -> str | None:
    """The embedder's ``fingerprint`` (a non-empty string), or None when it has none."""
    fingerprint = getattr(embedder, "fingerprint", None)
    return fingerprint if isinstance(fingerprint, str) and fingerprint else None


def embedder_salt(embedder: Any) -> str:
    """What changes the embedder's document vectors besides the text itself: its fingerprint,
    document prefix and token limit."""
    prefix = getattr(embedder, "document_prefix", "")
    limit = getattr(embedder, "max_length", None)
    return json.dumps({"fingerprint": embedder_fingerprint(embedder),
                       "document_prefix": prefix if isinstance(prefix, str) else repr(prefix),
                       "max_length": limit if isinstance(limit, int) else None}, sort_keys=True)


def embedding_key(embedder_id: str, texts: Sequence[str], *, salt: str = "") -> str:
    """Hex SHA-256 of the embedder id, ``salt`` and the texts in order (module docstring)."""
    hasher = hashlib.sha256(f"{CACHE_FORMAT}/{CACHE_VERSION}".encode())
    for part in (embedder_id, salt, str(len(texts)), *texts):
        data = part.encode("utf-8", "surrogatepass")
        hasher.update(len(data).to_bytes(8, "little") + data)
    return hasher.hexdigest()


class EmbeddingCache:
    """A folder of ``<key>.npz`` files (see the module docstring)."""

    def __init__(self, folder: str | os.PathLike[str] | None = None) -> None:
        self.folder = default_folder() if folder is None else Path(folder)

    def __repr__(self) -> str:
        return f"EmbeddingCache({str(self.folder)!r})"

    def path(self, key: str) -> Path:
        return self.folder / f"{key}.npz"

    def read(self, key: str, count: int) -> np.ndarray | None:
        """The ``(count, D)`` float32 vectors stored under ``key``, or None (absent or corrupt)."""
        try:
            with np.load(self.path(key), allow_pickle=False) as files:
                meta = json.loads(str(files["meta"]))
                vectors = np.array(files["vectors"])
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            return None
        ok = (
            isinstance(meta, dict)
            and meta.get("format") == CACHE_FORMAT
            and meta.get("version") == CACHE_VERSION
            and meta.get("key") == key
            and vectors.dtype == np.float32
            and vectors.ndim == 2
            and vectors.shape[0] == count
            and meta.get("count") == count
            and meta.get("dim") == vectors.shape[1]
            and bool(np.isfinite(vectors).all())
        )
        return vectors if ok else None

    def write(self, key: str, vectors: np.ndarray, *, embedder_id: str = "") -> bool:
        """Store ``vectors`` under ``key`` atomically; False (nothing left behind) on failure."""
        arr = np.ascontiguousarray(vectors, dtype=np.float32)  # (N, D)
        meta = {"format": CACHE_FORMAT, "version": CACHE_VERSION, "key": key,
                "embedder_id": embedder_id, "count": int(arr.shape[0]), "dim": int(arr.shape[1])}
        tmp = ""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=self.folder)
            with os.fdopen(fd, "wb") as fh:
                np.savez(fh, meta=np.array(json.dumps(meta)), vectors=arr)
            os.replace(tmp, self.path(key))
        except OSError:
            if tmp and os.path.exists(tmp):
                os.unlink(tmp)
            return False
        return True


class CachedDocumentEmbedder:
    """``embedder`` with its document embeddings cached on disk (module docstring)."""

    def __init__(
        self,
        embedder: Any,
        embedder_id: str,
        cache: EmbeddingCache | None = None,
        *,
        progress: ProgressFactory | None = None,
    ) -> None:
        self.embedder, self.embedder_id = embedder, embedder_id
        self.cache = EmbeddingCache() if cache is None else cache
        self.progress = progress
        self.hit: bool | None = None  # None until the first document embedding

    def embed(self, texts: Sequence[str], *, kind: str = "document") -> np.ndarray:
        if kind != "document":
            return np.asarray(self.embedder.embed(texts, kind=kind), dtype=np.float32)
        items = list(texts)
        if embedder_fingerprint(self.embedder) is None:
            self.hit = None
            return self._embed_all(items)
        key = embedding_key(self.embedder_id, items, salt=embedder_salt(self.embedder))
        cached = self.cache.read(key, len(items))
        self.hit = cached is not None
        if cached is not None:
            return cached
        vectors = self._embed_all(items)
        self.cache.write(key, vectors, embedder_id=self.embedder_id)
        return vectors

    def _embed_all(self, texts: list[str]) -> np.ndarray:
        """Embed in chunks of similar-length texts (little padding), rows in input order."""
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        bar = self.progress(len(texts)) if self.progress is not None and texts else None
        parts: list[np.ndarray] = []
        try:
            for start in range(0, len(order), CHUNK):
                chunk = [texts[i] for i in order[start : start + CHUNK]]
                parts.append(np.asarray(self.embedder.embed(chunk, kind="document"),
                                        dtype=np.float32))  # (c, D)
                if bar is not None:
                    bar.update(len(chunk))
        finally:
            if bar is not None:
                bar.close()
        if not parts:
            return np.asarray(self.embedder.embed([], kind="document"), dtype=np.float32)
        stacked = np.concatenate(parts, axis=0)  # (N, D) in sorted order
        out = np.empty_like(stacked)
        out[np.asarray(order)] = stacked
        return out
