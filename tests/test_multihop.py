"""Multi-hop QA repair cases on the real HotpotQA / MuSiQue files (skipped when absent) and
SQuAD-style normalized exact match (tokenizer only, no forward passes)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from tasks.multihop import (
    PLACEMENTS,
    QASpec,
    build_case,
    build_cases,
    exact_match,
    load_items,
    normalize_answer,
    passage_text,
    prediction_text,
)

FILES = {"hotpotqa": "multihop/hotpotqa_dev50.json", "musique": "multihop/musique_dev50.json"}


@pytest.fixture(scope="module", params=sorted(FILES))
def dataset(request, shared_data):
    return request.param, load_items(shared_data / FILES[request.param])


def test_loading(dataset):
    name, items = dataset
    assert len(items) == 50 and all(item.dataset == name for item in items)
    for item in items:
        assert item.question and item.answers and item.answers[0]
        assert any(p.supporting for p in item.passages)
        assert any(not p.supporting for p in item.passages)


DISTRACTOR = QASpec(deleted="distractor")


def _check_layout(tokenizer, item, case, index):
    p0, p1 = case.edit.p0, case.edit.p1
    assert 0 < p0 < p1 < case.n_tokens
    assert tokenizer.decode(case.tokens[p0:p1].tolist()) == case.e_text
    assert tokenizer.decode(np.r_[case.tokens[:p0], case.tokens[p1:]].tolist()) == \
        case.p_text + case.s_text
    assert case.e_text.startswith("Title: ") and case.e_text.endswith("\n\n")  # one passage
    assert case.p_text.endswith("\n\n")
    kept = case.p_text + case.s_text
    support = [p for p in item.passages if p.supporting]
    spots = [kept.index(passage_text(p)) for p in support]
    assert spots == sorted(spots)  # all supporting evidence stays, in order
    before = sum(s < len(case.p_text) for s in spots)
    expected = PLACEMENTS[index % 3]
    if expected == "between" and len(support) < 2:
        expected = "after"
    assert case.placement == expected
    assert {"before": before == 0, "between": 0 < before < len(support),
            "after": before == len(support)}[case.placement]
    # the question ends the cached message; the query is the assistant turn's header
    assert case.s_text.endswith(f"Question: {item.question}")
    assert tokenizer.decode(case.query.tolist()) == "<|im_end|>\n<|im_start|>assistant\n"


def test_distractor_cases_are_well_formed(default_tokenizer, dataset):
    _, items = dataset
    cases = build_cases(default_tokenizer, items, DISTRACTOR)
    for index, (item, case) in enumerate(zip(items, cases, strict=True)):
        _check_layout(default_tokenizer, item, case, index)
        inserted = [p for p in item.passages if passage_text(p) == case.e_text]  # titles repeat
        assert inserted and not any(p.supporting for p in inserted)
        assert inserted[0].title == case.inserted_title
        assert case.deleted_kind == "distractor" and case.substitute is None
    assert {c.placement for c in cases} == set(PLACEMENTS)


def test_conflict_cases_plant_a_wrong_answer(default_tokenizer, dataset):
    name, items = dataset
    cases = build_cases(default_tokenizer, items)  # the default: conflict passages
    n_conflict = 0
    for index, (item, case) in enumerate(zip(items, cases, strict=True)):
        _check_layout(default_tokenizer, item, case, index)
        if case.deleted_kind == "distractor":  # no supporting passage holds the answer
            assert not any(p.supporting for p in item.passages if passage_text(p) == case.e_text)
            continue
        n_conflict += 1
        sub = case.substitute
        assert sub and normalize_answer(sub) not in {normalize_answer(a) for a in item.answers}
        kept = case.p_text + case.s_text
        assert sub.lower() not in kept.lower() and sub in case.e_text  # only e has it
        # e is a supporting passage with a gold answer swapped for the substitute
        swapped = [(p, a) for p in item.passages for a in item.answers if p.supporting
                   and re.search(rf"(?<!\w){re.escape(a)}(?!\w)", passage_text(p), re.I)
                   and re.sub(rf"(?<!\w){re.escape(a)}(?!\w)", sub, passage_text(p),
                              flags=re.I) == case.e_text]
        assert swapped
        assert all(passage_text(p) in kept for p, _ in swapped)  # the evidence stays in p + s
    assert n_conflict >= 0.8 * len(items), (name, n_conflict)


def test_builder_is_deterministic(default_tokenizer, dataset):
    _, items = dataset
    pool = [item.answers[0] for item in items]
    a, b = (build_case(default_tokenizer, items[3], 3, substitutes=pool) for _ in range(2))
    assert np.array_equal(a.tokens, b.tokens) and a.edit == b.edit and a.substitute == b.substitute
    other = build_case(default_tokenizer, items[3], 3, QASpec(seed=1), pool)
    assert (other.inserted_title, other.edit, other.substitute) != \
        (a.inserted_title, a.edit, a.substitute) or not np.array_equal(other.tokens, a.tokens)
    assert build_cases(default_tokenizer, items)[3].e_text == a.e_text  # same pool, same case
    # no substitute to plant: a conflict case falls back to deleting a distractor
    assert build_case(default_tokenizer, items[3], 3).deleted_kind == "distractor"


def test_question_in_query(default_tokenizer, dataset):
    _, items = dataset
    case = build_case(default_tokenizer, items[0], 0, QASpec(question_in_cache=False))
    assert "Question:" not in case.s_text and case.s_text
    assert default_tokenizer.decode(case.query.tolist()).startswith(f"Question: {items[0].question}")


def test_load_rejects_other_formats(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"question": "q", "answer": "a"}]))
    with pytest.raises(ValueError, match="neither HotpotQA"):
        load_items(bad)
    bad.write_text("[]")
    with pytest.raises(ValueError, match="non-empty"):
        load_items(bad)
    with pytest.raises(ValueError):
        QASpec(kept_distractors=1)
    with pytest.raises(ValueError):
        QASpec(deleted="supporting")


# ---- normalized exact match ----------------------------------------------------------------
@pytest.mark.parametrize("text, norm", [
    ("The Anglican Communion.", "anglican communion"),
    ("  Columbus,   Ohio ", "columbus ohio"),
    ("an apple a day", "apple day"),
    ("G. Stanley Hall", "g stanley hall"),
    ("Theater", "theater"),  # articles only as whole words
    ("", ""),
])
def test_normalize_answer(text, norm):
    assert normalize_answer(text) == norm


def test_exact_match():
    assert exact_match("the Anglican communion", ("the Anglican Communion",)) == 1.0
    assert exact_match("Stanley Hall", ("G. Stanley Hall", "Stanley Hall")) == 1.0  # aliases
    assert exact_match("Hall", ("G. Stanley Hall", "Stanley Hall")) == 0.0
    assert exact_match("6.8 inches", "6.8 inches") == 1.0 and exact_match("68 inches", "6.8") == 0.0
    assert exact_match("", ("yes",)) == 0.0


def test_prediction_text():
    assert prediction_text(" Jack Owens\n") == "Jack Owens"
    assert prediction_text("Answer: Jack Owens<|im_end|>") == "Jack Owens"
    assert prediction_text("The answer is Latin.") == "Latin."
    assert prediction_text(" No, they are not both airports.") == "No"
    assert prediction_text("Yes.") == "Yes" and prediction_text("Nolan") == "Nolan"
    assert prediction_text("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n\n 35\n1") == "35"
    assert prediction_text("<|im_end|>") == ""
    assert exact_match(prediction_text(" No, Christopher Nolan is not"), ("no",)) == 1.0
