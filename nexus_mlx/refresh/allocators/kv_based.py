"""Allocators that compare cached states: CacheBlend-, CacheTune- and SpecCache-adapted.

Contract: each registered allocator returns exactly ``request.budget`` sorted, distinct suffix
indices; ``<name>_scores(request)`` gives the per-token score ``(S,)`` float32 it ranks by
(ties: the earlier index wins). Scratch passes run on ``fork()``s; neither cache in the request
is modified. Suffix index ``i`` is row ``p0 + i`` of the Shift cache and ``p1 + i`` of the dirty one.

- ``cacheblend`` (CacheBlend-adapted, Yao et al., EuroSys 2025): a fresh two-layer prefill of
  the edited sequence ``p + s`` on a scratch cache, then per suffix token
  ``||dK||^2 + ||dV||^2`` between its fresh and its Shift-cache K/V at layer 1 (the second
  layer; layer 0 if the model has one). The prefix rows of the Shift cache never saw ``e`` and
  are exact, so the scratch prefill forks them and runs only the suffix. Departs from
  CacheBlend: one fixed check layer and one top-B cut instead of its gradual filtering (which
  recomputes the selected tokens layer by layer and re-ranks at every layer with a shrinking
  ratio); the reused KV come from a deletion, not from independently prefilled chunks.
- ``cachetune`` (CacheTune-adapted, Li et al., 2026): the Shift cache's suffix keys are
  un-rotated row by row to their pre-RoPE form (RoPE adds a position-dependent oscillation, up
  to one radian per token, that would otherwise dominate the sequence spectrum). Along the
  sequence axis each layer's K and V (heads x dims as features) are low-passed with numpy's
  rFFT, keeping the lowest ``floor(0.5 * (floor(S/2) + 1))`` bins. A token's score is the norm,
  over layers, K and V, of its *reconstruction error* ``x - lowpass(x)``: the part of its state
  its neighbours' smooth trend does not predict, i.e. the token-specific content whose
  cross-attention a stale cache cannot recover from context. (The norm of the reconstructed
  signal would instead rank by the local average magnitude of a neighbourhood, and so favour
  runs of loud tokens over distinctive ones.) The rFFT treats the suffix as periodic, so the
  first and last suffix tokens also score for the jump between the two ends; the first ones
  sit at the seam, where a deletion does most harm anyway. Departs from CacheTune: the frequency analysis
  runs online on the stale suffix at repair time instead of offline per cached chunk, with one
  fixed cut-off, and none of its I/O-aware machinery (sparse transfer, adaptive ratio tuning).
- ``speccache`` (SpecCache-adapted, ACL 2026): SpecCache ranks tokens by the deep-layer
  hidden-state norms of a small speculative model of the target's family. No smaller model of
  the same family ships here, so the proxy is the *same* model truncated to its first
  ``ceil(L/3)`` layers. It runs the suffix twice on scratch forks: after the Shift cache's
  exact prefix (the edited context) and after the dirty cache's rows ``[0, p1)`` (the context
  whose hidden states the Shift cache's stale suffix rows were computed from: the Shift-cache
  proxy; K/V alone do not give hidden states back). Token deviation =
  ``| ||h_edited|| - ||h_stale|| |``. The suffix is cut into fixed 16-token spans counted from
  the seam (option ``span``); spans are ranked by mean token deviation (earlier first on ties)
  and admitted whole in that order while they fit; the first span that does not fit gives its
  highest-deviation tokens to fill exactly ``B``.

It does not know text structure, tokenizers or which executor will recompute the rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from nexus_mlx.errors import ArgumentError
from nexus_mlx.kv.cache import NexusCache
from nexus_mlx.kv.rope import rope_tables, rotate
from nexus_mlx.models.forward import forward_hidden
from nexus_mlx.refresh.allocators import AllocationRequest, register, top_k_positions

CHECK_LAYER = 1  # CacheBlend / A3: the second layer
SPECCACHE_SPAN = 16
Scorer = Callable[[AllocationRequest], np.ndarray]


def trivial_selection(request: AllocationRequest) -> np.ndarray | None:
    """The answer when no scoring is needed (``B == 0`` or ``B == S``), else None."""
    if request.budget == 0:
        return np.zeros(0, dtype=np.int64)
    if request.budget == request.suffix_length:
        return np.arange(request.suffix_length, dtype=np.int64)
    return None


def ranked(name: str, scores: Scorer) -> None:
    """Register ``name`` as the top-B of ``scores`` (earlier index wins ties)."""

    def allocate(request: AllocationRequest) -> np.ndarray:
        fixed = trivial_selection(request)
        return fixed if fixed is not None else top_k_positions(scores(request), request.budget)

    allocate.__name__ = name
    allocate.__doc__ = f"Top-B suffix positions by ``{scores.__name__}``."
    register(name)(allocate)


def positive_option(request: AllocationRequest, key: str, default: int) -> int:
    """``request.options[key]`` as a positive int, or :class:`ArgumentError`."""
    value = request.options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0:
        raise ArgumentError(f"option {key}={value!r} must be a positive integer")
    return int(value)


def shallow_pass(
    model: nn.Module,
    context: NexusCache,
    keep: int,
    tokens: np.ndarray,
    positions: np.ndarray,
    depth: int,
) -> tuple[NexusCache, mx.array]:
    """Fork rows ``[0, keep)`` of ``context``, run ``tokens`` at ``positions`` through the first
    ``depth`` layers (appended after the kept rows) and return the scratch cache and the hidden
    states ``(T, hidden)`` float32. Only the first ``depth`` layers' new rows hold K/V."""
    if (np.asarray(tokens) < 0).any():
        raise ArgumentError("the suffix has rows without token ids; cannot re-run it")
    scratch = context.fork(0, keep)
    h = forward_hidden(model, tokens, scratch, positions=positions, num_layers=depth)
    return scratch, h[0].astype(mx.float32)  # (T, hidden)


