"""The explicit-position forward pass over an mlx-lm model's own weights.

Contract: ``forward(model, tokens, cache, positions=None, rows=None)`` runs tokens through every
layer of a supported mlx-lm model (batch size 1), placing token ``t`` at RoPE position
``positions[t]`` and writing its K/V into cache row ``rows[t]`` *before* attention. Each query
attends to every live cache row whose position is <= its own (and, on sliding-window layers,
within the window), whatever the row order: rows may be non-contiguous in position, overwritten
in place, or packed from many intervals. With positions ``n..n+T-1`` appended at the cursor it
computes exactly what mlx-lm's own forward computes.

How one call runs: every position and token id is validated and committed first; then the tokens
go through the layers in runs of at most ``chunk`` (default :data:`PREFILL_CHUNK`) in position
order (as mlx-lm's ``prefill_step_size`` bounds attention memory; the result is the same as one
run, since no run can see a later run's rows, whose positions are all larger), the cache being
evaluated between runs. A run attends only to the rows up to the last one any of its queries can
see; RoPE tables are built once per run, masks at most once per run and window, or not at all
(see :mod:`~nexus_mlx.models.attention` for the attention paths; on the CPU in float32 the
native attention kernels evaluate each layer's queries and keys, and the native SwiGLU its
gate and up products past a few thousand elements; elsewhere the call stays lazy).
``decode_step`` appends one token given as a lazy array (a pipelined decode loop);
``forward_last_hidden`` returns the last token's hidden state for a caller that applies the head
itself (``head_weight``, ``softcap``; :mod:`nexus_mlx.decode.certified_head`).

``forward_hidden`` stops after any number of layers (shallow passes for repair allocators)
and an optional ``probe(layer, probs)`` observes every layer's attention probabilities (which
forces the explicit attention path and one run). ``profile=StageProfile()`` times every stage
of every layer (:mod:`~nexus_mlx.models.stages`). The module's norms and projections are
called as they are (quantized or not), except that float q/k/v and SwiGLU gate/up projections
run as one matmul each over their own weights, rebound as views of one array
(:mod:`~nexus_mlx.models.fused`); only positions, masking and the cache are ours. Arguments
are validated before the cache is touched. It does not sample, tokenize or know about splicing
or repair.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from nexus_mlx.errors import ArgumentError, PositionError, TokenError
from nexus_mlx.kernels.cpu_exp import kernel_applies
from nexus_mlx.kernels.swiglu import swiglu
from nexus_mlx.kv.cache import NexusCache, WritePlan
from nexus_mlx.kv.rope import RopeSpec, rope_tables, rotate
from nexus_mlx.models.arch import SWIGLU_ARCHITECTURES, ModelPlan, model_plan
from nexus_mlx.models.attention import KeyView, attend
from nexus_mlx.models.fused import FusedLayer, fused_layer
from nexus_mlx.models.stages import StageProfile

TokenInput = Sequence[int] | np.ndarray | mx.array
AttentionProbe = Callable[[int, mx.array], None]  # (layer index, probs (1, H, T, N))
PREFILL_CHUNK = 512  # tokens per chunk of a long call (mlx-lm's prefill_step_size is 2048)
TABLE_MIN, TABLE_MAX = 4096, 1 << 17  # kept RoPE tables: positions covered (doubling)


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
    return KeyView(query_pos, key_pos).mask(window)


@dataclass(frozen=True)
class StepContext:
    """What every layer of one chunk of a forward call shares."""

    positions: np.ndarray  # (T,) positions of the tokens being run
    cache: NexusCache
    write: WritePlan
    keys: KeyView  # positions of the attended rows [0, keys.n_keys); masks built once
    rope: dict[RopeSpec, tuple[mx.array, mx.array]]  # cos/sin tables (T, dims/2) per spec
    probe: AttentionProbe | None = None
    use_kernel: bool = True
    profile: StageProfile | None = None

    def mark(self, stage: str, layer: int | None, *arrays: mx.array) -> None:
        """A profiling boundary (a no-op without a profile)."""
        if self.profile is not None:
            self.profile.mark(stage, layer, *arrays)


@functools.lru_cache(maxsize=16)
def _position_tables(spec: RopeSpec, dtype: mx.Dtype, size: int) -> tuple[mx.array, mx.array]:
    """cos/sin tables of positions ``[0, size)``, kept (built on first use)."""
    return rope_tables(np.arange(size), spec, dtype)


def _tables(positions: np.ndarray, spec: RopeSpec, dtype: mx.Dtype) -> tuple[mx.array, mx.array]:
    """cos/sin ``(T, dims/2)`` for ``positions``: a slice of kept tables when they are one
    increasing run (decode steps and appends rebuild no array), else computed for them; the
    values are the same either way (float64 angles, one cast)."""
    p0, t = int(positions[0]), positions.size
    run = positions[-1] - p0 == t - 1 and (t == 1 or bool(np.all(np.diff(positions) == 1)))
    if run and p0 + t <= TABLE_MAX:
        size = max(TABLE_MIN, 1 << int(p0 + t - 1).bit_length())  # a power of two past the run
        cos, sin = _position_tables(spec, dtype, size)
        return cos[p0:p0 + t], sin[p0:p0 + t]
    return rope_tables(positions, spec, dtype)


def _rotate(q: mx.array, k: mx.array, spec: RopeSpec, step: StepContext) -> tuple[mx.array, mx.array]:
    """:func:`~nexus_mlx.kv.rope.apply_rope` of ``q (1, H, T, D)`` and ``k (1, Hkv, T, D)`` in
    one rotation of their stacked heads, with the chunk's tables (built once per spec)."""
    if spec not in step.rope:
        step.rope[spec] = _tables(step.positions, spec, q.dtype)
    x = mx.concatenate([q, k], axis=1)  # (1, H + Hkv, T, D)
    if spec.input_scale != 1.0:
        x = mx.concatenate([x[..., : spec.dims] * spec.input_scale, x[..., spec.dims :]], axis=-1)
    cos, sin = step.rope[spec]
    x = rotate(x, cos, sin, spec)
    heads = q.shape[1]
    return x[:, :heads], x[:, heads:]


