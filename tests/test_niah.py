"""Erasing-NIAH generator and scorer: determinism, well-formed cases whose deletion changes the
gold answer, real haystack paragraphs, and the scorer's parsing edge cases (no model forward
passes; tokenizer only)."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from tasks.niah import (
    NiahSpec,
    fact,
    haystack_paragraphs,
    make_case,
    niah_cases,
    parse_numbers,
    question_text,
    response_text,
    score,
)

SMALL = NiahSpec(n_cases=8, lengths=(300, 700), n_distractors=2)
SMALL_ONE = dataclasses.replace(SMALL, n_cases=1)
_NUM = re.compile(r"\d{4}")


@pytest.fixture(scope="module")
def haystack(shared_data):
    return haystack_paragraphs([shared_data / "multihop" / "hotpotqa_dev50.json",
                                shared_data / "multihop" / "musique_dev50.json"])


@pytest.fixture(scope="module")
def cases(default_tokenizer, haystack):
    return niah_cases(default_tokenizer, SMALL, haystack)


def _codes(text: str, key: str) -> list[str]:
    return re.findall(rf"The access code for the {key} vault is (\d{{4}})\.", text)


def test_haystack_is_real_distinct_paragraphs(haystack):
    assert len(haystack) > 500 and len(set(haystack)) == len(haystack)
    assert all("\n" not in p and len(p) >= 80 for p in haystack)
    assert haystack_paragraphs() == haystack  # the default files are the shared ones


def test_generator_is_deterministic(default_tokenizer, haystack, cases):
    again = niah_cases(default_tokenizer, SMALL, haystack)
    for a, b in zip(cases, again, strict=True):
        assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.query, b.query)
        assert (a.edit, a.answer, a.deleted_answer, a.values) == (b.edit, b.answer, b.deleted_answer,
                                                                  b.values)
    # case i does not depend on how many cases are asked for
    assert np.array_equal(make_case(default_tokenizer, SMALL_ONE, 5, haystack).tokens, cases[5].tokens)
    other_seed = niah_cases(default_tokenizer, dataclasses.replace(SMALL, n_cases=2, seed=1), haystack)
    assert not np.array_equal(other_seed[0].tokens, cases[0].tokens)


def test_edit_rows_are_exactly_one_fact_paragraph(default_tokenizer, cases):
    for case in cases:
        p0, p1 = case.edit.p0, case.edit.p1
        assert 0 < p0 < p1 < case.n_tokens  # non-empty prefix, span and suffix
        assert default_tokenizer.decode(case.tokens[p0:p1].tolist()) == case.e_text
        assert default_tokenizer.decode(case.tokens[:p0].tolist()) == case.p_text
        assert default_tokenizer.decode(case.tokens[p1:].tolist()) == case.s_text
        deleted_value = case.values[case.deleted_index]
        assert case.e_text == fact(case.key, deleted_value)  # one whole sentence and paragraph
        assert case.p_text.endswith("\n\n")  # e starts a paragraph, right after a break


def test_deleting_changes_the_gold_answer(cases, haystack):
    for case in cases:
        deleted_value = case.values[case.deleted_index]
        assert case.answer != case.deleted_answer
        assert case.deleted_answer == case.values  # with e: every code, in order
        assert case.answer == tuple(v for v in case.values if v != deleted_value)
        # what the context says, read back from the text: with e, without e
        assert _codes(case.p_text + case.e_text + case.s_text, case.key) == list(case.values)
        assert _codes(case.p_text + case.s_text, case.key) == list(case.answer)
        assert deleted_value not in case.p_text + case.s_text
        codes = _NUM.findall(case.p_text + case.e_text + case.s_text)
        facts = re.findall(r"vault is (\d{4})\.", case.p_text + case.e_text + case.s_text)
        assert len(facts) == SMALL.n_values + SMALL.n_distractors  # the distractor keys too
        assert len({v[0] for v in facts}) == len(facts)  # distinct leading digits
        assert all(codes.count(v) == 1 for v in facts)  # no code occurs in the haystack
        assert case.key in case.question and case.key in case.e_text


def test_question_ends_the_cached_message(default_tokenizer, cases):
    for case in cases:
        assert case.s_text.endswith(case.question)
        assert case.question == question_text(case.key, "list")
        assert default_tokenizer.decode(case.query.tolist()) == "<|im_end|>\n<|im_start|>assistant\n"


def test_question_in_query(default_tokenizer, haystack):
    spec = dataclasses.replace(SMALL, n_cases=3, question_in_cache=False)
    for case in niah_cases(default_tokenizer, spec, haystack):
        assert case.question not in case.s_text and case.s_text  # never an empty suffix
        assert default_tokenizer.decode(case.query.tolist()).startswith(case.question)


def test_latest_mode(default_tokenizer, haystack):
    spec = dataclasses.replace(SMALL, n_cases=4, answer="latest", n_values=3)
    for case in niah_cases(default_tokenizer, spec, haystack):
        assert case.deleted_index == 2
        assert case.deleted_answer == (case.values[-1],) and case.answer == (case.values[-2],)
        assert "latest" in case.question


def test_deleting_any_fact(default_tokenizer, haystack):
    spec = dataclasses.replace(SMALL, n_cases=12, deleted="any", n_values=3)
    seen = set()
    for case in niah_cases(default_tokenizer, spec, haystack):
        seen.add(case.deleted_index)
        assert _codes(case.p_text + case.e_text + case.s_text, case.key) == list(case.values)
        assert _codes(case.p_text + case.s_text, case.key) == list(case.answer)
        assert len(case.answer) == 2
    assert seen == {0, 1, 2}


def test_edit_depth_places_the_fact(default_tokenizer, haystack):
    last = dataclasses.replace(SMALL, n_cases=3, edit_depth=(1.0, 1.0))
    for case in niah_cases(default_tokenizer, last, haystack):  # right before the question
        assert case.s_text == case.question
    early = dataclasses.replace(SMALL, n_cases=4, lengths=(2000,), edit_depth=(0.2, 0.3))
    for case in niah_cases(default_tokenizer, early, haystack):
        assert case.suffix_length > 0.6 * case.n_tokens


def test_lengths_fit(default_tokenizer, haystack):
    for length in (300, 700, 2048):
        spec = NiahSpec(n_cases=4, lengths=(length,))
        sizes = [c.n_tokens for c in niah_cases(default_tokenizer, spec, haystack)]
        assert all(0.9 * length <= n <= length for n in sizes), sizes


def test_plain_text_mode(default_tokenizer, haystack):
    case = make_case(default_tokenizer, NiahSpec(lengths=(300,), chat=False), 0, haystack)
    assert "<|im_start|>" not in case.p_text + default_tokenizer.decode(case.query.tolist())


@pytest.mark.parametrize("bad", [
    {"lengths": ()}, {"lengths": (100,)}, {"n_values": 1}, {"n_values": 6},
    {"n_values": 5, "n_distractors": 5}, {"n_distractors": -1}, {"edit_depth": (0.0, 0.5)},
    {"edit_depth": (0.7, 0.3)}, {"edit_depth": (0.5, 1.2)}, {"answer": "all"},
    {"deleted": "first"}, {"answer": "latest", "deleted": "any"},
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
    assert score("\n4821\nmore", "4821")  # the first non-empty line


def test_scorer_lists_check_order_and_multiplicity():
    assert score("4821, 7730", ["4821", "7730"]) and score("4821,7730", ["48217730"])
    assert not score("7730, 4821", ["4821", "7730"])  # order
    assert not score("4821, 4821, 7730", ["4821", "7730"])  # multiplicity
    assert not score("4821", ["4821", "4821"]) and not score("4821, 4821", ["4821"])
    assert parse_numbers("4821, 28.23") == ["4821", "28", "23"]
    with pytest.raises(ValueError):
        score("4821", [])


def test_scorer_finds_the_response_boundary():
    transcript = ("<|im_start|>user\nThe access code for the harbor vault is 1111.<|im_end|>\n"
                  "<|im_start|>assistant\n2222")
    assert parse_numbers(transcript) == ["2222"]  # after the assistant marker
    assert response_text("Codes: 3333.\nmore", "Codes:") == "3333."
    assert score(transcript, "2222") and not score(transcript, "1111")