def edited_prefill(request: AllocationRequest, depth: int) -> tuple[NexusCache, mx.array]:
    """A scratch cache holding ``p + s`` with the suffix freshly computed through ``depth``
    layers (the Shift cache's prefix rows are exact), and the suffix hidden states."""
    p0 = request.edit.p0
    return shallow_pass(
        request.model, request.shifted, p0, request.suffix_tokens,
        request.shifted.positions[p0:], depth,
    )


def check_layer(cache: NexusCache) -> int:
    """Layer 1 (the second), or 0 for a one-layer model."""
    return min(CHECK_LAYER, cache.num_layers - 1)


# ---- cacheblend ------------------------------------------------------------------------
def cacheblend_scores(request: AllocationRequest) -> np.ndarray:
    """``||dK||^2 + ||dV||^2`` at the check layer between fresh and Shift-cache suffix rows."""
    layer = check_layer(request.shifted)
    fresh, _ = edited_prefill(request, layer + 1)
    p0 = request.edit.p0
    total = mx.zeros((request.suffix_length,), dtype=mx.float32)
    for a, b in ((fresh.keys(layer), request.shifted.keys(layer)),
                 (fresh.values(layer), request.shifted.values(layer))):
        diff = a[0, :, p0:, :].astype(mx.float32) - b[0, :, p0:, :].astype(mx.float32)  # (H, S, D)
        total = total + (diff * diff).sum(axis=(0, 2))
    return np.array(total)


ranked("cacheblend", cacheblend_scores)


# ---- cachetune -------------------------------------------------------------------------
def unrotated_keys(cache: NexusCache, layer: int, start: int) -> mx.array:
    """Keys of rows ``[start, n_past)`` with their RoPE rotation undone, ``(H, S, D)`` float32."""
    spec = cache.rope_specs[layer]
    keys = cache.keys(layer)[0, :, start:, :].astype(mx.float32)  # (H, S, D)
    cos, sin = rope_tables(cache.positions[start:], spec, mx.float32)  # (S, dims/2)
    keys = rotate(keys, cos, -sin, spec)
    if spec.input_scale != 1.0:
        rot, rest = keys[..., : spec.dims] / spec.input_scale, keys[..., spec.dims :]
        keys = mx.concatenate([rot, rest], axis=-1)
    return keys


