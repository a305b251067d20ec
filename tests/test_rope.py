"""RoPE at explicit positions and re-anchoring: equal to mlx-lm's rope modules at contiguous
positions, and rope(x, p) re-anchored by d equals rope(x, p + d) within 1e-5 for every variant."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.models.rope_utils import initialize_rope

from nexus_mlx.errors import ModelFormatError, ModelMismatchError, PositionError
from nexus_mlx.kv.rope import RopeSpec, apply_rope, reanchor

HEAD_DIM = 32
MAX_POS = 4096
VARIANTS = {
    "default": (10000.0, False, None),
    "traditional": (10000.0, True, None),
    "linear": (10000.0, False, {"type": "linear", "factor": 4.0}),
    "llama3": (500000.0, False, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 256}),
    "yarn": (10000.0, False, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256,
                              "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.7}),
    "longrope": (10000.0, False, {"rope_type": "longrope", "original_max_position_embeddings": 1024,
                                  "short_factor": [1.0] * 16, "long_factor": [1.0 + i / 8 for i in range(16)]}),
    "proportional": (10000.0, False, {"rope_type": "proportional", "partial_rotary_factor": 0.5,
                                      "factor": 2.0}),
}


def _spec(name: str) -> RopeSpec:
    base, traditional, scaling = VARIANTS[name]
    return RopeSpec.from_config(HEAD_DIM, base, traditional, scaling, MAX_POS)


def _x(t: int, seed: int = 0) -> mx.array:
    return mx.array(np.random.default_rng(seed).standard_normal((1, 3, t, HEAD_DIM)).astype(np.float32))


@pytest.mark.parametrize("name", VARIANTS)
def test_matches_mlx_lm_rope_at_contiguous_positions(name):
    base, traditional, scaling = VARIANTS[name]
    module = initialize_rope(HEAD_DIM, base, traditional, scaling, MAX_POS)
    x = _x(40)
    for offset in (0, 17):
        ref = module(x, offset=offset)
        got = apply_rope(x, np.arange(offset, offset + 40), _spec(name))
        assert float(mx.abs(got - ref).max()) <= 2e-5, (name, offset)


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("delta", [1, 37, 2048, -1, -300])
def test_reanchor_equals_rope_at_shifted_positions(name, delta):
    spec = _spec(name)
    pos = np.array([0, 5, 300, 301, 1500, 3000, 2, 4000]) + (300 if delta < 0 else 0)
    x = _x(pos.size, seed=abs(delta))
    moved = reanchor(apply_rope(x, pos, spec), delta, spec)
    direct = apply_rope(x, pos + delta, spec)
    assert float(mx.abs(moved - direct).max()) <= 1e-5


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(sorted(VARIANTS)),
    pos=st.lists(st.integers(0, 8192), min_size=1, max_size=6),
    delta=st.integers(-8192, 8192),
)
def test_reanchor_property(name, pos, delta):
    pos_arr = np.array(pos)
    if (pos_arr + delta).min() < 0:
        delta = -int(pos_arr.min())
    spec = _spec(name)
    x = _x(pos_arr.size, seed=len(pos))
    moved = reanchor(apply_rope(x, pos_arr, spec), delta, spec)
    assert float(mx.abs(moved - apply_rope(x, pos_arr + delta, spec)).max()) <= 1e-5


def test_reanchor_composes_and_inverts():
    spec = _spec("llama3")
    k = apply_rope(_x(6), np.arange(100, 106), spec)
    there_and_back = reanchor(reanchor(k, 1234, spec), -1234, spec)
    assert float(mx.abs(there_and_back - k).max()) <= 1e-5
    assert reanchor(k, 0, spec) is k


def test_rope_preserves_norm_of_rotated_pairs():
    spec = _spec("default")
    x = _x(5)
    y = apply_rope(x, np.array([0, 9, 99, 999, 9999]), spec)
    assert np.allclose(np.linalg.norm(np.array(x), axis=-1), np.linalg.norm(np.array(y), axis=-1), atol=1e-5)


def test_fingerprint_is_stable_and_sensitive():
    a, b = _spec("llama3"), _spec("llama3")
    assert a.fingerprint() == b.fingerprint() and len(a.fingerprint()) == 16
    assert a.fingerprint() != _spec("default").fingerprint()
    a.validate(b)


def test_validate_names_every_mismatching_field():
    a = RopeSpec.from_config(64, 10000.0, False, None, 2048)
    b = RopeSpec.from_config(64, 500000.0, True, {"type": "linear", "factor": 2.0}, 4096)
    with pytest.raises(ModelMismatchError) as info:
        a.validate(b)
    msg = str(info.value)
    for field in ("base", "traditional", "scaling_type", "scaling", "max_position_embeddings"):
        assert f"{field}:" in msg
    assert "head_dim" not in msg


def test_rejects_dynamic_and_unknown_scaling():
    with pytest.raises(ModelFormatError, match="dynamic"):
        RopeSpec.from_config(64, 10000.0, False, {"type": "dynamic", "factor": 2.0})
    with pytest.raises(ModelFormatError, match="wobbly"):
        RopeSpec.from_config(64, 10000.0, False, {"type": "wobbly"})
    with pytest.raises(ModelFormatError, match="even"):
        RopeSpec(head_dim=64, dims=7, base=10000.0)


def test_position_count_must_match_tokens():
    with pytest.raises(PositionError, match="3 positions for 4 tokens"):
        apply_rope(_x(4), np.arange(3), _spec("default"))