def attention_block(model: nn.Module, layer_index: int, x: mx.array, step: StepContext,
                    fused: FusedLayer | None = None) -> mx.array:
    """Self-attention of one layer on normed input ``x (1, T, hidden)``; writes K/V first
    (q/k/v from one matmul where ``fused`` has them)."""
    plan = model_plan(model)
    layer = plan.layers[layer_index]
    attn = model.layers[layer_index].self_attn
    _, t, _ = x.shape
    qkv = fused.qkv() if fused is not None else None
    q, k, v = qkv(x) if qkv is not None else (attn.q_proj(x), attn.k_proj(x), attn.v_proj(x))
    q = q.reshape(1, t, plan.n_heads, -1)
    k = k.reshape(1, t, plan.n_kv_heads, -1)
    v = v.reshape(1, t, plan.n_kv_heads, -1)
    if layer.qk_norm:
        q, k = attn.q_norm(q), attn.k_norm(k)
    step.mark("qkv", layer_index, q, k, v)
    q, k = _rotate(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), layer.rope, step)
    step.mark("rope", layer_index, q, k)
    cache = step.cache
    cache.write_layer(layer_index, step.write, k, v.transpose(0, 2, 1, 3))
    if step.profile is not None:
        step.mark("write", layer_index, cache.keys(layer_index), cache.stored_values(layer_index))
    n = step.keys.n_keys  # rows past n can be seen by no query of this chunk
    keys = cache.keys(layer_index)[:, :, :n, :]  # (1, Hkv, n, D)
    values = cache.stored_values(layer_index)
    values = values[..., :n] if cache.v_layout == "transposed" else values[:, :, :n, :]
    marker = None
    if step.profile is not None:
        def marker(stage: str, a: mx.array) -> None:
            step.mark(stage, layer_index, a)
    out, probs = attend(q, keys, values, step.keys, layer, cache.v_layout,
                        want_probs=step.probe is not None, use_kernel=step.use_kernel,
                        mark=marker)
    if step.probe is not None and probs is not None:
        step.probe(layer_index, probs)
    out = attn.o_proj(out.transpose(0, 2, 1, 3).reshape(1, t, -1))
    step.mark("o_proj", layer_index, out)
    return out


