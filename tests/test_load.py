"""``nexus_mlx.load``: the embedded default model, mlx-lm directories, and bad specs."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from tiny_models import VOCAB, tiny_model

from nexus_mlx import chat, forward, load, make_cache
from nexus_mlx.errors import ModelFormatError, ModelNotFoundError

PARIS_PROMPT = "What is the capital of France? Answer in one sentence."


def test_default_model_answers_paris(default_model):
    model, tokenizer = default_model
    assert model.model_type == "llama"
    assert model.model.embed_tokens.weight.dtype == mx.float32  # float32 on CPU
    result = chat(model, tokenizer, PARIS_PROMPT, max_tokens=40)
    assert "Paris" in result.text, result.text
    assert result.stats.ttft_s > 0 and result.stats.generated_tokens > 0


def test_default_model_engine_matches_mlx_lm(default_model):
    model, tokenizer = default_model
    ids = tokenizer.encode("Tools are compiled once and spliced into the cache.")
    ref = model(mx.array(ids)[None])
    ours = forward(model, ids, make_cache(model))
    assert float(mx.abs(ours - ref).max()) <= 1e-3


def _save_tiny_directory(tmp_path, model, config):
    tmp_path.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(tmp_path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.fixture(scope="session")
def tokenizer_files(default_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    default_model[1]._tokenizer.save_pretrained(str(path))
    return path


def _tiny_dir(tmp_path, tokenizer_files, name="llama"):
    from tiny_models import _COMMON, CONFIGS

    model = tiny_model(name)
    config = {**_COMMON, **CONFIGS[name]}
    directory = _save_tiny_directory(tmp_path / name, model, config)
    for f in tokenizer_files.iterdir():
        (directory / f.name).write_bytes(f.read_bytes())
    return model, directory


def test_loads_mlx_lm_directory(tmp_path, tokenizer_files):
    model, directory = _tiny_dir(tmp_path, tokenizer_files)
    loaded, tokenizer = load(directory)
    tokens = np.arange(10) % VOCAB
    a = forward(model, tokens, make_cache(model))
    b = forward(loaded, tokens, make_cache(loaded))
    assert float(mx.abs(a - b).max()) == 0.0
    assert tokenizer.encode("hello") == tokenizer.encode("hello")


def test_directory_with_unsupported_architecture(tmp_path, tokenizer_files):
    _, directory = _tiny_dir(tmp_path, tokenizer_files)
    config = json.loads((directory / "config.json").read_text())
    config["model_type"] = "starcoder2"
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelFormatError, match="starcoder2"):
        load(directory)


@pytest.mark.parametrize(
    "spec, error, match",
    [
        ("no-such-alias", ModelNotFoundError, "no-such-alias"),
        ("/nonexistent/model.gguf", ModelNotFoundError, "model.gguf"),
    ],
)
def test_unknown_specs(spec, error, match):
    with pytest.raises(error, match=match):
        load(spec)


def test_wrong_file_kinds(tmp_path):
    text = tmp_path / "weights.txt"
    text.write_text("not a model")
    with pytest.raises(ModelFormatError, match="weights.txt"):
        load(text)
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    with pytest.raises(ModelFormatError, match="config.json"):
        load(empty_dir)


def test_bad_dtype():
    with pytest.raises(ModelNotFoundError, match="dtype"):
        load("default", dtype="fp8")
    with pytest.raises(ModelNotFoundError, match="floating"):
        load("default", dtype=mx.int32)
