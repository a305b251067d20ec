"""Attention of the forward pass over cache rows, masked by absolute position.

Contract: ``attend(q, k, v, keys, layer, v_layout)`` computes, for queries ``q (1, H, T, D)``
(rotated, not yet scaled) over keys ``k (1, Hkv, N, D)`` and values ``v`` (``(1, Hkv, N, D)``, or
``(1, Hkv, D, N)`` for the transposed layout), softmax attention where query ``t`` sees key ``j``
iff ``0 <= keys.query_pos[t] - keys.key_pos[j]`` (and ``< layer.window`` on sliding-window
layers), with the layer's scale and logit soft-cap. ``H`` is a multiple of ``Hkv``: the queries
of a group share their K/V head, never repeated in memory (queries are regrouped to ``(1, Hkv,
G * T, D)`` instead). It returns ``(out (1, H, T, D), probs (1, H, T, N) or None)``; the
probabilities only when asked (``want_probs``). Four paths, equal within float32 rounding:

- ``fused``: ``mx.fast.scaled_dot_product_attention`` with native GQA, used where MLX has a fast
  exp (the GPU, or dtypes the CPU kernels do not cover), without a soft-cap, for row-layout V,
  when no probabilities are asked. Its mask is ``"causal"`` when the queries are the last ``T`` of
  rows whose positions are ``0 .. N-1`` in row order (a plain append; no window shorter than
  ``N``), none when every key is visible, else one boolean mask built once per call and window.
- ``blocked`` (float32 on an AVX-512 CPU, at least two queries, no soft-cap, row-layout V, no
  probabilities asked): the native kernel of
  :mod:`~nexus_mlx.kernels.position_attention`, which walks 64-key blocks with an online softmax
  and the position rule built in: no score matrix and no mask tensor exist, and blocks no query
  can see are skipped. It evaluates its inputs (a sync point per layer).
- ``positional`` (float32 on the CPU, at least two queries, where ``blocked`` does not apply):
  two grouped GEMMs around the native in-place softmax of
  :mod:`~nexus_mlx.kernels.position_softmax`, which applies the position rule itself: no mask
  tensor exists. It evaluates the scores (a sync point per layer).
- ``explicit`` (the reference, and decode steps on the CPU, which stay lazy): grouped GEMMs, the
  boolean mask via ``mx.where``, and :func:`~nexus_mlx.kernels.cpu_exp.softmax`.

``use_kernel=False`` forces the explicit path with the reference softmax (``mx.softmax``): the
oracle the tests hold the other paths to. :class:`KeyView` holds the positions of one forward call
and builds each mask at most once. This module knows nothing about weights, RoPE or the cache.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import mlx.core as mx
import numpy as np

from nexus_mlx.kernels import cpu_exp, position_attention, position_softmax
from nexus_mlx.models.arch import LayerPlan

AttentionPath = Literal["fused", "blocked", "positional", "explicit"]
MIN_POSITIONAL_QUERIES = 2  # single-token decode steps stay lazy (pipelined by the caller)


class KeyView:
    """The positions of one forward call: ``query_pos (T,)`` of the tokens being run and
    ``key_pos (N,)`` of the cache rows ``[0, N)`` they attend to. Masks are built on first use
    and kept, one per window size."""

    def __init__(self, query_pos: np.ndarray, key_pos: np.ndarray) -> None:
        self.query_pos = np.asarray(query_pos, np.int64).reshape(-1)  # (T,)
        self.key_pos = np.asarray(key_pos, np.int64).reshape(-1)  # (N,)
        self._masks: dict[int | None, mx.array | None] = {}
        n, t = self.key_pos.size, self.query_pos.size
        self.appended = bool(  # queries are the last T rows of positions 0..N-1 in row order
            t <= n
            and np.array_equal(self.key_pos, np.arange(n))
            and np.array_equal(self.query_pos, np.arange(n - t, n))
        )

    @property
    def n_keys(self) -> int:
        return int(self.key_pos.size)

    def mask(self, window: int | None) -> mx.array | None:
        """Boolean ``(T, N)`` visibility, or None when every key is visible."""
        if window not in self._masks:
            seen = position_softmax.visibility(self.query_pos, self.key_pos, window)
            self._masks[window] = None if seen.all() else mx.array(seen)
        return self._masks[window]

    def fused_mask(self, window: int | None) -> mx.array | str | None:
        """The mask argument of ``mx.fast.scaled_dot_product_attention`` for ``window``."""
        if self.appended and (window is None or window >= self.n_keys):
            return None if self.query_pos.size == 1 else "causal"
        return self.mask(window)


def attention_path(
    q: mx.array, layer: LayerPlan, v_layout: str, want_probs: bool, use_kernel: bool
) -> AttentionPath:
    """Which path :func:`attend` takes for these inputs (see the module docstring)."""
    if not use_kernel:
        return "explicit"
    cpu_f32 = cpu_exp.kernel_applies(q.dtype)
    if not cpu_f32 and layer.softcap is None and v_layout == "row" and not want_probs:
        return "fused"
    if q.shape[2] < MIN_POSITIONAL_QUERIES:
        return "explicit"
    plain = layer.softcap is None and v_layout == "row" and not want_probs
    if plain and position_attention.kernel_applies(q.dtype, int(q.shape[-1])):
        return "blocked"
    if position_softmax.kernel_applies(q.dtype):
        return "positional"
    return "explicit"


def attend(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    keys: KeyView,
    layer: LayerPlan,
    v_layout: str,
    want_probs: bool = False,
    use_kernel: bool = True,
    mark: Callable[[str, mx.array], None] | None = None,
) -> tuple[mx.array, mx.array | None]:
    """Attention of ``q (1, H, T, D)`` over ``k``/``v`` by position; see the module docstring.
    ``mark(stage, array)``, when given, is called where ``scores``, ``softmax`` and ``pv`` end
    (``attention`` on the blocked path; a profiling boundary)."""
    mark = mark or _no_mark
    path = attention_path(q, layer, v_layout, want_probs, use_kernel)
    if path == "fused":
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=layer.scale,
                                                   mask=keys.fused_mask(layer.window))
        mark("pv", out)
        return out, None
    _, n_heads, t, d = q.shape
    n_kv, n = k.shape[1], k.shape[2]
    group = n_heads // n_kv
    if path == "blocked":
        out = position_attention.position_attention_kernel(
            q.reshape(1, n_kv, group * t, d), k, v, keys.query_pos, keys.key_pos, layer.scale,
            layer.window).reshape(1, n_heads, t, d)  # (1, H, T, D)
        mark("attention", out)
        return out, None
    grouped = (q * layer.scale).reshape(1, n_kv, group * t, d)  # (1, Hkv, G*T, D)
    scores = grouped @ k.swapaxes(-1, -2)  # (1, Hkv, G*T, N)
    if layer.softcap is not None:
        scores = mx.tanh(scores / layer.softcap) * layer.softcap
    mark("scores", scores)
    if path == "positional":
        probs = position_softmax.position_softmax_kernel(scores, keys.query_pos, keys.key_pos,
                                                         layer.window)
    else:
        mask = keys.mask(layer.window)
        if mask is not None:
            hidden = mx.array(-mx.inf, scores.dtype)
            scores = mx.where(mask, scores.reshape(1, n_kv, group, t, n), hidden)
            scores = scores.reshape(1, n_kv, group * t, n)
        probs = cpu_exp.softmax(scores, use_kernel=use_kernel)
    mark("softmax", probs)
    v_rows = v.swapaxes(-1, -2) if v_layout == "transposed" else v  # (1, Hkv, N, D)
    out = (probs @ v_rows).reshape(1, n_heads, t, d)  # (1, H, T, D)
    mark("pv", out)
    return out, probs.reshape(1, n_heads, t, n) if want_probs else None


def _no_mark(stage: str, a: mx.array) -> None:
    """The default of :func:`attend`'s ``mark``: no profiling boundary."""
