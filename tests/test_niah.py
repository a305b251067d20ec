"""Erasing-NIAH generator and scorer: determinism, well-formed cases whose deletion changes the
gold answer, and the scorer's parsing edge cases (no model forward passes; tokenizer only)."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from tasks.niah import (
    NiahSpec,
    answer_prefix,
    make_case,
    niah_cases,
    parse_numbers,
    response_text,
    score,
)

SMALL = NiahSpec(n_cases=8, lengths=(300, 700), n_distractors=2)
SMALL_ONE = dataclasses.replace(SMALL, n_cases=1)
_NUM = re.compile(r"\d{4}")


@pytest.fixture(scope="module")
def cases(default_tokenizer):
    return niah_cases(default_tokenizer, SMALL)


def test_generator_is_deterministic(default_tokenizer, cases):
    again = niah_cases(default_tokenizer, SMALL)
    for a, b in zip(cases, again, strict=True):
        assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.query, b.query)
        assert (a.edit, a.answer, a.deleted_answer, a.values) == (b.edit, b.answer, b.deleted_answer,
                                                                  b.values)
    # case i does not depend on how many cases are asked for
    assert np.array_equal(make_case(default_tokenizer, SMALL_ONE, 5).tokens, cases[5].tokens)
    other_seed = niah_cases(default_tokenizer, dataclasses.replace(SMALL, n_cases=2, seed=1))
    assert not np.array_equal(other_seed[0].tokens, cases[0].tokens)


def test_edit_rows_cover_exactly_the_deleted_text(default_tokenizer, cases):
    for case in cases:
        p0, p1 = case.edit.p0, case.edit.p1
        assert 0 < p0 < p1 < case.n_tokens  # non-empty prefix, span and suffix
        assert default_tokenizer.decode(case.tokens[p0:p1].tolist()) == case.e_text
        assert default_tokenizer.decode(case.tokens[:p0].tolist()) == case.p_text
        assert default_tokenizer.decode(case.tokens[p1:].tolist()) == case.s_text
        assert f"is now {case.deleted_answer}." in case.e_text


def test_deleting_changes_the_gold_answer(cases):
    for case in cases:
        assert case.answer != case.deleted_answer
        assert case.values[-2:] == (case.answer, case.deleted_answer)
        full = _NUM.findall(case.p_text + case.e_text + case.s_text)
        edited = _NUM.findall(case.p_text + case.s_text)
        # the most recent number wins: the deleted one with e present, the one before without
        assert full[-1] == case.deleted_answer and edited[-1] == case.answer
        assert case.deleted_answer not in case.p_text + case.s_text
        assert _NUM.findall(case.s_text) == []  # the suffix holds no numbers
        assert all(case.p_text.count(v) == 1 for v in case.values[:-1])
        leads = {v[0] for v in _NUM.findall(case.p_text + case.e_text)}
        assert len(leads) == len(_NUM.findall(case.p_text + case.e_text))  # distinct first digits
        assert case.key in case.question and case.key in case.e_text
        assert case.s_text.count(case.key) == SMALL.echoes  # the echoes name the key


def test_query_ends_with_the_answer_prefix(default_tokenizer, cases):
    for case in cases:
        text = default_tokenizer.decode(case.query.tolist())
        assert text.startswith("\n\n" + case.question)
        assert "<|im_start|>assistant\n" in text and text.endswith(answer_prefix(case.key))
        prefix = default_tokenizer.encode(answer_prefix(case.key), add_special_tokens=False)
        assert case.query[-len(prefix):].tolist() == prefix
        # the prefix's trailing space is the tokenizer's own token before digits: the natural
        # tokenization of "prefix + answer" continues the query's tokens with the digits
        joint = default_tokenizer.encode(answer_prefix(case.key) + case.answer, add_special_tokens=False)
        assert joint[: len(prefix)] == prefix and len(joint) == len(prefix) + len(case.answer)


def test_lengths_and_default_fit_the_model(default_tokenizer):
    for length in (300, 700):
        sizes = [c.n_tokens for c in niah_cases(default_tokenizer, NiahSpec(n_cases=6, lengths=(length,)))]
        assert all(0.9 * length <= n <= length for n in sizes), sizes
    longest = make_case(default_tokenizer, NiahSpec(), 3)  # 8000 tokens by default
    assert 7600 <= longest.n_tokens and longest.n_tokens + longest.query.size + 8 <= 8192


def test_plain_text_mode(default_tokenizer):
    case = make_case(default_tokenizer, NiahSpec(lengths=(300,), chat=False), 0)
    assert "<|im_start|>" not in case.p_text + default_tokenizer.decode(case.query.tolist())


@pytest.mark.parametrize("bad", [
    {"lengths": ()}, {"lengths": (100,)}, {"n_updates": 1}, {"n_updates": 6},
    {"n_updates": 5, "n_distractors": 5}, {"edit_depth": (0.0, 0.5)}, {"edit_depth": (0.7, 0.3)},
])
def test_spec_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        NiahSpec(**bad)


# ---- scorer --------------------------------------------------------------------------------
def test_scorer_single_values():
    assert score("4821.<|im_end|>", "4821")
    assert score(" 4821", "4821") and score("4,821.", "4821")
    assert not score("4821 or maybe 7730", "4821")  # extra numbers are wrong
    assert not score("482", "4821") and not score("48210", "4821")
    assert not score("0482", "482") and score("0482", "0482")  # leading zeros are kept
    assert not score("", "4821") and not score("no idea", "4821")
    assert not score("I think\n4821", "4821")  # only the first line of the response counts


def test_scorer_lists_check_order_and_multiplicity():
    assert score("4821, 7730", ["4821", "7730"])
    assert not score("7730, 4821", ["4821", "7730"])  # order
    assert not score("4821, 4821, 7730", ["4821", "7730"])  # multiplicity
    assert not score("4821", ["4821", "4821"])
    with pytest.raises(ValueError):
        score("4821", [])


def test_scorer_finds_the_response_boundary():
    transcript = ("<|im_start|>user\nThe secret number for harbor is 1111.<|im_end|>\n"
                  "<|im_start|>assistant\nThe latest secret number for harbor is 2222.")
    assert parse_numbers(transcript) == ["2222"]  # after the assistant marker
    prefix = answer_prefix("harbor")
    assert parse_numbers(transcript, prefix) == ["2222"]
    assert response_text("The latest secret number for harbor is 3333.\nmore", prefix) == "3333."
    assert score(transcript, "2222") and not score(transcript, "1111")