def lowpass_bins(length: int) -> int:
    """How many of the ``floor(S/2) + 1`` rFFT bins the low-pass keeps."""
    return int(0.5 * (length // 2 + 1))


def lowpass_error(signal: np.ndarray) -> np.ndarray:
    """Squared reconstruction error per row of ``signal (S, F)`` after keeping only the lowest
    :func:`lowpass_bins` frequencies along axis 0, ``(S,)`` float32."""
    x = np.asarray(signal, dtype=np.float32)
    length = x.shape[0]
    spectrum = np.fft.rfft(x, axis=0)  # (S//2 + 1, F)
    spectrum[lowpass_bins(length):] = 0
    recon = np.fft.irfft(spectrum, n=length, axis=0).astype(np.float32)  # (S, F)
    err = x - recon
    return (err * err).sum(axis=1, dtype=np.float32)


def cachetune_scores(request: AllocationRequest) -> np.ndarray:
    """Norm over layers, K and V of each suffix token's low-pass reconstruction error."""
    cache, p0, s = request.shifted, request.edit.p0, request.suffix_length
    total = np.zeros(s, dtype=np.float32)
    for layer in range(cache.num_layers):
        keys = unrotated_keys(cache, layer, p0)  # (H, S, D)
        values = cache.values(layer)[0, :, p0:, :].astype(mx.float32)  # (H, S, D)
        for state in (keys, values):
            flat = np.array(state.transpose(1, 0, 2).reshape(s, -1))  # (S, H*D)
            total += lowpass_error(flat)
    return np.sqrt(total)


ranked("cachetune", cachetune_scores)


# ---- speccache -------------------------------------------------------------------------
def proxy_depth(cache: NexusCache) -> int:
    """Layers of the stand-in speculative model: the first ``ceil(L/3)``."""
    return math.ceil(cache.num_layers / 3)


def speccache_scores(request: AllocationRequest) -> np.ndarray:
    """``| ||h_edited|| - ||h_stale|| |`` per suffix token after the proxy's layers."""
    depth = proxy_depth(request.shifted)
    _, edited = edited_prefill(request, depth)  # (S, hidden)
    p1 = request.edit.p1
    dirty = request.dirty
    _, stale = shallow_pass(request.model, dirty, p1, dirty.tokens[p1:], dirty.positions[p1:], depth)
    norms = mx.linalg.norm(edited, axis=-1) - mx.linalg.norm(stale, axis=-1)  # (S,)
    return np.array(mx.abs(norms))


def span_fill(scores: np.ndarray, span: int, budget: int) -> np.ndarray:
    """Admit fixed ``span``-token spans by mean score (earlier first on ties) while they fit;
    the first one that does not fit gives its top tokens, so exactly ``budget`` are chosen."""
    starts = np.arange(0, scores.size, span)
    means = np.array([scores[a : a + span].mean() for a in starts], dtype=np.float64)
    chosen: list[np.ndarray] = []
    left = budget
    for idx in np.lexsort((starts, -means)):
        if left == 0:
            break
        members = np.arange(starts[idx], min(starts[idx] + span, scores.size))
        if members.size > left:
            members = members[top_k_positions(scores[members], left)]
        chosen.append(members)
        left -= members.size
    return np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, dtype=np.int64)


@register("speccache")
def speccache(request: AllocationRequest) -> np.ndarray:
    span = positive_option(request, "span", SPECCACHE_SPAN)
    fixed = trivial_selection(request)
    return fixed if fixed is not None else span_fill(speccache_scores(request), span, request.budget)
