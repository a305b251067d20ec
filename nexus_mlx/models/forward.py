"""The explicit-position forward pass over an mlx-lm model's own weights.

Contract: ``forward(model, tokens, cache, positions=None, rows=None)`` runs tokens through every
layer of a supported mlx-lm model (batch size 1), placing token ``t`` at RoPE position
``positions[t]`` and writing its K/V into cache row ``rows[t]`` *before* attention. Each query
attends to every live cache row whose position is <= its own (and, on sliding-window layers,
within the window), whatever the row order: rows may be non-contiguous in position, overwritten
in place, or packed from many intervals. With positions ``n..n+T-1`` appended at the cursor it
computes exactly what mlx-lm's own forward computes.

``forward_hidden`` stops after any number of layers (shallow passes for repair allocators)
and an optional ``probe(layer, probs)`` observes every layer's attention probabilities (which
forces the explicit attention path). The module's projections, norms and MLPs are called as
they are (quantized or not); only positions, masking and the cache are ours. Arguments are validated before the cache is touched.
It does not sample, tokenize or know about splicing or repair.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from nexus_mlx.errors import PositionError, TokenError
from nexus_mlx.kernels.cpu_exp import kernel_applies, silu, softmax
from nexus_mlx.kv.cache import NexusCache, WritePlan
from nexus_mlx.kv.rope import apply_rope
from nexus_mlx.models.arch import LayerPlan, ModelPlan, model_plan

SWIGLU_ARCHITECTURES = ("llama", "qwen2", "qwen3")  # down(silu(gate(x)) * up(x))
TokenInput = Sequence[int] | np.ndarray | mx.array
AttentionProbe = Callable[[int, mx.array], None]  # (layer index, probs (1, H, T, N))


def make_cache(
    model: nn.Module, *, max_tokens: int | None = None, v_layout: str | None = None
) -> NexusCache:
    """An empty :class:`NexusCache` shaped for ``model`` (V layout chosen per model)."""
    plan = model_plan(model)
    return NexusCache(
        plan.rope_specs,
        plan.n_kv_heads,
        plan.head_dim,
        dtype=compute_dtype(model),
        v_layout=v_layout or plan.v_layout,
        max_tokens=max_tokens if max_tokens is not None else plan.max_position,
    )


def compute_dtype(model: nn.Module) -> mx.Dtype:
    """The float dtype activations run in (the embedding's, or its scales' if quantized)."""
    embed = model.model.embed_tokens
    return embed.scales.dtype if "scales" in embed else embed.weight.dtype


def token_ids(tokens: TokenInput, vocab_size: int) -> np.ndarray:
    """Validated token ids as ``(T,)`` int64 (shape ``(T,)`` or ``(1, T)``, T >= 1)."""
    arr = np.asarray(tokens)
    if arr.ndim == 2 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 1 or arr.shape[0] == 0:
        raise TokenError(f"tokens must have shape (T,) or (1, T) with T >= 1, got {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise TokenError(f"token ids must be integers, got dtype {arr.dtype}")
    if arr.min() < 0 or arr.max() >= vocab_size:
        bad = arr[(arr < 0) | (arr >= vocab_size)][0]
        raise TokenError(f"token id {int(bad)} is outside the vocabulary [0, {vocab_size})")
    return arr.astype(np.int64)


def attention_mask(
    query_pos: np.ndarray, key_pos: np.ndarray, window: int | None
) -> mx.array | None:
    """Boolean ``(T, N)`` mask: key visible iff ``0 <= q - k`` (and ``q - k < window``).

    Returns None when every key is visible, which lets attention take its unmasked path.
    """
    diff = query_pos[:, None] - key_pos[None, :]  # (T, N)
    visible = diff >= 0
    if window is not None:
        visible &= diff < window
    if visible.all():
        return None
    return mx.array(visible)


@dataclass(frozen=True)
class StepContext:
    """What every layer of one forward call shares."""

    positions: np.ndarray  # (T,) positions of the tokens being run
    cache: NexusCache
    write: WritePlan
    masks: dict[int | None, mx.array | None]  # per sliding-window size
    probe: AttentionProbe | None = None


def _attend(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    mask: mx.array | None,
    layer: LayerPlan,
    v_layout: str,
    want_probs: bool = False,
) -> tuple[mx.array, mx.array | None]:
    """Attention of ``q (1, H, T, D)`` over ``k (1, Hkv, N, D)`` and ``v`` in its layout; also
    the probabilities ``(1, H, T, N)`` when asked (which forces the explicit path).

    The fused ``mx.fast.scaled_dot_product_attention`` runs on the GPU; on the CPU the explicit
    path is used with the vectorized softmax of :mod:`~nexus_mlx.kernels.cpu_exp` (MLX's CPU
    exp is scalar and dominated long-context attention there, fused path included)."""
    fused_ok = layer.softcap is None and v_layout == "row" and not want_probs
    if fused_ok and not kernel_applies(q.dtype):
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=layer.scale, mask=mask), None
    _, n_heads, t, d = q.shape
    n_kv, n = k.shape[1], k.shape[2]
    rep = n_heads // n_kv
    q = (q * layer.scale).reshape(1, n_kv, rep * t, d)  # (1, Hkv, rep*T, D): query groups share K
    scores = q @ k.swapaxes(-1, -2)  # (1, Hkv, rep*T, N)
    if layer.softcap is not None:
        scores = mx.tanh(scores / layer.softcap) * layer.softcap
    if mask is not None:
        grouped = scores.reshape(1, n_kv, rep, t, n)
        hidden = mx.array(-mx.inf, scores.dtype)
        scores = mx.where(mask, grouped, hidden).reshape(1, n_kv, rep * t, n)
    probs = softmax(scores)
    v_rows = v.swapaxes(-1, -2) if v_layout == "transposed" else v  # (1, Hkv, N, D)
    out = probs @ v_rows  # (1, Hkv, rep*T, D)
    return out.reshape(1, n_heads, t, d), probs.reshape(1, n_heads, t, n) if want_probs else None


def attention_block(model: nn.Module, layer_index: int, x: mx.array, step: StepContext) -> mx.array:
    """Self-attention of one layer on normed input ``x (1, T, hidden)``; writes K/V first."""
    plan = model_plan(model)
    layer = plan.layers[layer_index]
    attn = model.layers[layer_index].self_attn
    _, t, _ = x.shape
    q = attn.q_proj(x).reshape(1, t, plan.n_heads, -1)
    k = attn.k_proj(x).reshape(1, t, plan.n_kv_heads, -1)
    v = attn.v_proj(x).reshape(1, t, plan.n_kv_heads, -1)
    if layer.qk_norm:
        q, k = attn.q_norm(q), attn.k_norm(k)
    q = apply_rope(q.transpose(0, 2, 1, 3), step.positions, layer.rope)  # (1, H, T, D)
    k = apply_rope(k.transpose(0, 2, 1, 3), step.positions, layer.rope)  # (1, Hkv, T, D)
    cache = step.cache
    cache.write_layer(layer_index, step.write, k, v.transpose(0, 2, 1, 3))
    out, probs = _attend(
        q, cache.keys(layer_index), cache.stored_values(layer_index),
        step.masks[layer.window], layer, cache.v_layout, want_probs=step.probe is not None,
    )
    if step.probe is not None and probs is not None:
        step.probe(layer_index, probs)
    return attn.o_proj(out.transpose(0, 2, 1, 3).reshape(1, t, -1))


def _residual(h: mx.array, r: mx.array) -> mx.array:
    if h.dtype == mx.float16:  # gemma3 clips fp16 residuals to stay finite
        bound = mx.finfo(mx.float16).max
        return mx.clip(h.astype(mx.float32) + r.astype(mx.float32), -bound, bound).astype(mx.float16)
    return h + r


def layer_forward(model: nn.Module, layer_index: int, h: mx.array, step: StepContext) -> mx.array:
    """One transformer block on hidden states ``h (1, T, hidden)``."""
    plan = model_plan(model)
    block = model.layers[layer_index]
    r = attention_block(model, layer_index, block.input_layernorm(h), step)
    if plan.sandwich_norms:
        h = _residual(h, block.post_attention_layernorm(r))
        r = block.mlp(block.pre_feedforward_layernorm(h))
        return _residual(h, block.post_feedforward_layernorm(r))
    h = h + r
    return h + mlp(block.mlp, block.post_attention_layernorm(h), plan)


def mlp(module: nn.Module, x: mx.array, plan: ModelPlan) -> mx.array:
    """The block's MLP on ``x (1, T, hidden)``: llama/qwen SwiGLU with the vectorized SiLU of
    :mod:`~nexus_mlx.kernels.cpu_exp` where it applies (float32 on the CPU), else the module."""
    if plan.architecture in SWIGLU_ARCHITECTURES and kernel_applies(x.dtype):
        return module.down_proj(silu(module.gate_proj(x)) * module.up_proj(x))
    return module(x)


def embed(model: nn.Module, tokens: mx.array) -> mx.array:
    """Input embeddings ``(1, T, hidden)``, scaled as the architecture requires."""
    plan = model_plan(model)
    h = model.model.embed_tokens(tokens[None])
    if plan.embed_scale is not None:
        h = h * plan.embed_scale
    return h


def lm_head(model: nn.Module, h: mx.array) -> mx.array:
    """Final norm, output projection and logit soft-cap: ``(1, T, hidden) -> (1, T, vocab)``."""
    plan = model_plan(model)
    h = model.model.norm(h)
    logits = model.model.embed_tokens.as_linear(h) if plan.tied_embeddings else model.lm_head(h)
    if plan.final_softcap is not None:
        logits = mx.tanh(logits / plan.final_softcap) * plan.final_softcap
    return logits


def _check_positions(plan: ModelPlan, positions: np.ndarray, n_tokens: int) -> None:
    if positions.shape != (n_tokens,):
        raise PositionError(f"{positions.shape[0]} positions for {n_tokens} tokens")
    if n_tokens and plan.max_position is not None and positions.max() >= plan.max_position:
        raise PositionError(
            f"position {int(positions.max())} is beyond the model's "
            f"max_position_embeddings={plan.max_position}"
        )


def layer_masks(
    plan: ModelPlan, query_pos: np.ndarray, key_pos: np.ndarray
) -> dict[int | None, mx.array | None]:
    """One mask per distinct window size among the layers."""
    return {w: attention_mask(query_pos, key_pos, w) for w in {lp.window for lp in plan.layers}}


def forward_hidden(
    model: nn.Module,
    tokens: TokenInput,
    cache: NexusCache,
    positions: Sequence[int] | np.ndarray | None = None,
    rows: Sequence[int] | np.ndarray | None = None,
    *,
    num_layers: int | None = None,
    probe: AttentionProbe | None = None,
) -> mx.array:
    """Like :func:`forward` but returns the hidden states ``(1, T, hidden)`` after the first
    ``num_layers`` layers (default all; before the final norm). ``probe(layer, probs)`` receives
    every layer's attention probabilities ``(1, H, T, N)`` over the live rows.

    With ``num_layers`` below the model's depth only those layers' K/V are written although the
    rows' positions and tokens are committed: run partial passes on a scratch ``fork()``."""
    plan = model_plan(model)
    depth = plan.num_layers if num_layers is None else num_layers
    if not 0 <= depth <= plan.num_layers:
        raise PositionError(f"num_layers {num_layers} is outside [0, {plan.num_layers}]")
    toks = mx.array(token_ids(tokens, plan.vocab_size).astype(np.int32))
    t = toks.shape[0]
    if positions is None:
        pos = np.arange(cache.next_position, cache.next_position + t, dtype=np.int64)
    else:
        pos = np.asarray(positions).reshape(-1)
    _check_positions(plan, pos, t)
    write = cache.plan_write(rows, pos)
    cache.commit_positions(write, np.array(toks))
    step = StepContext(write.positions, cache, write,
                       layer_masks(plan, write.positions, cache.positions), probe)
    h = embed(model, toks)
    for i in range(depth):
        h = layer_forward(model, i, h, step)
    return h


def forward(
    model: nn.Module,
    tokens: TokenInput,
    cache: NexusCache,
    positions: Sequence[int] | np.ndarray | None = None,
    rows: Sequence[int] | np.ndarray | None = None,
    *,
    logits: Literal["all", "last"] = "all",
    probe: AttentionProbe | None = None,
) -> mx.array:
    """Run ``tokens`` at ``positions`` (default: after the cache's last position), writing their
    K/V into ``rows`` (default: appended at ``cache.n_past``). Returns logits ``(1, T, vocab)``
    (or ``(1, 1, vocab)`` with ``logits="last"``). Lazy: the caller evaluates."""
    h = forward_hidden(model, tokens, cache, positions, rows, probe=probe)
    if logits == "last":
        h = h[:, -1:, :]
    return lm_head(model, h)
