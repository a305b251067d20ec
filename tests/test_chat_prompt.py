"""Chat prompts (``models.tokenizer.chat_ids`` / ``chat_text``): the tokenizer's chat template
when it has one, the documented plain transcript when it has none (a base model's GGUF without
``tokenizer.chat_template``, as the packaged ``gemma3-270m``), so ``chat``, the rerankers and the
tool-call prompt work on a base model instead of raising transformers' ``ValueError``."""

from __future__ import annotations

import mlx.core as mx
import pytest
from gguf_fixtures import tiny_checkpoint, write_gguf

from nexus_mlx.decode.generate import chat
from nexus_mlx.decode.tool_call import CALL_PREFIX, tool_call_prompt
from nexus_mlx.errors import ModelNotFoundError
from nexus_mlx.models.gguf import load_gguf
from nexus_mlx.models.tokenizer import (
    FALLBACK_ASSISTANT,
    chat_ids,
    chat_text,
    has_chat_template,
)
from nexus_mlx.routing.rerank import LLMReranker, QueryLikelihoodReranker, chat_prompt
from nexus_mlx.tools.tool import Tool

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
TRANSCRIPT = "system: Be brief.\nuser: Hi there\nassistant:"
TOOLS = [Tool("get_time", "Current time in a time zone",
              {"type": "object", "properties": {"zone": {"type": "string"}}}),
         Tool("create_issue", "Open an issue in a repository")]


def _tiny_gguf(tmp_path_factory: pytest.TempPathFactory, arch: str, **options: object):
    config, weights = tiny_checkpoint(arch)
    path = write_gguf(tmp_path_factory.mktemp(arch) / f"{arch}.gguf", arch, config, weights,
                      **options)
    return load_gguf(path, mx.float32)


@pytest.fixture(scope="module")
def templated(tmp_path_factory):
    """A tiny llama GGUF whose tokenizer has a ChatML template."""
    return _tiny_gguf(tmp_path_factory, "llama")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny gemma3 GGUF without ``tokenizer.chat_template`` (BOS added, as gemma3-270m's)."""
    return _tiny_gguf(tmp_path_factory, "gemma3")


def test_template_path_is_the_templates_own(templated):
    _, tok = templated
    assert has_chat_template(tok)
    rendered = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert chat_text(tok, MESSAGES) == rendered
    assert chat_ids(tok, MESSAGES) == list(
        tok.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True))
    assert chat_ids(tok, "Hi there") == chat_ids(tok, [{"role": "user", "content": "Hi there"}])


def test_without_a_template_the_plain_transcript(base):
    _, tok = base
    assert not has_chat_template(tok)
    with pytest.raises(ValueError):  # what chat_ids used to let through
        tok.apply_chat_template(MESSAGES, add_generation_prompt=True)
    assert chat_text(tok, MESSAGES) == tok.bos_token + TRANSCRIPT
    ids = chat_ids(tok, MESSAGES)
    assert ids == list(tok.encode(TRANSCRIPT))  # the tokenizer's own BOS, once
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    assert chat_ids(tok, "Hi there") == list(tok.encode(f"user: Hi there\n{FALLBACK_ASSISTANT}"))


def test_without_a_template_or_a_bos(tmp_path_factory):
    _, tok = _tiny_gguf(tmp_path_factory, "gemma3", add_bos=False)
    assert chat_text(tok, MESSAGES) == TRANSCRIPT
    assert chat_ids(tok, MESSAGES) == list(tok.encode(TRANSCRIPT, add_special_tokens=False))


def test_chat_rerank_and_tool_prompt_on_a_base_model(base):
    model, tok = base
    result = chat(model, tok, "Hi there", max_tokens=3)
    assert result.stats.prompt_tokens == len(chat_ids(tok, "Hi there"))
    assert 1 <= len(result.tokens) <= 3
    assert chat_prompt(tok, "Which tool?", "Tool: ") == (
        chat_ids(tok, "Which tool?") + list(tok.encode("Tool: ", add_special_tokens=False)))
    for reranker in (QueryLikelihoodReranker(model, tok), LLMReranker(model, tok)):
        ranked = reranker.rerank("what time is it", TOOLS, [0.5, 0.4])
        assert sorted(name for name, _ in ranked) == ["create_issue", "get_time"]
    prompt = tool_call_prompt(tok, "what time is it in Paris", TOOLS[:1])
    text = tok.decode(prompt)
    assert text.startswith(tok.bos_token + "system: ") and text.endswith(
        f"user: what time is it in Paris\n{FALLBACK_ASSISTANT}{CALL_PREFIX}")


def test_packaged_base_model_gemma3_270m():
    from nexus_mlx.models.load import load

    try:
        _, tok = load("gemma3-270m")
    except ModelNotFoundError as exc:
        pytest.skip(f"gemma3-270m not installed: {exc}")
    if has_chat_template(tok):
        pytest.skip("this gemma3-270m package ships a chat template")
    ids = chat_ids(tok, "Hi there")
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids) == f"{tok.bos_token}user: Hi there\n{FALLBACK_ASSISTANT}"