def _residual(h: mx.array, r: mx.array) -> mx.array:
    if h.dtype == mx.float16:  # gemma3 clips fp16 residuals to stay finite
        bound = mx.finfo(mx.float16).max
        return mx.clip(h.astype(mx.float32) + r.astype(mx.float32), -bound, bound).astype(mx.float16)
    return h + r


def layer_forward(model: nn.Module, layer_index: int, h: mx.array, step: StepContext) -> mx.array:
    """One transformer block on hidden states ``h (1, T, hidden)``."""
    plan = model_plan(model)
    block = model.layers[layer_index]
    fused = fused_layer(model, layer_index)
    r = attention_block(model, layer_index, block.input_layernorm(h), step, fused)
    if plan.sandwich_norms:
        h = _residual(h, block.post_attention_layernorm(r))
        r = block.mlp(block.pre_feedforward_layernorm(h))
        h = _residual(h, block.post_feedforward_layernorm(r))
        step.mark("mlp", layer_index, h)
        return h
    h = h + r
    h = h + mlp(block.mlp, block.post_attention_layernorm(h), plan, fused)
    step.mark("mlp", layer_index, h)
    return h


def mlp(module: nn.Module, x: mx.array, plan: ModelPlan, fused: FusedLayer | None = None
        ) -> mx.array:
    """The block's MLP on ``x (1, T, hidden)``: llama/qwen SwiGLU with gate and up from one
    matmul where ``fused`` has them, and the activation of :mod:`~nexus_mlx.kernels.swiglu`
    (native, or the vectorized SiLU of :mod:`~nexus_mlx.kernels.cpu_exp`) where it applies
    (float32 on the CPU); else the module."""
    gate_up = fused.gate_up() if fused is not None else None
    fast = gate_up is not None or kernel_applies(x.dtype)
    if plan.architecture in SWIGLU_ARCHITECTURES and fast:
        gate, up = gate_up(x) if gate_up is not None else (module.gate_proj(x), module.up_proj(x))
        return module.down_proj(swiglu(gate, up))
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
    return softcap(model, logits)


def softcap(model: nn.Module, logits: mx.array) -> mx.array:
    """The architecture's logit soft-cap (Gemma 2: ``tanh(l / c) * c``; others: as is)."""
    cap = model_plan(model).final_softcap
    return logits if cap is None else mx.tanh(logits / cap) * cap


def head_weight(model: nn.Module) -> mx.array | None:
    """The output projection's ``(vocab, hidden)`` weight (the embedding when tied), or None
    when it is quantized (its logits are not one matrix product)."""
    layer = model.model.embed_tokens if model_plan(model).tied_embeddings else model.lm_head
    return None if hasattr(layer, "scales") else layer.weight


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
    """One mask per distinct window size among the layers (what the explicit path applies)."""
    keys = KeyView(query_pos, key_pos)
    return {w: keys.mask(w) for w in {lp.window for lp in plan.layers}}


def _chunks(positions: np.ndarray, chunk: int | None) -> list[np.ndarray]:
    """Token indices cut into runs of at most ``chunk`` in position order (so no run can see
    a later one's rows), or one run in input order when they fit (or ``chunk`` is None)."""
    if chunk is None or positions.size <= chunk:
        return [np.arange(positions.size)]  # one run keeps the input order
    order = np.argsort(positions, kind="stable")
    return [order[i:i + chunk] for i in range(0, order.size, chunk)]


def _chunk_step(
    cache: NexusCache, write: WritePlan, idx: np.ndarray, key_pos: np.ndarray,
    probe: AttentionProbe | None, use_kernel: bool, profile: StageProfile | None,
) -> StepContext:
    """The context of the tokens ``idx`` of ``write``: their rows, and the attended rows cut
    after the last row any of them can see (a row's position above every query's is invisible)."""
    rows, pos = write.rows[idx], write.positions[idx]
    plan = WritePlan(rows, pos, write.n_past_after)
    seen = np.flatnonzero(key_pos <= pos.max())
    n_keys = int(seen[-1]) + 1 if seen.size else 0
    return StepContext(pos, cache, plan, KeyView(pos, key_pos[:n_keys]), {}, probe, use_kernel,
                       profile)


