"""The most likely next ids without the full output projection: an INT8 scan proposes them, and
a rigorous bound on its error certifies that no other id could beat them.

Contract: ``CertifiedHead.of(model)`` is the model's certified head, built once per model (and
rebuilt if its head weight is replaced), or None where it cannot help: the native INT8 scan is
unavailable, the default device is not the CPU, the head weight is not a float32 matrix
(quantized, or computed in half precision, whose full projection rounds differently), or the
head is under :data:`MIN_HEAD_WEIGHTS` (there the scan saves less than a sequential decode step
costs against a pipelined one). ``top(hidden, n=1, allowed=None, margin=None)`` takes
the last layer's hidden state of one position (``(1, 1, hidden)``, before the final norm) and
returns a :class:`Top`: the ``n`` most likely ids (among the ``allowed`` ones, a constrained
step's mask, which may be narrower than the head: a tokenizer's vocabulary), best first,
with their logits (float32, soft-capped as the model's head does), or None when it cannot
certify them; the caller then computes the full logits
(:func:`~nexus_mlx.models.forward.lm_head`). A certified top is the one the full float32
projection gives: no other id's logit is within ``margin`` of the n-th best, and the n best are
``margin`` apart, so rounding (orders of magnitude below the default :data:`MARGIN`) cannot
reorder them; a caller may ask for a wider margin (the session's close-call guard does).
:class:`HeadRow` holds one position's hidden state and gives its certified best id, or its full
logits only when asked (the session's decode loop; :func:`full_logits` reads either kind).

How: the head's ``(V, D)`` weight is quantized once, per row, as the semantic lookaside buffer's
vectors are (:func:`~nexus_mlx.kernels.int8_scan.quantize_rows`: ``W[r] = s_r (c_r + d_r)``,
``|d_r| <= 1/2``); a step quantizes the normed hidden state ``x = s_q (q + e)`` (``|e| <= 1/2``)
likewise and computes every row's INT8 dot ``c_r . q`` with the native SIMD scan (a quarter of the
float32 weight's bytes, the rows split over the cores). Expanding the product bounds each row's
logit ``W[r] . x`` above by ``s_q s_r c_r . q + s_q (s_r (|q|_1 / 2 + D / 4) + s_r |c_r|_1 / 2)``.
The ``candidates`` rows with the highest bound (among the allowed ones, on a constrained step) get
their exact float32 logits; the top is accepted when its n-th best exact logit exceeds the highest
bound outside the candidates (with a relative slack for float32 rounding) by ``margin``: every
other (allowed) row is then below it. On this machine (2 cores, AVX-512 VNNI) a step over
Qwen2.5-0.5B's 151,936 x 896 head takes 10.6 ms against 24.5 ms for the float32 projection (both on
two threads), and certifies every step of its greedy chat replies
(``results/certified_head_qwen_threaded.json``); ``stats`` counts certified and refused steps.

It evaluates arrays (the hidden state is read on the host); it knows nothing about sampling,
caches or tokenizers.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import NamedTuple

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from nexus_mlx.kernels.int8_scan import aligned_rows, native_scan, padded_width, quantize_rows
from nexus_mlx.models.forward import head_weight, lm_head, softcap

MIN_HEAD_WEIGHTS = 1 << 26
"""Head weights (vocabulary x hidden) under which no head is built. ``bench/certified_head.py``
here: SmolLM2's 28M-weight head, a step 2.3x faster than its projection, decoded 0.92x as fast
as the pipelined full projection in ``generate_tokens`` and 1.01x in a session
(``results/certified_head.json``, one BLAS thread); Qwen2.5-0.5B's 136M, 1.08x and 1.16x
(``results/certified_head_qwen.json``), 1.07x and 1.15x on two threads
(``results/certified_head_qwen_threaded.json``)."""
DEFAULT_CANDIDATES = 256  # the scan's cost barely depends on it; the exact logits are k dots
MARGIN = 1e-3  # nats between a certified id and anything that could rank beside it
ROUNDING_SLACK = 1e-5  # relative slack on the highest bound for its float32 rounding
BOUND_SLACK = 1e-4  # relative slack on the error term: float32 rounding of codes and scales
SCAN_THREADS = max(1, min(os.cpu_count() or 1, 16))  # the scan runs while MLX waits for it
_HEAD_ATTR = "_nexus_certified_head"  # where a model keeps its head (as model_plan's memo)
_LOCK = threading.Lock()


class Top(NamedTuple):
    ids: np.ndarray  # (n,) int64, best first
    logits: np.ndarray  # (n,) float32, soft-capped as the model's head does


@dataclass
class HeadStats:
    certified: int = 0  # steps answered from the scan
    refused: int = 0  # steps the bound could not certify (the caller projected in full)


class CertifiedHead:
    """See the module docstring."""

    def __init__(self, model: nn.Module, weight: mx.array,
                 candidates: int = DEFAULT_CANDIDATES, margin: float = MARGIN) -> None:
        native = native_scan()
        if native is None:
            raise RuntimeError("the native INT8 scan is unavailable")
        self.model, self.source, self._native = model, weight, native
        self.weight = np.asarray(weight)  # (V, D) float32, a view of the model's own array
        vocab, self.dim = self.weight.shape
        self.candidates = min(int(candidates), vocab - 1)
        self.margin = float(margin)
        codes, self._scales = quantize_rows(self.weight)
        self._rows = aligned_rows(vocab, padded_width(self.dim))
        self._rows[:, : self.dim] = codes
        self._sums = self._rows.sum(axis=1, dtype=np.int32)
        abs_codes = np.abs(codes, dtype=np.int32).sum(axis=1)
        self._half_l1 = (0.5 * self._scales.astype(np.float64) * abs_codes).astype(np.float32)
        self.stats = HeadStats()

    @classmethod
    def of(cls, model: nn.Module) -> CertifiedHead | None:
        """The model's head (module docstring), built on first use."""
        weight = head_weight(model)
        if weight is None or weight.dtype != mx.float32 or weight.ndim != 2 \
                or weight.size < MIN_HEAD_WEIGHTS or mx.default_device() != mx.cpu \
                or native_scan() is None:
            return None
        with _LOCK:
            head = model.__dict__.get(_HEAD_ATTR)
            if head is None or head.source is not weight:
                mx.eval(weight)
                head = cls(model, weight)
                object.__setattr__(model, _HEAD_ATTR, head)
            return head

    def top(self, hidden: mx.array, n: int = 1, allowed: np.ndarray | None = None,
            margin: float | None = None) -> Top | None:
        """The ``n`` best ids after ``hidden`` and their logits, certified; None if not.
        ``allowed`` (a ``(V,)`` bool mask): the best among those ids (a constrained step);
        ``margin``: a wider one than the head's (what a caller needs the best to clear)."""
        margin = self.margin if margin is None else max(self.margin, float(margin))
        normed = self.model.model.norm(hidden.reshape(1, 1, self.dim))
        x = np.asarray(normed.astype(mx.float32)).reshape(self.dim)
        if not np.isfinite(x).all():  # nothing to certify; the full projection shows what is
            self.stats.refused += 1
            return None
        upper = self._upper_bounds(x)
        if allowed is not None:  # only allowed rows compete (and are candidates)
            upper = np.where(self._fitted(allowed), upper, np.float32(-np.inf))
        split = upper.size - self.candidates
        order = np.argpartition(upper, split - 1)
        ids, beyond = order[split:], float(upper[order[split - 1]])  # the rest are <= beyond
        ids = ids[upper[ids] > -np.inf]
        exact = self.weight[ids] @ x  # (k,) float32
        ranked = np.argsort(-exact, kind="stable")[: n + 1]
        best = exact[ranked]
        floor = beyond + ROUNDING_SLACK * abs(beyond) + margin if beyond > -np.inf else -np.inf
        certified = best.size >= n and float(best[n - 1]) > floor and bool(
            np.all(-np.diff(best) >= margin))
        if not certified:
            self.stats.refused += 1
            return None
        self.stats.certified += 1
        logits = np.asarray(softcap(self.model, mx.array(best[:n])), dtype=np.float32)
        return Top(ids[ranked[:n]].astype(np.int64), logits)

    def _fitted(self, allowed: np.ndarray) -> np.ndarray:
        """``allowed`` as ``(V,)`` bool over the head's rows: ids past a narrower mask (a
        tokenizer's vocabulary) are not allowed."""
        rows = self.weight.shape[0]
        if allowed.shape[0] >= rows:
            return allowed[:rows]
        fitted = np.zeros(rows, dtype=bool)
        fitted[: allowed.shape[0]] = allowed
        return fitted

    def _upper_bounds(self, x: np.ndarray) -> np.ndarray:
        """``(V,)`` float32: above each row's logit ``W[r] . x`` (module docstring)."""
        codes, qscale = self._native.quantize(x, self._rows.shape[1])
        dots = self._native.scores(self._rows, self._sums, codes, threads=SCAN_THREADS)
        q_half_l1 = 0.5 * float(np.abs(codes, dtype=np.int32).sum()) + 0.25 * self.dim
        scaled = self._scales * np.float32(qscale)
        bound = scaled * np.float32(q_half_l1) + np.float32(qscale) * self._half_l1
        return dots.astype(np.float32) * scaled + bound * np.float32(1 + BOUND_SLACK)


class HeadRow:
    """One position's next-token logits, computed only when asked: ``logits`` (``(V,)``, the
    full projection, evaluated on first use and kept) or ``best(allowed, margin)`` (the
    certified best id, or None: then read ``logits``). ``hidden`` is the position's last-layer
    state ``(1, 1, hidden)``, evaluated."""

    def __init__(self, head: CertifiedHead, hidden: mx.array) -> None:
        self.head, self.hidden = head, hidden
        self._logits: mx.array | None = None

    @property
    def logits(self) -> mx.array:
        if self._logits is None:
            self._logits = lm_head(self.head.model, self.hidden)[0, 0]
            mx.eval(self._logits)
        return self._logits

    def best(self, allowed: np.ndarray | None = None, margin: float | None = None) -> int | None:
        top = self.head.top(self.hidden, 1, allowed, margin)
        return None if top is None else int(top.ids[0])


def full_logits(row: HeadRow | mx.array) -> mx.array:
    """The ``(V,)`` logits of a row that may be a :class:`HeadRow`."""
    return row.logits if isinstance(row, HeadRow) else row
