"""The .atb compiled-block format: round trips of K/V made by ``forward``, the documented
on-disk layout, validation against the running model, atomic writes, and a fuzz test showing
that corrupted files raise FormatError and nothing else."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from tiny_models import _COMMON, CONFIGS, VOCAB, tiny_model

from nexus_mlx.blocks import atb
from nexus_mlx.blocks.block import block_from_cache, block_mismatches, validate_block
from nexus_mlx.errors import CacheError, FormatError, ModelMismatchError
from nexus_mlx.models.build import model_classes
from nexus_mlx.models.fingerprint import model_fingerprint, sample_indices
from nexus_mlx.models.forward import forward, make_cache

PREFIX, BLOCK = 3, 7  # the block is rows [3, 10) of a 10-token prefill: m0 = 3


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def gemma2():
    return tiny_model("gemma2")


def _prefilled(model, v_layout=None):
    cache = make_cache(model, v_layout=v_layout)
    tokens = np.random.default_rng(0).integers(0, VOCAB, size=PREFIX + BLOCK)
    mx.eval(forward(model, tokens, cache))
    return cache


def _block(model, v_layout=None, dtype="float32"):
    cache = _prefilled(model, v_layout)
    return block_from_cache(model, cache, PREFIX, dtype=dtype), cache


def _bytes(a) -> bytes:
    return np.asarray(a).tobytes()


def _llama_variant(**overrides):
    config = {**_COMMON, **CONFIGS["llama"], **overrides}
    model_cls, args_cls = model_classes(config)
    mx.random.seed(0)
    model = model_cls(args_cls.from_dict(config))
    mx.eval(model.parameters())
    return model


# ---- round trips -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, v_layout, dtype",
    [
        ("llama", "row", "float32"),
        ("llama", "transposed", "float32"),
        ("llama", "row", "float16"),
        ("llama", "transposed", "float16"),
        ("gemma2", None, "float32"),  # soft-capped: transposed V by default
    ],
)
def test_round_trip(request, tmp_path, name, v_layout, dtype):
    model = request.getfixturevalue(name)
    block, cache = _block(model, v_layout, dtype)
    path = tmp_path / "tool.atb"
    layout = atb.write_block(path, block)
    back = atb.read_block(path)

    assert back.header == block.header and back.header.layout == layout
    assert back.m0 == PREFIX and back.tokens == tuple(cache.tokens[PREFIX:].tolist())
    assert back.header.dtype == dtype and back.header.v_layout == cache.v_layout
    assert back.k.dtype == block.k.dtype and back.v.shape == block.v.shape
    assert _bytes(back.k) == _bytes(block.k) and _bytes(back.v) == _bytes(block.v)
    cast = {"float32": mx.float32, "float16": mx.float16}[dtype]
    for layer in range(cache.num_layers):
        want_k = cache.keys(layer)[:, :, PREFIX:, :].astype(cast)
        want_v = cache.values(layer)[:, :, PREFIX:, :].astype(cast)
        assert _bytes(back.keys(layer)) == _bytes(want_k)
        assert _bytes(back.values(layer)) == _bytes(want_v)


def test_layout_on_disk_matches_the_documented_table(tmp_path, gemma2):
    block, _ = _block(gemma2, dtype="float16")
    path = tmp_path / "tool.atb"
    atb.write_block(path, block)
    data = path.read_bytes()
    raw = dict(zip(atb.HEADER_FIELDS, struct.unpack(atb.HEADER_FORMAT, data[:128]), strict=True))
    fp = model_fingerprint(gemma2)
    assert raw["magic"] == b"\x89ATB\r\n\x1a\n" and (raw["version"], raw["header_size"]) == (1, 128)
    assert (raw["dtype"], raw["v_layout"], raw["m0"], raw["num_tokens"]) == (1, 1, PREFIX, BLOCK)
    assert raw["architecture"].rstrip(b"\0") == b"gemma2" and raw["num_layers"] == 2
    assert raw["weights_digest"] == bytes.fromhex(fp.weights_digest)[:8]
    meta = data[128 : 128 + raw["meta_size"]]
    assert hashlib.sha256(data[:120] + meta).digest()[:8] == raw["check_digest"]
    assert json.loads(meta)["tokens"] == list(block.tokens)
    size = 2 * 2 * BLOCK * 16 * 2  # layers * kv_heads * S * head_dim * itemsize
    assert raw["k_size"] == raw["v_size"] == size
    assert raw["k_offset"] == 2**21 and raw["v_offset"] == 2 * 2**21  # 2 MiB aligned
    assert len(data) == raw["v_offset"] + size
    assert data[raw["k_offset"] : raw["k_offset"] + size] == _bytes(block.k)
    v_disk = np.frombuffer(data, "<f2", size // 2, raw["v_offset"]).reshape(2, 2, 16, BLOCK)
    assert v_disk.tobytes() == _bytes(block.v)  # transposed: (layers, kv_heads, head_dim, S)


def test_read_header_reads_no_kv_and_validates(tmp_path, llama):
    block, _ = _block(llama)
    path = tmp_path / "tool.atb"
    layout = atb.write_block(path, block)
    header = atb.read_header(path)
    assert header == block.header and header.layout == layout
    validate_block(header, llama)
    assert list(header.positions) == list(range(PREFIX, PREFIX + BLOCK))
    with pytest.raises(CacheError, match="layer 2"):
        atb.read_block(path).keys(2)


# ---- validation against the running model --------------------------------------------------------
def test_validate_against_same_model_passes(llama):
    block, _ = _block(llama)
    validate_block(block, llama)
    assert block_mismatches(block, llama) == []


@pytest.mark.parametrize(
    "other, fields",
    [
        (lambda: tiny_model("qwen2"), ["architecture", "weights_digest", "rope base"]),
        (lambda: _llama_variant(num_hidden_layers=3), ["num_layers", "RoPE layer count"]),
        (lambda: tiny_model("llama-traditional"), ["rope base", "rope traditional"]),
        (lambda: tiny_model("llama", seed=1), ["weights_digest"]),
    ],
    ids=["architecture", "layers", "rope", "weights"],
)
def test_validate_against_other_model_names_each_field(llama, other, fields):
    block, _ = _block(llama)
    with pytest.raises(ModelMismatchError) as err:
        validate_block(block, other())
    for field in fields:
        assert field in str(err.value)
    if fields == ["weights_digest"]:
        assert "architecture" not in str(err.value) and "rope" not in str(err.value)


def test_block_from_cache_rejects_bad_ranges(llama):
    cache = _prefilled(llama)
    with pytest.raises(CacheError, match=r"rows \[5, 5\)"):
        block_from_cache(llama, cache, 5, 5)
    cache.shift(0, 2, 100)  # rows [0, 3) no longer hold consecutive positions
    with pytest.raises(FormatError, match="not consecutive"):
        block_from_cache(llama, cache, 0, 3)
    with pytest.raises(ModelMismatchError):
        block_from_cache(tiny_model("qwen3"), _prefilled(llama), 0)


# ---- model fingerprint ---------------------------------------------------------------------------
def test_fingerprint_is_deterministic_memoised_and_weight_sensitive():
    a, b = tiny_model("llama"), tiny_model("llama")
    fa = model_fingerprint(a)
    assert model_fingerprint(a) is fa and model_fingerprint(b) == fa
    w = b.layers[1].self_attn.o_proj.weight
    b.layers[1].self_attn.o_proj.weight = w * 1.001  # one tensor, changed slightly
    assert model_fingerprint(b) == fa  # memoised until refreshed
    fb = model_fingerprint(b, refresh=True)
    assert fb != fa and fa.mismatches(fb) == [
        f"weights_digest: {fa.weights_digest!r} != {fb.weights_digest!r}"
    ]
    q = model_fingerprint(tiny_model("qwen3"))
    assert {m.split(":")[0] for m in fa.mismatches(q)} == {"architecture", "weights_digest"}
    half = tiny_model("llama")
    half.set_dtype(mx.bfloat16)  # numpy has no bfloat16: hashed as raw 16-bit patterns
    fh = model_fingerprint(half)
    assert fh.weights_digest != fa.weights_digest
    assert model_fingerprint(half, refresh=True) == fh


def test_sample_indices_cover_the_tensor():
    assert sample_indices(10, 16).tolist() == list(range(10))
    idx = sample_indices(1000 * 64, 256)
    assert idx[0] == 0 and idx[-1] == 1000 * 64 - 1 and idx.max() < 1000 * 64
    assert len(np.unique(idx % 64)) > 50  # no aliasing with a 64-wide row


# ---- atomic writes ------------------------------------------------------------------------------
def test_write_leaves_no_temp_files(tmp_path, llama):
    block, _ = _block(llama)
    atb.write_block(tmp_path / "a.atb", block)
    atb.write_block(tmp_path / "a.atb", block)  # overwrite
    assert os.listdir(tmp_path) == ["a.atb"]


@pytest.mark.parametrize("where", ["section", "fsync", "replace"])
def test_crash_mid_write_keeps_previous_file(tmp_path, llama, monkeypatch, where):
    old, _ = _block(llama, dtype="float32")
    new, _ = _block(llama, dtype="float16")
    path = tmp_path / "a.atb"
    atb.write_block(path, old)
    before = path.read_bytes()

    def boom(*args, **kwargs):
        raise RuntimeError("simulated crash")

    if where == "section":
        real = atb._write_section

        def half(f, offset, data):
            real(f, offset, data[: len(data) // 2])
            boom()

        monkeypatch.setattr(atb, "_write_section", half)
    else:
        monkeypatch.setattr(atb.os, where, boom)
    with pytest.raises(RuntimeError, match="simulated crash"):
        atb.write_block(path, new)
    monkeypatch.undo()
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["a.atb"]
    assert atb.read_block(path).header.dtype == "float32"


# ---- specific rejections ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def valid_file(llama, tmp_path_factory):
    block, _ = _block(llama)
    path = tmp_path_factory.mktemp("atb") / "valid.atb"
    atb.write_block(path, block)
    return path.read_bytes()


def _reseal(data: bytearray) -> None:
    meta_size = struct.unpack_from("<I", data, 40)[0]
    data[120:128] = hashlib.sha256(bytes(data[:120]) + bytes(data[128 : 128 + meta_size])).digest()[:8]


def _patched(data: bytes, reseal: bool = True, **fields) -> bytearray:
    raw = dict(zip(atb.HEADER_FIELDS, struct.unpack(atb.HEADER_FORMAT, data[:128]), strict=True))
    raw.update(fields)
    out = bytearray(data)
    out[:128] = struct.pack(atb.HEADER_FORMAT, *raw.values())
    if reseal:
        _reseal(out)
    return out


def _field(data: bytes, name: str):
    return struct.unpack(atb.HEADER_FORMAT, data[:128])[atb.HEADER_FIELDS.index(name)]


CASES = {
    "empty": (lambda d: d[:0], "truncated"),
    "short header": (lambda d: d[:127], "truncated"),
    "in metadata": (lambda d: d[:200], "truncated: metadata"),
    "in K": (lambda d: d[: _field(d, "k_offset") + 3], "truncated: K"),
    "last byte": (lambda d: d[:-1], "truncated: V"),
    "trailing": (lambda d: d + b"\0", "trailing"),
    "magic": (lambda d: b"GGUF" + d[4:], "bad magic"),
    "version": (lambda d: _patched(d, version=2), "version 2"),
    "header size": (lambda d: _patched(d, header_size=256), "header_size 256"),
    "dtype": (lambda d: _patched(d, dtype=3), "dtype code 3"),
    "layout": (lambda d: _patched(d, v_layout=2), "v_layout code 2"),
    "rope dims": (lambda d: _patched(d, rope_dims=7), "rope_dims 7"),
    "zero": (lambda d: _patched(d, num_tokens=0, n_kv_heads=0), "n_kv_heads"),
    "k size": (lambda d: _patched(d, k_size=_field(d, "k_size") + 2), "k_size"),
    "absurd S": (lambda d: _patched(d, num_tokens=2**30), "k_size"),
    "absurd S positions": (lambda d: _patched(d, num_tokens=2**32 - 1), "exceed"),
    "absurd S sized": (
        lambda d: _patched(d, num_tokens=2**30, k_size=2**30 * 256, v_size=2**30 * 256,
                           v_offset=2**40),
        "truncated: K section",
    ),
    "far V": (lambda d: _patched(d, v_offset=2**63), "truncated: V section"),
    "unaligned": (lambda d: _patched(d, k_offset=_field(d, "k_offset") + 4096), "multiple of"),
    "overlap meta": (lambda d: _patched(d, k_offset=0), "overlaps the header"),
    "overlap K": (lambda d: _patched(d, v_offset=_field(d, "k_offset")), "overlaps or precedes"),
    "meta size": (lambda d: _patched(d, meta_size=2**31), "meta_size"),
    "positions": (lambda d: _patched(d, m0=2**31 - 3), "exceed"),
    "unsealed": (lambda d: _patched(d, reseal=False, m0=4), "check_digest"),
    "vocab": (lambda d: _patched(d, vocab_size=5), "vocab_size: header 5 != metadata 128"),
    "rope base": (lambda d: _patched(d, rope_base=1.0), "rope_base: header 1.0"),
    "tokens digest": (lambda d: _patched(d, tokens_digest=b"x" * 8), "tokens_digest"),
    "metadata json": (lambda d: _resealed_meta(d, b"{" * 40), "unreadable metadata"),
}


def _resealed_meta(data: bytes, junk: bytes) -> bytearray:
    out = bytearray(data)
    out[128 : 128 + len(junk)] = junk
    _reseal(out)
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_rejects_each_corruption_with_a_specific_error(tmp_path, valid_file, case):
    corrupt, message = CASES[case]
    path = tmp_path / "bad.atb"
    path.write_bytes(bytes(corrupt(valid_file)))
    with pytest.raises(FormatError, match=message.replace("[", r"\[")):
        atb.read_block(path)
    with pytest.raises(FormatError):
        atb.read_header(path)


def test_resealed_anchor_change_reads_as_a_consistent_block(tmp_path, valid_file):
    path = tmp_path / "moved.atb"
    path.write_bytes(bytes(_patched(valid_file, m0=40)))
    assert atb.read_block(path).m0 == 40  # the digest binds the header, not its meaning


# ---- fuzzing --------------------------------------------------------------------------------------
_LIMITS = {"B": 2**8 - 1, "H": 2**16 - 1, "I": 2**32 - 1, "Q": 2**64 - 1}
_CODES = [c for c in atb.HEADER_FORMAT[1:] if not c.isdigit()]
_NUMERIC = [(n, c) for n, c in zip(atb.HEADER_FIELDS, _CODES, strict=True) if c in _LIMITS]


@st.composite
def _field_value(draw):
    name, code = draw(st.sampled_from(_NUMERIC))
    top = _LIMITS[code]
    extremes = [0, 1, 2, top, top - 1, top // 2 + 1, min(top, 2**40), min(top, 2**21)]
    return name, draw(st.one_of(st.sampled_from(extremes), st.integers(0, top)))


def _corruption(size: int, meta_end: int):
    near = st.integers(0, meta_end + 16)
    return st.one_of(
        st.tuples(st.just("truncate"), st.one_of(near, st.integers(0, size))),
        st.tuples(st.just("flip"), near, st.integers(0, 7)),
        st.tuples(st.just("write"), near, st.binary(min_size=1, max_size=12)),
        st.tuples(st.just("field"), _field_value(), st.booleans()),
        st.tuples(st.just("float"), st.sampled_from(["rope_base", "rope_scale"]),
                  st.floats(allow_nan=True, width=32)),
    )


def _apply(data: bytearray, op) -> bytearray:
    kind = op[0]
    if kind == "truncate":
        return data[: op[1]]
    if len(data) < 128:
        return data
    if kind == "flip":
        if op[1] < len(data):
            data[op[1]] ^= 1 << op[2]
    elif kind == "write":
        data[op[1] : op[1] + len(op[2])] = op[2]
    elif kind == "field":
        (name, value), reseal = op[1], op[2]
        data = _patched(bytes(data), reseal=reseal, **{name: value})
    else:
        data = _patched(bytes(data), reseal=True, **{op[1]: op[2]})
    return data


@pytest.fixture(scope="module")
def fuzz_path(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz") / "fuzz.atb"


@settings(max_examples=300, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(draw=st.data())
def test_fuzz_corrupted_files_raise_only_block_format_error(draw, valid_file, fuzz_path, llama):
    meta_end = 128 + _field(valid_file, "meta_size")
    ops = draw.draw(st.lists(_corruption(len(valid_file), meta_end), min_size=1, max_size=3))
    data = bytearray(valid_file)
    for op in ops:
        data = _apply(data, op)
    fuzz_path.write_bytes(bytes(data))
    try:
        block = atb.read_block(fuzz_path)
    except FormatError as err:
        event(f"rejected: {str(err).split(' ')[0]}")
        return
    h = block.header  # accepted: it must be self-consistent
    assert h.layout is not None and h.layout.file_size == len(data)
    assert tuple(block.k.shape) == h.k_shape and tuple(block.v.shape) == h.v_shape
    assert h.k_shape[2] == len(h.tokens) and all(0 <= t < VOCAB for t in h.tokens)
    assert isinstance(block_mismatches(block, llama), list)
    event("accepted")


def test_missing_file_is_an_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        atb.read_block(Path(tmp_path) / "nope.atb")