def _run(
    model: nn.Module,
    tokens: TokenInput,
    cache: NexusCache,
    positions: Sequence[int] | np.ndarray | None,
    rows: Sequence[int] | np.ndarray | None,
    depth: int | None,
    probe: AttentionProbe | None,
    chunk: int | None,
    use_kernel: bool,
    last_only: bool,
    profile: StageProfile | None,
) -> mx.array:
    """Validate, commit every position, then run the chunks in position order: hidden states
    ``(1, T, hidden)`` in input order (only the last token's ``(1, 1, hidden)`` if asked)."""
    plan = model_plan(model)
    depth = plan.num_layers if depth is None else depth
    if not 0 <= depth <= plan.num_layers:
        raise PositionError(f"num_layers {depth} is outside [0, {plan.num_layers}]")
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        raise ArgumentError(f"chunk must be a positive integer or None, got {chunk!r}")
    ids = token_ids(tokens, plan.vocab_size)
    t = ids.shape[0]
    if positions is None:
        pos = np.arange(cache.next_position, cache.next_position + t, dtype=np.int64)
    else:
        pos = np.asarray(positions).reshape(-1)
    _check_positions(plan, pos, t)
    write = cache.plan_write(rows, pos)
    cache.commit_positions(write, ids)
    return _layers(model, cache, write, depth, probe, chunk, use_kernel, last_only, profile,
                   lambda idx: mx.array(ids[idx].astype(np.int32)))


def _layers(
    model: nn.Module,
    cache: NexusCache,
    write: WritePlan,
    depth: int,
    probe: AttentionProbe | None,
    chunk: int | None,
    use_kernel: bool,
    last_only: bool,
    profile: StageProfile | None,
    token_array: Callable[[np.ndarray], mx.array],
) -> mx.array:
    """Run a committed write through ``depth`` layers, chunk by chunk in position order
    (``token_array(idx)`` gives the ids of the tokens ``idx``); hidden states in input order."""
    key_pos = cache.positions  # (n_past,) after the commit: every row's final position
    t = write.rows.size
    runs = _chunks(write.positions, None if probe is not None else chunk)
    outs: list[mx.array] = []
    for i, idx in enumerate(runs):
        if i:  # keep the lazy graph one chunk deep (as mlx-lm's chunked prefill does)
            cache.evaluate()
        step = _chunk_step(cache, write, idx, key_pos, probe, use_kernel, profile)
        if profile is not None:
            profile.start()
        h = embed(model, token_array(idx))
        step.mark("embed", None, h)
        for layer in range(depth):
            h = layer_forward(model, layer, h, step)
        outs.append(h)
    order = np.concatenate(runs)
    if last_only:
        where = int(np.flatnonzero(order == t - 1)[0])
        sizes = np.cumsum([r.size for r in runs])
        run = int(np.searchsorted(sizes, where, side="right"))
        offset = where - (int(sizes[run - 1]) if run else 0)
        return outs[run][:, offset:offset + 1, :]
    h = outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=1)
    if np.array_equal(order, np.arange(t)):
        return h
    return h[:, mx.array(np.argsort(order).astype(np.int32)), :]


def forward_hidden(
    model: nn.Module,
    tokens: TokenInput,
    cache: NexusCache,
    positions: Sequence[int] | np.ndarray | None = None,
    rows: Sequence[int] | np.ndarray | None = None,
    *,
    num_layers: int | None = None,
    probe: AttentionProbe | None = None,
    chunk: int | None = PREFILL_CHUNK,
    use_kernel: bool = True,
    profile: StageProfile | None = None,
) -> mx.array:
    """Like :func:`forward` but returns the hidden states ``(1, T, hidden)`` after the first
    ``num_layers`` layers (default all; before the final norm). ``probe(layer, probs)`` receives
    every layer's attention probabilities ``(1, H, T, N)`` over the rows attended (a probed call
    is never chunked).

    With ``num_layers`` below the model's depth only those layers' K/V are written although the
    rows' positions and tokens are committed: run partial passes on a scratch ``fork()``."""
    return _run(model, tokens, cache, positions, rows, num_layers, probe, chunk, use_kernel,
                False, profile)


