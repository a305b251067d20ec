"""Semantic lookaside buffer (SLB): INT8 tool embeddings and a top-k scan (paper 1, routing).

Contract:
- A :class:`SemanticLookasideBuffer` holds one embedding per tool name, rows in insertion order
  (``names[i]`` is row ``i``), for one embedder (``embedder_id``) and width (``dim``). Rows are
  stored INT8 with symmetric per-vector quantization (``scale = max|x| / 127``; see
  :func:`nexus_mlx.kernels.int8_scan.quantize_rows`), zero-padded to a multiple of 64 bytes,
  with per-row code sums for the VNNI scan. The float32 vectors are kept too (``keep_float``)
  for :meth:`scan_exact` and recall checks.
- :meth:`scan` quantizes the query the same way, takes int8 dot products accumulated in int32,
  ranks rows by the dequantized score ``dot * row_scale * query_scale`` and returns
  ``(indices int64, scores float32)`` for the ``min(k, len)`` best rows, best first; equal
  scores rank the lower row index first, on every path (native SIMD, numpy, GPU kernel).
  :meth:`scan_exact` is the same ranking over the float32 vectors (``vectors @ query``).
- :meth:`add` / :meth:`remove` change rows incrementally (removal keeps the order of the rest);
  :meth:`save` / :meth:`load` write and read one ``.npz`` file (no pickle) that records the
  embedder identity and width, checked against the caller's expectations at load; the file
  format and its checks are :mod:`nexus_mlx.routing.slb_file`.
- Caller errors raise :class:`ArgumentError` (:class:`ModelMismatchError` for another embedder or
  width) naming the values: dimension mismatch, duplicate or unknown names, non-finite values,
  a scan of an empty buffer, ``k <= 0``. A failed operation leaves the buffer unchanged.

It is not thread-safe for concurrent mutation; concurrent scans are safe (the agent holds one
lock per turn anyway). It knows nothing about the LLM, its cache or the margin gate; embedding
text is the caller's job (or :meth:`from_registry`'s, through any object with ``embed``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any, Literal, Protocol

import numpy as np

from nexus_mlx.errors import ArgumentError
from nexus_mlx.kernels import int8_scan as scan_kernels
from nexus_mlx.kernels.int8_scan import MAX_DIM, BoundScan, aligned_rows
from nexus_mlx.routing.slb_file import SlbContents, read_slb, write_slb
from nexus_mlx.tools.registry import ToolRegistry

Device = Literal["cpu", "gpu"]


class TextEmbedder(Protocol):
    """What :meth:`SemanticLookasideBuffer.from_registry` needs from an embedder."""

    def embed(self, texts: Sequence[str], *, kind: Literal["document", "query"] = ...) -> Any: ...


def recall_at_k(found: Sequence[np.ndarray], exact: Sequence[np.ndarray]) -> float:
    """Mean over queries of ``|found_q & exact_q| / |exact_q|`` (index sets of one k)."""
    if len(found) != len(exact) or not found:
        raise ArgumentError(f"need equally many (> 0) result lists, got {len(found)} and {len(exact)}")
    total = 0.0
    for f, e in zip(found, exact, strict=True):
        truth = {int(i) for i in e}
        total += len(truth.intersection(int(i) for i in f)) / max(len(truth), 1)
    return total / len(found)


class SemanticLookasideBuffer:
    """INT8 tool-embedding buffer with a native top-k scan; see the module docstring."""

    def __init__(
        self,
        dim: int,
        embedder_id: str,
        *,
        keep_float: bool = True,
        tools_digest: str | None = None,
    ) -> None:
        if (
            isinstance(dim, bool)
            or not isinstance(dim, int | np.integer)
            or not 0 < dim <= MAX_DIM
        ):
            raise ArgumentError(f"dim must be an integer in [1, {MAX_DIM}], got {dim!r}")
        if not isinstance(embedder_id, str) or not embedder_id:
            raise ArgumentError(f"embedder_id must be a non-empty string, got {embedder_id!r}")
        self._dim = int(dim)
        self._width = scan_kernels.padded_width(self._dim)
        self._embedder_id = embedder_id
        self._keep_float = bool(keep_float)
        self.tools_digest = tools_digest
        self._names: list[str] = []
        self._rows: dict[str, int] = {}
        self._codes = aligned_rows(0, self._width)  # (N, W) int8, zero padding
        self._scales = np.zeros((0,), np.float32)  # (N,)
        self._sums = np.zeros((0,), np.int32)  # (N,)
        self._vectors: np.ndarray | None = (
            np.zeros((0, self._dim), np.float32) if keep_float else None
        )
        self._bound: BoundScan | None = None
        self._gpu_codes: Any = None  # mx.array (N, W) int8, built on the first GPU scan

    # ---- views ----------------------------------------------------------------------------
    @property
    def dim(self) -> int:
        return self._dim

    @property
    def embedder_id(self) -> str:
        return self._embedder_id

    @property
    def keep_float(self) -> bool:
        return self._keep_float

    @property
    def names(self) -> tuple[str, ...]:
        """Tool names, ``names[i]`` being row ``i``."""
        return tuple(self._names)

    @property
    def codes(self) -> np.ndarray:
        """Read-only ``(N, dim)`` int8 codes (without the padding)."""
        view = self._codes[:, : self._dim]
        view.flags.writeable = False
        return view

    @property
    def scales(self) -> np.ndarray:
        """Read-only ``(N,)`` float32 per-row scales."""
        view = self._scales.view()
        view.flags.writeable = False
        return view

    @property
    def vectors(self) -> np.ndarray:
        """Read-only ``(N, dim)`` float32 vectors as added (needs ``keep_float``)."""
        vectors = self._need_vectors("vectors")
        view = vectors.view()
        view.flags.writeable = False
        return view

    @property
    def scan_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Read-only ``(codes (N, W) int8 zero-padded, sums (N,) int32, scales (N,) float32)``:
        what the native scan reads (for benchmarks and :mod:`~nexus_mlx.kernels.int8_scan`)."""
        views = (self._codes.view(), self._sums.view(), self._scales.view())
        for v in views:
            v.flags.writeable = False
        return views

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._rows

    def __repr__(self) -> str:
        return (
            f"SemanticLookasideBuffer({len(self)} tools, dim={self._dim}, "
            f"embedder_id={self._embedder_id!r})"
        )

    def index(self, name: str) -> int:
        """Row of tool ``name``."""
        try:
            return self._rows[name]
        except KeyError:
            raise ArgumentError(f"no tool named {name!r} in the buffer ({len(self)} tools)") from None

    # ---- mutation -------------------------------------------------------------------------
    def add(self, names: Sequence[str], vectors: Any) -> None:
        """Append one row per name (``vectors (len(names), dim)``, any real dtype)."""
        new_names = self._check_names(names, "add")
        clash = sorted(set(new_names) & self._rows.keys())
        if clash:
            raise ArgumentError(f"tools already in the buffer: {clash[:10]}")
        vecs = self._check_vectors(vectors, len(new_names))
        codes, scales = scan_kernels.quantize_rows(vecs)  # (M, D), (M,)
        n, m = len(self), len(new_names)
        rows = aligned_rows(n + m, self._width)
        rows[:n] = self._codes
        rows[n:, : self._dim] = codes
        sums = rows[n:].sum(axis=1, dtype=np.int32)
        self._commit(
            rows,
            np.concatenate([self._scales, scales]),
            np.concatenate([self._sums, sums]),
            None if self._vectors is None else np.concatenate([self._vectors, vecs]),
            self._names + new_names,
        )

    def remove(self, names: Iterable[str]) -> None:
        """Drop the rows of ``names`` (all must be present); the others keep their order."""
        gone = self._check_names(names, "remove")
        unknown = [n for n in gone if n not in self._rows]
        if unknown:
            raise ArgumentError(f"cannot remove tools not in the buffer: {unknown[:10]}")
        keep = np.ones((len(self),), bool)
        keep[np.array([self._rows[n] for n in gone], dtype=np.int64)] = False
        rows = aligned_rows(int(keep.sum()), self._width)
        rows[...] = self._codes[keep]
        self._commit(
            rows,
            self._scales[keep],
            self._sums[keep],
            None if self._vectors is None else self._vectors[keep],
            [n for n, k in zip(self._names, keep, strict=True) if k],
        )

    def _commit(
        self,
        codes: np.ndarray,
        scales: np.ndarray,
        sums: np.ndarray,
        vectors: np.ndarray | None,
        names: list[str],
    ) -> None:
        """Swap in fully built state (nothing can fail after the first assignment)."""
        self._codes = codes
        self._scales = np.ascontiguousarray(scales, dtype=np.float32)
        self._sums = np.ascontiguousarray(sums, dtype=np.int32)
        self._vectors = vectors
        self._names = names
        self._rows = {n: i for i, n in enumerate(names)}
        self._bound = None
        self._gpu_codes = None

    def _check_names(self, names: Any, what: str) -> list[str]:
        if isinstance(names, str):
            raise ArgumentError(f"{what} takes a sequence of names, got the single string {names!r}")
        out = list(names)
        bad = [n for n in out if not isinstance(n, str) or not n]
        if bad:
            raise ArgumentError(f"tool names must be non-empty strings, got {bad[:5]!r}")
        seen: set[str] = set()
        dups: set[str] = set()
        for n in out:
            (dups if n in seen else seen).add(n)
        if dups:
            raise ArgumentError(f"duplicate names in one {what} call: {sorted(dups)[:10]}")
        return out

    def _check_vectors(self, vectors: Any, m: int) -> np.ndarray:
        arr = np.asarray(vectors)
        if arr.dtype.kind not in "biuf":
            raise ArgumentError(f"vectors must be real numbers, got dtype {arr.dtype}")
        if arr.ndim == 1 and m == 1:
            arr = arr[None, :]
        if arr.ndim != 2 or arr.shape[0] != m or arr.shape[1] != self._dim:
            raise ArgumentError(
                f"vectors of shape {arr.shape} do not match {m} names of dim {self._dim} "
                f"(embedder {self._embedder_id!r})"
            )
        vecs = np.ascontiguousarray(arr, dtype=np.float32)
        finite = np.isfinite(vecs).all(axis=1)
        if not finite.all():
            bad = np.flatnonzero(~finite)[:10].tolist()
            raise ArgumentError(f"vectors for rows {bad} hold NaN or inf")
        return vecs

    def _need_vectors(self, what: str) -> np.ndarray:
        if self._vectors is None:
            raise ArgumentError(
                f"{what} needs the float32 vectors, but this buffer has keep_float=False"
            )
        return self._vectors

    # ---- scans ----------------------------------------------------------------------------
    def _check_scan(self, k: int) -> None:
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or k <= 0:
            raise ArgumentError(f"k must be a positive integer, got {k!r}")
        if not self._names:
            raise ArgumentError("cannot scan an empty buffer: add tools first")

    def _query(self, query: Any) -> np.ndarray:
        arr = np.asarray(query)
        if arr.dtype.kind not in "biuf":
            raise ArgumentError(f"query must be real numbers, got dtype {arr.dtype}")
        if arr.ndim == 2 and arr.shape[0] == 1:
            arr = arr[0]
        if arr.shape != (self._dim,):
            raise ArgumentError(
                f"query has shape {arr.shape}, but the buffer holds dim {self._dim} vectors"
            )
        q = np.ascontiguousarray(arr, dtype=np.float32)
        if not np.isfinite(q).all():
            raise ArgumentError("query holds a non-finite value (NaN or inf)")
        return q

    def scan(
        self, query: Any, k: int, *, use_kernel: bool = True, device: Device = "cpu"
    ) -> tuple[np.ndarray, np.ndarray]:
        """INT8 top-k: ``(indices (k',) int64, scores (k',) float32)``, ``k' = min(k, len)``.

        ``device="cpu"`` uses the native SIMD scan (numpy when ``use_kernel=False`` or it is
        unavailable); ``device="gpu"`` computes the int32 scores with the Metal/CUDA kernel
        (MLX reference elsewhere) and ranks them on the host. All give identical results.
        """
        if k.__class__ is not int or k <= 0 or not self._names:
            self._check_scan(k)
            k = int(k)
        if device == "cpu" and use_kernel:
            bound = self._bound if self._bound is not None else self._bind()
            if bound is not None:
                try:
                    idx, scores, _ = bound.search(query, k)
                except ArgumentError as exc:
                    self._query(query)  # raises the ArgumentError that names the problem
                    raise ArgumentError(str(exc)) from exc
                return idx, scores
        q = self._query(query)
        if device == "cpu":
            idx, scores, _ = scan_kernels.search_reference(self._codes, self._scales, q, k)
            return idx, scores
        if device != "gpu":
            raise ArgumentError(f"device must be 'cpu' or 'gpu', got {device!r}")
        return self._scan_gpu(q, k, use_kernel)

    def _bind(self) -> BoundScan | None:
        native = scan_kernels.native_scan()
        if native is None:
            return None
        self._bound = native.bind(self._codes, self._sums, self._scales, self._dim)
        return self._bound

    def _scan_gpu(self, q: np.ndarray, k: int, use_kernel: bool) -> tuple[np.ndarray, np.ndarray]:
        import mlx.core as mx

        qcodes, qscale = scan_kernels.quantize_rows(q[None, :])  # (1, D), (1,)
        qrow = np.zeros((self._width,), np.int8)
        qrow[: self._dim] = qcodes[0]
        if self._gpu_codes is None:
            self._gpu_codes = mx.array(self._codes)  # (N, W)
        dots = scan_kernels.int8_scores(self._gpu_codes, mx.array(qrow), use_kernel=use_kernel)
        keys = scan_kernels.keys_from_scores(np.array(dots, dtype=np.int32), self._scales)
        idx = scan_kernels.topk_reference(keys, k)
        return idx, keys[idx] * qscale[0]

    def scan_exact(self, query: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
        """float32 top-k over the kept vectors (``vectors @ query``), same tie rule as
        :meth:`scan`: ``(indices, scores)``."""
        self._check_scan(k)
        vectors = self._need_vectors("scan_exact")
        scores = vectors @ self._query(query)  # (N,) float32
        idx = scan_kernels.topk_reference(scores, int(k))
        return idx, scores[idx]

    def lookup(self, query: Any, k: int) -> list[tuple[str, float]]:
        """:meth:`scan` as ``[(tool name, score), ...]``, best first."""
        idx, scores = self.scan(query, k)
        return [(self._names[int(i)], float(s)) for i, s in zip(idx, scores, strict=True)]

    def recall_at_k(self, queries: Any, k: int, *, use_kernel: bool = True) -> float:
        """Mean recall@k of :meth:`scan` against :meth:`scan_exact` over ``queries (Q, dim)``."""
        qs = np.asarray(queries, dtype=np.float32)
        if qs.ndim != 2 or qs.shape[0] == 0:
            raise ArgumentError(f"queries must be a non-empty (Q, {self._dim}) array, got {qs.shape}")
        found = [self.scan(q, k, use_kernel=use_kernel)[0] for q in qs]
        exact = [self.scan_exact(q, k)[0] for q in qs]
        return recall_at_k(found, exact)

    # ---- building and files -----------------------------------------------------------------
    @classmethod
    def from_registry(
        cls,
        registry: ToolRegistry,
        embedder: TextEmbedder,
        *,
        embedder_id: str,
        parameters: bool = True,
        split_names: bool = True,
        keep_float: bool = True,
    ) -> SemanticLookasideBuffer:
        """Embed every tool's :func:`~nexus_mlx.tools.registry.text_for_embedding` (as
        documents) and fill a buffer in registry order; records ``registry.digest()``."""
        texts = registry.texts_for_embedding(parameters=parameters, split_names=split_names)
        vectors = np.asarray(embedder.embed(texts, kind="document"), dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[0] != len(texts):
            raise ArgumentError(f"the embedder returned shape {vectors.shape} for {len(texts)} texts")
        slb = cls(int(vectors.shape[1]), embedder_id, keep_float=keep_float,
                  tools_digest=registry.digest())
        slb.add(registry.names(), vectors)
        return slb

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write one ``.npz`` (atomically: temporary file, then rename): JSON metadata (format,
        version, embedder id, dim, count, names, quantization, tools digest), codes, scales and,
        if kept, the float32 vectors (see :func:`~nexus_mlx.routing.slb_file.write_slb`)."""
        write_slb(path, SlbContents(
            self._embedder_id,
            self._dim,
            self._names,
            np.ascontiguousarray(self._codes[:, : self._dim]),
            self._scales,
            self._vectors,
            self.tools_digest,
        ))

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        *,
        embedder_id: str | None = None,
        dim: int | None = None,
    ) -> SemanticLookasideBuffer:
        """Read a file written by :meth:`save`. If ``embedder_id`` / ``dim`` are given they must
        match the file's (else :class:`ModelMismatchError`); the arrays are checked for shape,
        range and (with vectors) agreement with their re-quantization."""
        contents = read_slb(path, embedder_id=embedder_id, dim=dim)
        n, d = len(contents.names), contents.dim
        slb = cls(d, contents.embedder_id, keep_float=contents.vectors is not None,
                  tools_digest=contents.tools_digest)
        rows = aligned_rows(n, slb._width)
        rows[:, :d] = contents.codes
        slb._commit(rows, contents.scales, rows.sum(axis=1, dtype=np.int32), contents.vectors,
                    list(contents.names))
        return slb


__all__ = [
    "ArgumentError",
    "SemanticLookasideBuffer",
    "TextEmbedder",
    "recall_at_k",
]
