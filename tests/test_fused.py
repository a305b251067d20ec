"""Fused q/k/v and gate/up projections: same values in one buffer, the same logits as mlx-lm's
forward, never stale after a weight is replaced, and off where it cannot apply."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from tiny_models import ARCHITECTURES, VOCAB, tiny_model

from nexus_mlx.models import fused
from nexus_mlx.models.forward import forward, make_cache

TOKENS = np.random.default_rng(3).integers(0, VOCAB, size=12)


def _mlx_lm_logits(model: nn.Module) -> np.ndarray:
    return np.array(model(mx.array(TOKENS)[None])[0])


def _our_logits(model: nn.Module) -> np.ndarray:
    return np.array(forward(model, TOKENS, make_cache(model))[0])


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_fusing_keeps_every_module_output_and_the_logits(name):
    model = tiny_model(name)
    x = mx.random.normal((1, 5, 64), key=mx.random.key(0))
    attn, mlp = model.layers[0].self_attn, model.layers[0].mlp
    before = [np.array(m(x)) for m in (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj,
                                        mlp.up_proj)]
    reference = _mlx_lm_logits(model)
    layers = fused.fuse_model(model)
    after = [np.array(m(x)) for m in (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj,
                                       mlp.up_proj)]
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)  # the modules hold the same values
    assert all(layer is not None and layer.qkv() is not None for layer in layers)
    swiglu = name in ("llama", "qwen2", "qwen3")
    assert all((layer.gate_up() is not None) == swiglu for layer in layers)
    q, k, v = layers[0].qkv()(x)
    np.testing.assert_allclose(np.array(q), before[0], atol=1e-5)
    np.testing.assert_allclose(np.array(v), before[2], atol=1e-5)
    np.testing.assert_allclose(_our_logits(model), reference, atol=1e-4)
    np.testing.assert_allclose(_mlx_lm_logits(model), reference, atol=1e-5)


def test_the_fused_weights_are_the_modules_own_buffers():
    model = tiny_model("qwen2")  # q/k/v biases are fused too
    mx.eval(model.parameters())
    before = mx.get_active_memory()
    layers = fused.fuse_model(model)
    attn = model.layers[1].self_attn
    grown = mx.get_active_memory() - before
    one_layer = sum(m.weight.nbytes + m.bias.nbytes
                    for m in (attn.q_proj, attn.k_proj, attn.v_proj))
    assert grown < one_layer, f"fusing kept {grown} extra bytes"  # no second copy per layer
    projection = layers[1].attention
    assert projection.bias is not None and projection.splits == (64, 96)
    assert attn.k_proj.weight.shape == (32, 64) and attn.k_proj.bias.shape == (32,)


def test_a_replaced_weight_is_used_never_the_stale_fused_copy():
    model = tiny_model("llama")
    fused.fuse_model(model)
    _our_logits(model)
    attn, mlp = model.layers[0].self_attn, model.layers[1].mlp
    attn.k_proj.weight = mx.random.normal(attn.k_proj.weight.shape, key=mx.random.key(1))
    mlp.up_proj.weight = mlp.up_proj.weight * 2.0
    layer0, layer1 = fused.fused_layer(model, 0), fused.fused_layer(model, 1)
    assert layer0.qkv() is None and layer0.gate_up() is not None  # only the replaced part
    assert layer1.gate_up() is None and layer1.qkv() is not None
    np.testing.assert_allclose(_our_logits(model), _mlx_lm_logits(model), atol=1e-4)


def test_quantized_projections_are_left_as_they_are():
    model = tiny_model("llama")
    nn.quantize(model, group_size=32, bits=8)
    layers = fused.fuse_model(model)
    assert all(layer is None for layer in layers)
    np.testing.assert_allclose(_our_logits(model), _mlx_lm_logits(model), atol=1e-4)


def test_the_environment_switch_turns_fusing_off(monkeypatch):
    monkeypatch.setenv(fused.ENV_VAR, "0")
    model = tiny_model("llama")
    weight = model.layers[0].self_attn.q_proj.weight
    assert fused.fused_layer(model, 0) is None
    assert model.layers[0].self_attn.q_proj.weight is weight  # nothing was rebound
    np.testing.assert_allclose(_our_logits(model), _mlx_lm_logits(model), atol=1e-4)
