"""token_char_spans: the text equals the tokenizer's own decoding and the spans tile it in order,
for the real default tokenizer (byte-level BPE) and SentencePiece / Metaspace tokenizers."""

from __future__ import annotations

import numpy as np
import pytest
from gguf_fixtures import spm_vocab
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models
from tokenizers import pre_tokenizers as pre

from nexus_mlx.errors import TokenError
from nexus_mlx.models.gguf_tokenizer import build_tokenizer
from nexus_mlx.models.tokenizer import gpt2_unicode_to_byte, token_char_spans

TEXTS = [
    "Hello world", "  leading spaces and  double  spaces ", "tabs\tand\nnewlines\n\n\nend",
    "numbers 12345 and 3.14159", "unicode: naïve café Ωmega 日本語の文章 中文",
    "emoji 😀🎉👍🏽 done 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ☃", "def f(x):\n    return x**2  # comment\n",
    '{"key": [1, 2, {"nested": "välue"}]}', "\u00a0nbsp and \u200b zero width", " ", "\n\n",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n<|endoftext|>", "a\r\nb",
    "    indented\n        more", "<file_sep><jupyter_code>x = 1", "",
]


def spm_tokenizer(add_space_prefix: bool):
    tokens, types, scores = spm_vocab()
    return build_tokenizer({
        "general.architecture": "gemma3", "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": np.array(types, np.int32),
        "tokenizer.ggml.scores": np.array(scores, np.float32),
        "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 3, "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_space_prefix": add_space_prefix,
    })


def check(tokenizer, ids) -> tuple[str, np.ndarray]:
    """The text is the tokenizer's decoding; spans tile it in order (neighbours touch, or share
    the one character a token boundary splits)."""
    text, spans = token_char_spans(tokenizer, ids)
    assert text == tokenizer.decode(list(ids))
    assert spans.shape == (len(ids), 2) and spans.dtype == np.int64
    assert np.all(spans[:, 0] <= spans[:, 1])
    if len(ids):
        assert spans[0, 0] == 0 and spans[-1, 1] == len(text)
        overlap = spans[:-1, 1] - spans[1:, 0]
        assert set(overlap.tolist()) <= {0, 1}
        assert np.all(np.diff(spans[:, 1]) >= 0)
    return text, spans


def test_gpt2_table_is_a_bijection():
    table = gpt2_unicode_to_byte()
    assert sorted(table.values()) == list(range(256)) and table["Ġ"] == 32 and table["Ċ"] == 10


@pytest.mark.parametrize("text", TEXTS)
def test_default_tokenizer_texts_and_every_seam(default_tokenizer, text):
    ids = default_tokenizer.encode(text, add_special_tokens=False)
    check(default_tokenizer, ids)
    for cut in range(len(ids)):  # suffixes and prefixes starting / ending mid-character
        check(default_tokenizer, ids[cut:])
        check(default_tokenizer, ids[:cut])


def test_ascii_tokens_get_their_own_text(default_tokenizer):
    ids = default_tokenizer.encode("<|im_start|>user\nThe cat sat.  Twice!", add_special_tokens=False)
    text, spans = check(default_tokenizer, ids)
    pieces = [text[a:b] for a, b in spans]
    assert pieces == [default_tokenizer.decode([i]) for i in ids]
    assert pieces[0] == "<|im_start|>"


def test_split_characters_are_shared(default_tokenizer):
    ids = default_tokenizer.encode("日本 𝔘", add_special_tokens=False)
    text, spans = check(default_tokenizer, ids)
    assert text == "日本 𝔘" and len(ids) > len(text)  # several tokens per character
    for a, b in spans:
        assert b - a >= 1
    first = [k for k, (a, b) in enumerate(spans) if a == 0]
    assert len(first) >= 2 and all(spans[k][1] == 1 for k in first)  # "日" spans 2 byte tokens


def test_a_seam_inside_a_character_decodes_with_replacement(default_tokenizer):
    ids = default_tokenizer.encode("x😀y", add_special_tokens=False)
    seen = 0
    for cut in range(1, len(ids)):
        text, spans = check(default_tokenizer, ids[cut:])  # tokenizers' lossy decoding, reproduced
        if "\ufffd" in text:
            seen += 1
            assert set(text[:-1]) == {"\ufffd"} and text[-1] == "y"
            assert spans[-1].tolist() == [len(text) - 1, len(text)]
    assert seen >= 1


@settings(max_examples=60, deadline=None)
@given(text=st.text(st.characters(codec="utf-8"), max_size=40),
       special=st.sampled_from(["", "<|im_start|>", "<|im_end|>\n", "<|endoftext|>"]),
       cut=st.integers(0, 60))
def test_default_tokenizer_any_text(default_tokenizer, text, special, cut):
    ids = default_tokenizer.encode(special + text + special, add_special_tokens=False)
    check(default_tokenizer, ids)
    check(default_tokenizer, ids[min(cut, len(ids)):])


@settings(max_examples=60, deadline=None)
@given(ids=st.lists(st.integers(0, 49151), max_size=12))
def test_default_tokenizer_any_ids(default_tokenizer, ids):
    check(default_tokenizer, ids)


@pytest.mark.parametrize("prefix", [False, True])
def test_sentencepiece_byte_fallback_and_strip(prefix):
    tok = spm_tokenizer(prefix)
    for text in TEXTS:
        ids = tok.encode(text)  # with <bos>
        check(tok, ids)
        for cut in range(len(ids)):
            check(tok, ids[cut:])
    rng = np.random.default_rng(0)
    vocab = len(spm_vocab()[0])
    for _ in range(300):  # byte-token runs that are not valid UTF-8: U+FFFD per byte token
        check(tok, rng.integers(0, vocab, rng.integers(1, 8)).tolist())


def test_metaspace_decoder():
    vocab = {"<unk>": 0, "\u2581the": 1, "\u2581cat": 2, "s": 3, "\u2581": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    ids = [1, 2, 3, 4, 1]
    text, spans = token_char_spans(tok, ids)
    assert text == tok.decode(ids) == "the cats  the"
    assert spans.tolist() == [[0, 3], [3, 7], [7, 8], [8, 9], [9, 13]]


def test_unsupported_decoder_and_unknown_id(default_tokenizer):
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tok.decoder = decoders.WordPiece()
    with pytest.raises(TokenError, match="WordPiece"):
        token_char_spans(tok, [1])
    with pytest.raises(TokenError, match="token id 99999"):
        token_char_spans(default_tokenizer, [1, 99999])
    with pytest.raises(TokenError, match="no `tokenizers` backend"):
        token_char_spans(object(), [1])
