"""``nexus-mlx convert``: the written directory is loaded by mlx-lm's own ``load`` as exactly our
model — the same parameters, logits within 1e-4 of our forward in float32, the same token ids,
chat prompt and end-of-sequence ids — for tiny random models of every architecture and for the
default SmolLM2 model (dequantized, and kept quantized); shards; the command line; refusals that
leave the output directory as it was."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm import load as mlx_lm_load
from tiny_models import CONFIGS, VOCAB, tiny_model

import nexus_mlx
from nexus_mlx.cli.main import main
from nexus_mlx.errors import ArgumentError, ModelFormatError, ModelNotFoundError
from nexus_mlx.models.convert import (
    WEIGHTS_INDEX,
    check_output_dir,
    convert_model,
    quantization_block,
    save_mlx_lm,
    weight_shards,
)
from nexus_mlx.models.forward import forward, make_cache

ROOT = Path(__file__).resolve().parent.parent
TEXTS = [
    "Hello, world!",
    "  leading spaces and trailing  ",
    "def parse(text):\n    return text.split()\n",
    "naïve café — 東京は今何時ですか? 🙂",
    "12345 + 678 = 13023",
    '{"name": "get_time", "arguments": {"timezone": "Asia/Tokyo"}}',
    "<|im_start|>user\nhi<|im_end|>",
]
CHATS = [
    [{"role": "user", "content": "What time is it in Tokyo?"}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
     {"role": "user", "content": "List three colours."}],
]
# transformers' Gemma configs type query_pre_attn_scalar as int (real checkpoints and the GGUF
# loader write an int); the tiny configs use 16.0
INT_OVERRIDES = {"gemma2": {"query_pre_attn_scalar": 16}, "gemma3": {"query_pre_attn_scalar": 16}}


def params(model) -> dict[str, mx.array]:
    return dict(tree_flatten(model.parameters()))


def assert_same_parameters(ours, theirs) -> None:
    a, b = params(ours), params(theirs)
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert mx.array_equal(a[name], b[name]).item(), name


def max_logit_diff(ours, theirs, ids: list[int]) -> float:
    mine = forward(ours, ids, make_cache(ours)).astype(mx.float32)  # (1, T, V)
    mlx_lm_logits = theirs(mx.array([ids])).astype(mx.float32)  # (1, T, V)
    return float(mx.abs(mine - mlx_lm_logits).max().item())


def _tiny(name: str):
    model = tiny_model(name)
    for key, value in INT_OVERRIDES.get(name, {}).items():
        setattr(model.args, key, value)
    return model


# ---- tiny random models --------------------------------------------------------------------
@pytest.mark.parametrize("name", list(CONFIGS))
def test_tiny_model_round_trips_through_mlx_lm(name, default_tokenizer, tmp_path):
    model = _tiny(name)
    out = save_mlx_lm(model, default_tokenizer, tmp_path / name)
    loaded, tokenizer = mlx_lm_load(str(out.path))
    assert_same_parameters(model, loaded)
    ids = np.random.default_rng(1).integers(0, VOCAB, 24).tolist()
    assert max_logit_diff(model, loaded, ids) <= 1e-4
    config = json.loads((out.path / "config.json").read_text())
    assert config["model_type"] == model.args.model_type
    assert "quantization" not in config
    assert tokenizer.eos_token_ids == set(default_tokenizer.eos_token_ids)


def test_quantized_tiny_model_keeps_its_quantization(default_tokenizer, tmp_path):
    import mlx.nn as nn

    model = tiny_model("llama-untied")
    nn.quantize(model, group_size=32, bits=4,
                class_predicate=lambda p, m: isinstance(m, nn.Linear) and "down_proj" not in p)
    block = quantization_block(model)
    assert block is not None and block["bits"] == 4 and block["group_size"] == 32
    assert "model.layers.0.mlp.down_proj" not in block and "lm_head" in block
    out = save_mlx_lm(model, default_tokenizer, tmp_path / "q")
    loaded, _ = mlx_lm_load(str(out.path))
    assert isinstance(loaded.lm_head, nn.QuantizedLinear)
    assert isinstance(loaded.model.layers[0].mlp.down_proj, nn.Linear)
    assert_same_parameters(model, loaded)
    ids = mx.array([[1, 5, 9, 33, 70]])
    assert mx.array_equal(model(ids), loaded(ids)).item()  # the same module code, same arrays


def test_large_models_are_sharded_with_an_index(default_tokenizer, tmp_path):
    model = tiny_model("qwen2")
    weights = params(model)
    biggest = max(v.nbytes for v in weights.values())
    shards = weight_shards(weights, biggest)
    assert all(sum(v.nbytes for v in s.values()) <= biggest for s in shards)
    assert sorted(k for s in shards for k in s) == sorted(weights)
    out = save_mlx_lm(model, default_tokenizer, tmp_path / "sharded", max_shard_bytes=biggest)
    files = sorted(p.name for p in out.path.glob("model-*.safetensors"))
    assert len(files) == len(shards) > 1 and files[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.loads((out.path / WEIGHTS_INDEX).read_text())
    assert sorted(index["weight_map"]) == sorted(weights)
    assert set(index["weight_map"].values()) == set(files)
    loaded, _ = mlx_lm_load(str(out.path))
    assert_same_parameters(model, loaded)


# ---- the default model ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def default_converted(default_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("convert") / "smollm2"
    result = convert_model("default", out)
    return result, mlx_lm_load(str(out))


def test_default_model_loads_in_mlx_lm_as_the_same_model(default_model, default_converted):
    ours, our_tokenizer = default_model
    result, (theirs, their_tokenizer) = default_converted
    assert result.dtypes == ("float32",) and result.quantized_layers == 0  # CPU: float32
    assert_same_parameters(ours, theirs)
    ids = our_tokenizer.apply_chat_template(CHATS[1], add_generation_prompt=True)
    assert max_logit_diff(ours, theirs, list(ids)) <= 1e-4
    config = json.loads((result.path / "config.json").read_text())
    assert config["nexus_mlx"] == {"source": "default", "dtype": "auto"}


def test_default_tokenizer_and_chat_template_are_identical(default_model, default_converted):
    ours = default_model[1]
    theirs = default_converted[1][1]
    for text in TEXTS:
        assert list(theirs.encode(text)) == list(ours.encode(text)), text
        ids = ours.encode(text, add_special_tokens=False)
        assert theirs.decode(ids) == ours.decode(ids)
    for chat in CHATS:
        for tokenize in (False, True):
            assert (theirs.apply_chat_template(chat, tokenize=tokenize, add_generation_prompt=True)
                    == ours.apply_chat_template(chat, tokenize=tokenize,
                                                add_generation_prompt=True))
    assert theirs.eos_token_ids == set(ours.eos_token_ids)
    assert (theirs.bos_token, theirs.eos_token) == (ours.bos_token, ours.eos_token)
    assert type(theirs.detokenizer).__name__ == type(ours.detokenizer).__name__
    detok = theirs.detokenizer
    detok.reset()
    for token in ours.encode(TEXTS[3], add_special_tokens=False):
        detok.add_token(token)
    detok.finalize()
    assert detok.text == TEXTS[3]


def test_the_directory_loads_back_in_nexus_mlx(default_model, default_converted):
    ours, our_tokenizer = default_model
    again, tokenizer = nexus_mlx.load(default_converted[0].path)
    assert_same_parameters(ours, again)
    assert set(tokenizer.eos_token_ids) == set(our_tokenizer.eos_token_ids)  # config's eos ids
    assert tokenizer.apply_chat_template(CHATS[0], add_generation_prompt=True) == \
        our_tokenizer.apply_chat_template(CHATS[0], add_generation_prompt=True)


def test_default_model_kept_quantized(default_tokenizer, tmp_path):
    ours, _ = nexus_mlx.load("default", dtype=None)
    out = convert_model("default", tmp_path / "q4", dtype=None)
    assert out.quantized_layers > 200 and "uint32" in out.dtypes
    config = json.loads((out.path / "config.json").read_text())
    assert config["quantization"]["model.embed_tokens"]["bits"] == 8  # Q8_0 in the GGUF
    assert config["quantization"]["bits"] == 4  # Q4_1 everywhere else
    theirs, _ = mlx_lm_load(str(out.path))
    assert_same_parameters(ours, theirs)
    ids = mx.array([default_tokenizer.encode("What time is it in Tokyo?")])
    assert mx.array_equal(ours(ids), theirs(ids)).item()


# ---- refusals and atomicity ----------------------------------------------------------------
def test_output_directory_rules(tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("keep me")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "empty").mkdir()
    assert check_output_dir(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    assert check_output_dir(tmp_path / "empty") == tmp_path / "empty"
    assert check_output_dir(tmp_path / "model", force=True) == tmp_path / "model"
    with pytest.raises(ArgumentError, match="existing file"):
        check_output_dir(tmp_path / "file")
    with pytest.raises(ArgumentError, match="not empty; pass --force"):
        check_output_dir(tmp_path / "model")
    with pytest.raises(ArgumentError, match="not a model directory"):
        check_output_dir(tmp_path / "notes", force=True)
    with pytest.raises(ArgumentError, match="writable"):
        check_output_dir(tmp_path / "file" / "below")
    assert (tmp_path / "notes" / "a.txt").read_text() == "keep me"


def test_refusals_leave_everything_as_it_was(default_tokenizer, tmp_path):
    model = tiny_model("llama")
    with pytest.raises(ModelNotFoundError):
        convert_model("no-such-model-alias", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(ArgumentError, match="max_shard_bytes"):
        save_mlx_lm(model, default_tokenizer, tmp_path / "out", max_shard_bytes=0)
    first = save_mlx_lm(model, default_tokenizer, tmp_path / "out")
    before = {p.name: p.read_bytes() for p in first.path.iterdir()}
    with pytest.raises(ArgumentError, match="is the model directory being converted"):
        convert_model(first.path, first.path, force=True)
    # args that disagree with the weights (tied, yet an lm_head): mlx-lm drops the lm_head on
    # load, the check after writing sees it, and the existing folder is untouched
    broken = tiny_model("llama-untied")
    broken.args.tie_word_embeddings = True
    with pytest.raises(ModelFormatError, match="rebuilds other parameters"):
        save_mlx_lm(broken, default_tokenizer, first.path, force=True)
    assert {p.name: p.read_bytes() for p in first.path.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no partial folder left
    # a config transformers' Gemma2Config refuses (a float query_pre_attn_scalar): not published
    with pytest.raises(ModelFormatError, match="mlx-lm cannot load the written folder"):
        save_mlx_lm(tiny_model("gemma2"), default_tokenizer, tmp_path / "gemma")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    with pytest.raises(ModelFormatError, match="tokenizers"):
        save_mlx_lm(model, object(), tmp_path / "other")
    # force replaces a model directory
    replaced = save_mlx_lm(tiny_model("qwen2"), default_tokenizer, first.path, force=True)
    assert json.loads((replaced.path / "config.json").read_text())["model_type"] == "qwen2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


# ---- the command line ----------------------------------------------------------------------
def test_cli_convert_then_refuse_then_force(default_model, tmp_path, capsys):
    out = tmp_path / "smollm2-q4"
    done = subprocess.run([sys.executable, "-m", "nexus_mlx.cli", "convert", "default", "--out",
                           str(out), "--dtype", "keep"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"wrote {out}" in done.stdout and "mlx_lm.server --model" in done.stdout
    theirs, _ = mlx_lm_load(str(out))
    ours, _ = nexus_mlx.load("default", dtype=None)
    assert_same_parameters(ours, theirs)
    capsys.readouterr()

    def error_line(*args: str) -> str:
        assert main(["convert", *args]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err
        return err.strip().splitlines()[-1]

    assert error_line("default", "--out", str(out)).startswith(
        "nexus-mlx: error: output directory")  # refused before the model loads
    assert "nexus-mlx: error:" in error_line("/nope/missing.gguf", "--out", str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()
    assert "--max-shard-size" in error_line("default", "--out", str(tmp_path / "y"),
                                            "--max-shard-size", "0")
    assert main(["convert", "default", "--out", str(out), "--dtype", "float16", "--force"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["nexus_mlx"]["dtype"] == "float16" and "quantization" not in config
    assert {v.dtype for v in mx.load(str(out / "model.safetensors")).values()} == {mx.float16}
