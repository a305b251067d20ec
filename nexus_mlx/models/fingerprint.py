"""A cheap, deterministic identity of a loaded model: its shapes plus a digest of its weights.

Contract: ``model_fingerprint(model)`` returns a frozen :class:`ModelFingerprint` (architecture,
layer count, KV heads, head dim, vocabulary size, ``weights_digest``) and memoises it on the
model object, like ``model_plan``. Two models get the same fingerprint when they have the same
architecture, shapes and weights; ``mismatches(other)`` names every differing field.

The weights digest is SHA-256 over, for every parameter in name order: its name, shape and
dtype, then the raw bytes of :data:`SAMPLES_PER_TENSOR` elements taken at golden-ratio strides
(``floor(frac(i * 0.618...) * n)``, plus the last element). Why a sample and not every byte:
hashing all weights reads the whole model (seconds for a multi-GB checkpoint) while this costs
a few thousand element reads per tensor whatever the model size. Golden-ratio strides never
alias with a tensor's row length, so the sample spreads over rows and columns alike. What it
catches: a different checkpoint, seed, fine-tune, merged adapter, quantization or dtype (each
changes most elements of some tensor), any renamed or reshaped tensor. What it misses: an edit
confined to a handful of elements that the sample skips. The digest reflects the weights at the
first call; after replacing weights in place, call ``model_fingerprint(model, refresh=True)``.
``arrays_digest(named_arrays)`` is the same digest for arrays that are not an mlx-lm model.

It does not know about caches, RoPE, tokenizers or files.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from nexus_mlx.models.arch import model_plan

SAMPLES_PER_TENSOR = 4096
_FINGERPRINT_ATTR = "_nexus_model_fingerprint"
_GOLDEN = 0.6180339887498949  # frac of the golden ratio: a stride that never aliases


@dataclass(frozen=True)
class ModelFingerprint:
    """What must match between the model that compiled a KV block and the one splicing it."""

    architecture: str
    num_layers: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    weights_digest: str  # 64 hex chars (SHA-256)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def mismatches(self, other: ModelFingerprint) -> list[str]:
        """Human-readable ``field: mine != theirs`` for every differing field."""
        return [
            f"{f.name}: {getattr(self, f.name)!r} != {getattr(other, f.name)!r}"
            for f in fields(self)
            if getattr(self, f.name) != getattr(other, f.name)
        ]


def model_fingerprint(model: nn.Module, *, refresh: bool = False) -> ModelFingerprint:
    """The memoised :class:`ModelFingerprint` of an mlx-lm model (recomputed if ``refresh``)."""
    fingerprint = None if refresh else model.__dict__.get(_FINGERPRINT_ATTR)
    if fingerprint is None:
        plan = model_plan(model)
        fingerprint = ModelFingerprint(
            architecture=plan.architecture,
            num_layers=plan.num_layers,
            n_kv_heads=plan.n_kv_heads,
            head_dim=plan.head_dim,
            vocab_size=plan.vocab_size,
            weights_digest=weights_digest(model),
        )
        object.__setattr__(model, _FINGERPRINT_ATTR, fingerprint)
    return fingerprint


@functools.lru_cache(maxsize=512)
def sample_indices(n: int, k: int = SAMPLES_PER_TENSOR) -> np.ndarray:
    """Flat indices of the elements hashed for a tensor of ``n`` elements: all of them when
    ``n <= k``, else ``k`` golden-ratio-strided ones plus the last, ``(<= k + 1,)`` int64.
    Cached per size (read-only result): a model repeats a handful of tensor sizes."""
    if n <= k:
        picked = np.arange(n, dtype=np.int64)
    else:
        spread = np.modf(np.arange(k, dtype=np.float64) * _GOLDEN)[0] * n
        picked = np.append(np.floor(spread).astype(np.int64), n - 1)
    picked.flags.writeable = False
    return picked


def _sample_bytes(array: mx.array) -> bytes:
    """Little-endian bytes of the hashed elements (bfloat16 as raw 16-bit patterns)."""
    if array.dtype == mx.bfloat16:  # numpy has no bfloat16
        array = array.view(mx.uint16)
    host = np.asarray(array).reshape(-1)  # zero-copy once evaluated
    picked = host[sample_indices(host.size)]
    return picked.astype(picked.dtype.newbyteorder("<"), copy=False).tobytes()


def arrays_digest(named: Iterable[tuple[str, mx.array]]) -> str:
    """SHA-256 (hex) over each ``(name, array)``'s name, shape, dtype and strided element sample,
    in name order: the weights digest of any set of named arrays (an encoder that is not an
    mlx-lm model, such as the routing embedder, uses it directly)."""
    digest = hashlib.sha256()
    for name, array in sorted(named, key=lambda item: item[0]):
        digest.update(f"{name}\0{tuple(array.shape)}\0{array.dtype}\n".encode())
        digest.update(_sample_bytes(array))
    return digest.hexdigest()


def weights_digest(model: nn.Module) -> str:
    """:func:`arrays_digest` over every parameter of ``model``."""
    params: list[tuple[str, mx.array]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    return arrays_digest(params)
