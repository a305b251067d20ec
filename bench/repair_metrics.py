"""Fidelity metrics and model plumbing shared by the repair benchmarks (not a benchmark itself).

Contract (import after ``common``, which loads ``nexus_mlx`` and the fast BLAS first):

- ``prefill(model, tokens)``: a fresh cache holding ``tokens``, prefilled in chunks of
  ``CHUNK`` tokens (equal to one full prefill within float rounding, without an N x N score
  matrix per layer); ``reference(model, tokens, edit)`` is Re-prefill of ``p + s`` that way.
- ``answer_logprobs(model, cache, query, answer)``: teacher-forced log-probabilities
  ``(A, V)`` of the ``A`` positions that predict ``answer`` after ``query`` (row 0 predicts
  the first answer token: "the answer position"). The cache is not modified.
- ``evaluate_arm``: KL(p_ref || p_arm) at the answer position (``nexus_mlx.metrics``), top-1
  agreement with the reference's greedy answer over its tokens (teacher-forced), and the arm's
  own greedy answer (taken from the teacher-forced pass when every top-1 matches, decoded with
  ``greedy_continuation`` on a copy of the cache otherwise).
- ``kv_deviation(cache, ref, start)``: mean over layers of ``||K - K_ref|| / ||K_ref||`` and
  the same for V (Frobenius norms over rows ``[start, n_past)``), averaged over K and V.
- ``model_info(spec, model)``: what a result records about the model it ran (the ``--model``
  spec, the file it resolved to, the fingerprint's architecture, layers and weights digest, the
  compute dtype); ``model_label(info)`` is its one-line form for the report.

It does not choose arms or write results.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from nexus_mlx.decode.generate import greedy_continuation
from nexus_mlx.kv.cache import NexusCache
from nexus_mlx.metrics import kl_from_logprobs
from nexus_mlx.models.fingerprint import model_fingerprint
from nexus_mlx.models.forward import forward, make_cache
from nexus_mlx.models.packages import resolve_package_spec
from nexus_mlx.refresh import Edit
from nexus_mlx.refresh.edit import edited_tokens

CHUNK = 1024


def prefill(model: nn.Module, tokens: Sequence[int] | np.ndarray, chunk: int = CHUNK) -> NexusCache:
    """A fresh cache holding ``tokens`` (prefilled ``chunk`` tokens at a time)."""
    arr = np.asarray(tokens, dtype=np.int64)
    cache = make_cache(model)
    for start in range(0, arr.size, chunk):
        forward(model, arr[start : start + chunk], cache, logits="last")
        cache.evaluate()
    return cache


def reference(model: nn.Module, cache: NexusCache, edit: Edit) -> NexusCache:
    """Re-prefill: ``p + s`` from an empty cache."""
    return prefill(model, edited_tokens(cache, edit))


def answer_logprobs(
    model: nn.Module, cache: NexusCache, query: Sequence[int] | np.ndarray, answer: Sequence[int]
) -> np.ndarray:
    """Log-probs ``(A, V)`` predicting each of ``answer``'s tokens after ``query`` (``A >= 1``:
    an empty answer still gives the answer position's distribution)."""
    q = [int(t) for t in query]
    a = [int(t) for t in answer]
    tokens = q + a[:-1] if a else q
    logits = forward(model, tokens, cache.copy(), logits="all")[0, len(q) - 1 :]  # (A, V)
    logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return np.array(logp.astype(mx.float32))


@dataclass(frozen=True)
class ArmEval:
    kl: float  # at the answer position
    agree: float  # top-1 agreement with the reference's greedy answer tokens
    tokens: list[int]  # the arm's own greedy answer


def evaluate_arm(
    model: nn.Module,
    cache: NexusCache,
    query: Sequence[int] | np.ndarray,
    ref_answer: list[int],
    ref_logp: np.ndarray,
    max_tokens: int,
    stop_ids: set[int],
) -> ArmEval:
    """Score one arm's cache against the reference (see the module docstring)."""
    logp = answer_logprobs(model, cache, query, ref_answer)
    top1 = logp.argmax(axis=-1)
    matches = top1[: len(ref_answer)] == np.asarray(ref_answer, dtype=np.int64)
    agree = float(matches.mean()) if ref_answer else float(top1[0] == ref_logp[0].argmax())
    if ref_answer and matches.all():
        tokens = list(ref_answer)
    else:
        tokens = greedy_continuation(model, query, cache.copy(), max_tokens, stop_ids)
    return ArmEval(kl_from_logprobs(ref_logp[0], logp[0]), agree, tokens)


def kv_deviation(cache: NexusCache, ref: NexusCache, start: int) -> float:
    """Mean relative K/V deviation of rows ``[start, n_past)`` from ``ref`` (see module doc)."""
    if cache.n_past != ref.n_past:
        raise ValueError(f"caches differ in length: {cache.n_past} vs {ref.n_past}")
    devs = []
    for layer in range(cache.num_layers):
        for a, b in ((cache.keys(layer), ref.keys(layer)), (cache.values(layer), ref.values(layer))):
            a_rows, b_rows = a[0, :, start:, :], b[0, :, start:, :]  # (H, S, D)
            num = mx.sqrt(mx.sum(mx.square(a_rows - b_rows)))
            den = mx.sqrt(mx.sum(mx.square(b_rows)))
            devs.append(num / mx.maximum(den, 1e-12))
    return float(mx.mean(mx.stack(devs)).item())


def model_info(spec: str, model: nn.Module) -> dict[str, Any]:
    """The model a benchmark ran, as recorded in its result (see the module docstring)."""
    path = resolve_package_spec(spec)
    fingerprint = model_fingerprint(model)
    dtypes = sorted({str(v.dtype) for _, v in tree_flatten(model.parameters())
                     if mx.issubdtype(v.dtype, mx.floating)})
    return {"spec": spec, "file": str(path) if path is not None else spec,
            "architecture": fingerprint.architecture, "num_layers": fingerprint.num_layers,
            "weights_digest": fingerprint.weights_digest, "dtype": ",".join(dtypes)}


def model_label(info: dict[str, Any]) -> str:
    """``"qwen2.5-coder-0.5b (qwen2, 24 layers, mlx.core.float32)"``."""
    return f"{info['spec']} ({info['architecture']}, {info['num_layers']} layers, {info['dtype']})"