def forward(
    model: nn.Module,
    tokens: TokenInput,
    cache: NexusCache,
    positions: Sequence[int] | np.ndarray | None = None,
    rows: Sequence[int] | np.ndarray | None = None,
    *,
    logits: Literal["all", "last"] = "all",
    probe: AttentionProbe | None = None,
    chunk: int | None = PREFILL_CHUNK,
    use_kernel: bool = True,
    profile: StageProfile | None = None,
) -> mx.array:
    """Run ``tokens`` at ``positions`` (default: after the cache's last position), writing their
    K/V into ``rows`` (default: appended at ``cache.n_past``). Returns logits ``(1, T, vocab)``
    (or ``(1, 1, vocab)`` of the last token with ``logits="last"``). ``chunk`` tokens at a time
    in position order (None: all at once); ``use_kernel=False`` takes the explicit reference
    attention. Lazy where the back-end allows (see the module docstring)."""
    h = _run(model, tokens, cache, positions, rows, None, probe, chunk, use_kernel,
             logits == "last", profile)
    out = lm_head(model, h)
    if profile is not None:
        profile.mark("head", None, out)
    return out


def forward_tail(model: nn.Module, tokens: TokenInput, cache: NexusCache, tail: int) -> mx.array:
    """Append ``tokens`` at the cursor like :func:`forward` and return the logits ``(tail,
    vocab)`` of the last ``tail`` of them (1 <= tail <= len(tokens)), evaluated: a decoder's
    verify pass (:mod:`~nexus_mlx.decode.lookahead`) needs the logits of its drafted tokens
    only, not of a prompt fed in the same pass."""
    n = len(tokens)
    if isinstance(tail, bool) or not isinstance(tail, int) or not 1 <= tail <= n:
        raise TokenError(f"tail must be an integer in [1, {n}], got {tail!r}")
    h = forward_hidden(model, tokens, cache) if tail > 1 else forward_last_hidden(
        model, tokens, cache)
    logits = lm_head(model, h[:, -tail:])[0]
    mx.eval(logits)
    return logits


def forward_last_hidden(model: nn.Module, tokens: TokenInput, cache: NexusCache) -> mx.array:
    """Append ``tokens`` at the cursor like :func:`forward` and return the last one's hidden
    state ``(1, 1, hidden)`` before the final norm (lazy): :func:`lm_head` of it is
    ``forward(..., logits="last")``."""
    return _run(model, tokens, cache, None, None, None, None, PREFILL_CHUNK, True, True, None)


def decode_step(model: nn.Module, token: mx.array, cache: NexusCache) -> mx.array:
    """Append one token given as a lazy integer array of shape ``(1,)`` (a sampler's output)
    at the cursor and return its logits ``(1, 1, vocab)``, without reading the token on the
    host, so the next step's graph is built while this one still computes (the pipelining of
    mlx-lm's ``generate_step``). Its row's token id stays unknown (-1) until the caller records
    it (:meth:`~nexus_mlx.kv.cache.NexusCache.record_tokens`). The id is not range-checked:
    pass only what a sampler returned."""
    if token.ndim != 1 or token.shape[0] != 1 or not mx.issubdtype(token.dtype, mx.integer):
        raise TokenError(f"decode_step takes a (1,) integer array, got {token.shape} {token.dtype}")
    plan = model_plan(model)
    pos = np.array([cache.next_position], dtype=np.int64)
    _check_positions(plan, pos, 1)
    write = cache.plan_write(None, pos)
    cache.commit_positions(write, None)
    h = _layers(model, cache, write, plan.num_layers, None, None, True, True, None,
                lambda idx: token.astype(mx.int32))
    return lm_head(model, h)
