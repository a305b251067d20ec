"""Fill-in-the-middle prompts: the FIM tokens found by their spellings (Qwen2.5-Coder's, from
its GGUF metadata, when the package is installed; none in SmolLM2's vocabulary), laid out
prefix-suffix-middle; and over loopback, a suffix filled in by a tiny random llama with Qwen's
tokenizer exactly as mlx-lm's greedy generation continues the same ids, and (slow) by Qwen
itself: the body of ``add``."""

from __future__ import annotations

from typing import Any

import pytest

openai = pytest.importorskip("openai")

from test_server import _tiny_llama, client, http, running  # noqa: E402
from test_server_completions import greedy_text  # noqa: E402

from nexus_mlx.errors import ModelNotFoundError  # noqa: E402
from nexus_mlx.models import packages  # noqa: E402
from nexus_mlx.models.fim import fim_prompt, fim_token_ids  # noqa: E402


class _Vocab:
    """The least a tokenizer needs here: a vocabulary and an encoder (one id per character)."""

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def get_vocab(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.names)}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [1000 + ord(c) for c in text]


def test_the_fim_tokens_are_found_by_their_spellings_and_laid_out_psm():
    qwen_like = _Vocab(["a", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>"])
    assert fim_token_ids(qwen_like) == (1, 3, 2)
    assert fim_prompt(qwen_like, [7, 8], "ab") == [1, 7, 8, 3, 1097, 1098, 2]
    assert fim_prompt(qwen_like, [7], "") == [1, 7, 3, 2]
    starcoder_like = _Vocab(["<fim_prefix>", "<fim_suffix>", "<fim_middle>"])
    assert fim_token_ids(starcoder_like) == (0, 1, 2)
    partial = _Vocab(["<|fim_prefix|>", "<|fim_suffix|>"])  # no middle token: no FIM
    assert fim_token_ids(partial) is None and fim_prompt(partial, [1], "x") is None


def test_smollm2_has_no_fim_tokens(default_tokenizer):
    assert fim_token_ids(default_tokenizer) is None


@pytest.fixture(scope="module")
def qwen_tokenizer() -> Any:
    from nexus_mlx.models.gguf_format import parse_gguf
    from nexus_mlx.models.gguf_tokenizer import build_tokenizer

    try:
        path = packages.resolve_package_spec("qwen2.5-coder-0.5b")
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    assert path is not None
    return build_tokenizer(parse_gguf(path).metadata, path)


def test_qwen_s_fim_tokens_are_its_own(qwen_tokenizer):
    ids = fim_token_ids(qwen_tokenizer)
    assert ids is not None
    assert [qwen_tokenizer.decode([i]) for i in ids] == [
        "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]


def test_a_suffix_is_filled_in_as_mlx_lm_continues_the_fim_ids(qwen_tokenizer):
    model = _tiny_llama(vocab_size=151936)
    prefix, suffix = "def add(a, b):\n    ", "\n\nprint(add(2, 3))\n"
    ids = fim_prompt(qwen_tokenizer, list(qwen_tokenizer.encode(prefix)), suffix)
    assert ids is not None
    want, finish = greedy_text(model, qwen_tokenizer, ids, 6)
    with running(model, qwen_tokenizer, model_name="tiny") as server:
        answer = client(server).completions.create(model="tiny", prompt=prefix, suffix=suffix,
                                                   max_tokens=6)
        assert answer.choices[0].text == want and answer.choices[0].finish_reason == finish
        assert answer.usage.prompt_tokens == len(ids)
        status, body = http(server, "/v1/completions", {
            "model": "tiny", "prompt": prefix, "suffix": suffix, "echo": True})
        assert status == 400 and body["error"]["param"] == "echo"


@pytest.mark.slow
def test_qwen_fills_in_a_function_body_over_loopback(qwen_tokenizer):
    import nexus_mlx as nx

    model, tokenizer = nx.load("qwen2.5-coder-0.5b")
    with running(model, tokenizer, model_name="qwen") as server:
        answer = client(server).completions.create(
            model="qwen", prompt="def add(a, b):\n    ", suffix="\n\nprint(add(2, 3))\n",
            max_tokens=12)
    assert answer.choices[0].text.startswith("return a + b"), answer.choices[0].text
