"""The semantic lookaside buffer's file format: one ``.npz`` per buffer, no pickle.

Contract:
- ``write_slb(path, contents)`` writes one file atomically (a temporary file beside the target,
  then ``os.replace``; on failure the previous file is untouched and the temporary removed). It
  holds ``meta``, UTF-8 JSON as a uint8 array: ``{"format": FILE_FORMAT, "version":
  FILE_VERSION, "embedder_id", "dim", "count", "quantization": QUANTIZATION, "tools_digest",
  "has_vectors", "names"}`` in that order; ``codes`` ``(N, dim)`` int8 (no padding); ``scales``
  ``(N,)`` float32; and, when kept, ``vectors`` ``(N, dim)`` float32.
- ``read_slb(path, embedder_id=..., dim=...)`` reads one back as :class:`SlbContents`. A file
  that is unreadable, of another format, version or quantization, or whose metadata or arrays
  are malformed raises :class:`ArgumentError` naming the path and the problem; codes must lie
  in ``[-127, 127]``, scales be finite and non-negative, vectors finite and re-quantize to
  exactly the stored codes and scales. An ``embedder_id`` or ``dim`` given by the caller that
  differs from the file's raises :class:`ModelMismatchError`.

It does not know the buffer in memory (row padding, code sums, scans, mutation): that is
:mod:`nexus_mlx.routing.slb`, whose ``save`` / ``load`` call these two.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nexus_mlx.errors import ArgumentError, ModelMismatchError
from nexus_mlx.kernels import int8_scan as scan_kernels
from nexus_mlx.kernels.int8_scan import MAX_DIM

FILE_FORMAT = "nexus-mlx/slb"
FILE_VERSION = 1
QUANTIZATION = "int8-symmetric-per-vector-max127"


@dataclass(frozen=True, eq=False)
class SlbContents:
    """What one SLB file holds: rows ``i`` of the arrays belong to ``names[i]``."""

    embedder_id: str
    dim: int
    names: Sequence[str]
    codes: np.ndarray  # (N, dim) int8
    scales: np.ndarray  # (N,) float32
    vectors: np.ndarray | None  # (N, dim) float32, or None when the buffer kept none
    tools_digest: str | None = None


def write_slb(path: str | os.PathLike[str], contents: SlbContents) -> None:
    """Write ``contents`` to ``path`` atomically (temporary file, then rename)."""
    meta = {
        "format": FILE_FORMAT,
        "version": FILE_VERSION,
        "embedder_id": contents.embedder_id,
        "dim": contents.dim,
        "count": len(contents.names),
        "quantization": QUANTIZATION,
        "tools_digest": contents.tools_digest,
        "has_vectors": contents.vectors is not None,
        "names": list(contents.names),
    }
    arrays = {
        "meta": np.frombuffer(json.dumps(meta, ensure_ascii=False).encode("utf-8"), np.uint8),
        "codes": contents.codes,
        "scales": contents.scales,
    }
    if contents.vectors is not None:
        arrays["vectors"] = contents.vectors
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)  # type: ignore[arg-type]
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_slb(
    path: str | os.PathLike[str], *, embedder_id: str | None = None, dim: int | None = None
) -> SlbContents:
    """Read and check a file written by :func:`write_slb`; ``embedder_id`` / ``dim``, if given,
    must match the file's (else :class:`ModelMismatchError`)."""
    where = str(path)
    try:
        with np.load(path, allow_pickle=False) as npz:
            files = {name: npz[name] for name in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise ArgumentError(f"{where}: not a readable SLB file ({exc})") from exc
    meta = _read_meta(files, where)
    if embedder_id is not None and meta["embedder_id"] != embedder_id:
        raise ModelMismatchError(
            f"{where} was built by embedder {meta['embedder_id']!r}, not {embedder_id!r}"
        )
    if dim is not None and meta["dim"] != dim:
        raise ModelMismatchError(f"{where} holds dim {meta['dim']} vectors, not dim {dim}")
    n, d = meta["count"], meta["dim"]
    codes = _array(files, "codes", np.int8, (n, d), where)
    scales = _array(files, "scales", np.float32, (n,), where)
    if (codes == -128).any():
        raise ArgumentError(f"{where}: codes must lie in [-127, 127]")
    if not (np.isfinite(scales).all() and (scales >= 0).all()):
        raise ArgumentError(f"{where}: scales must be finite and non-negative")
    vectors = None
    if meta["has_vectors"]:
        vectors = _array(files, "vectors", np.float32, (n, d), where)
        if not np.isfinite(vectors).all():
            raise ArgumentError(f"{where}: vectors are not finite")
        again, again_scales = scan_kernels.quantize_rows(vectors)
        if not (np.array_equal(again, codes) and np.array_equal(again_scales, scales)):
            raise ArgumentError(f"{where}: codes and scales do not match the stored vectors")
    return SlbContents(meta["embedder_id"], d, list(meta["names"]), codes, scales, vectors,
                       meta["tools_digest"])


def _read_meta(files: dict[str, np.ndarray], where: str) -> dict[str, Any]:
    raw = files.get("meta")
    if raw is None or raw.dtype != np.uint8 or raw.ndim != 1:
        raise ArgumentError(f"{where}: no SLB metadata (not written by SemanticLookasideBuffer.save)")
    try:
        meta = json.loads(raw.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArgumentError(f"{where}: corrupt SLB metadata ({exc})") from exc
    if not isinstance(meta, dict) or meta.get("format") != FILE_FORMAT:
        tag = meta.get("format") if isinstance(meta, dict) else None
        raise ArgumentError(f"{where}: not an SLB file (format {tag!r}, expected {FILE_FORMAT!r})")
    if meta.get("version") != FILE_VERSION:
        raise ArgumentError(
            f"{where}: SLB file version {meta.get('version')!r}, this code reads {FILE_VERSION}"
        )
    if meta.get("quantization") != QUANTIZATION:
        raise ArgumentError(f"{where}: unknown quantization {meta.get('quantization')!r}")
    names = meta.get("names")
    count, dim = meta.get("count"), meta.get("dim")
    if (
        not isinstance(count, int)
        or not isinstance(dim, int)
        or count < 0
        or not 0 < dim <= MAX_DIM
    ):
        raise ArgumentError(f"{where}: bad count {count!r} or dim {dim!r}")
    if (
        not isinstance(names, list)
        or len(names) != count
        or not all(isinstance(n, str) and n for n in names)
        or len(set(names)) != count
    ):
        raise ArgumentError(f"{where}: names must be {count} distinct non-empty strings")
    if not isinstance(meta.get("embedder_id"), str) or not meta["embedder_id"]:
        raise ArgumentError(f"{where}: missing embedder_id")
    if not isinstance(meta.get("has_vectors"), bool):
        raise ArgumentError(f"{where}: missing has_vectors")
    meta.setdefault("tools_digest", None)
    return meta


def _array(
    files: dict[str, np.ndarray], key: str, dtype: Any, shape: tuple[int, ...], where: str
) -> np.ndarray:
    arr = files.get(key)
    if arr is None or arr.dtype != dtype or arr.shape != shape:
        got = None if arr is None else f"{arr.dtype} {arr.shape}"
        raise ArgumentError(f"{where}: array {key!r} must be {np.dtype(dtype)} {shape}, got {got}")
    return np.ascontiguousarray(arr)
