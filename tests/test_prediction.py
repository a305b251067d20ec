"""Predicted outputs (decode/prediction.py): alignment of a reply with its prediction, drafts
verified like copy drafts (the toy decoder of test_lookahead), and on a real architecture a
session reply that is the same with any prediction, right, wrong or partly right."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from test_lookahead import decode

from nexus_mlx.decode.prediction import Prediction
from nexus_mlx.errors import ArgumentError


def test_a_reply_follows_its_prediction_and_realigns_after_an_edit() -> None:
    predicted = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    p = Prediction(predicted, max_draft=3)
    assert p.propose(8) == [10, 11, 12]  # aligned with the start before any id
    p.advance([10, 11])
    assert p.cursor == 2 and p.propose(2) == [12, 13]
    p.advance([99])  # an edit: [10, 11, 99] occurs nowhere
    assert p.cursor is None and p.propose(4) == []
    p.advance([13, 14, 15])  # the reply rejoins: [13, 14, 15] ends at 6
    assert p.cursor == 6 and p.propose(3) == [16, 17, 18]
    p.advance([16, 17, 18, 19])
    assert p.propose(3) == []  # the prediction is spent


def test_realignment_prefers_the_first_match_ahead_of_where_it_left() -> None:
    predicted = [1, 2, 3, 7, 7, 1, 2, 3, 8, 8, 1, 2, 3, 9]
    p = Prediction(predicted, min_match=3)
    p.advance([1, 2, 3, 7, 7, 1, 2])  # aligned up to 7
    p.advance([5, 1, 2, 3])  # left at 7; [1, 2, 3] ends at 3, 8 and 13: 8 is the first ahead
    assert p.cursor == 8 and p.propose(1) == [8]
    q = Prediction(predicted, min_match=3)
    q.advance([*predicted])
    q.advance([4, 1, 2, 3])  # past the end: only earlier matches, the last one is taken
    assert q.cursor == 13


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ArgumentError):
        Prediction([1, 2], max_draft=-1)
    with pytest.raises(ArgumentError):
        Prediction([1, 2], min_match=0)


@pytest.mark.parametrize("kind", ["exact", "edited", "wrong", "empty"])
def test_predicted_drafts_never_change_the_output(kind: str) -> None:
    prompt = [3, 1, 4, 1, 5]
    plain, plain_toy, _ = decode(prompt, 30, 0)
    predicted = {"exact": plain, "edited": [*plain[:8], 6, 6, *plain[10:]],
                 "wrong": [0] * 30, "empty": []}[kind]
    out, toy, look = decode(prompt, 30, 0, Prediction(predicted, max_draft=6))
    assert out == plain and toy.rows == plain_toy.rows  # the same ids, the same cache
    stats = look.stats
    assert stats.predicted - stats.predicted_accepted == toy.dropped
    if kind == "exact":  # six ids a pass: 30 ids in about 5 passes, every draft kept
        assert stats.passes <= 7 and stats.predicted_accepted == stats.predicted > 20
    if kind in ("wrong", "empty"):
        assert stats.predicted_accepted == 0


def test_session_replies_are_the_same_with_any_prediction(tiny, default_tokenizer) -> None:
    from nexus_mlx.agent.session import Session

    messages = [{"role": "user", "content": "Rewrite this: def add(a, b): return a + b"}]
    plain_session = Session(tiny, default_tokenizer)
    plain = plain_session.generate(messages, max_tokens=40)
    half = plain.text[: len(plain.text) // 2] + " something else entirely " + \
        plain.text[len(plain.text) // 2:]
    for prediction in (plain.text, plain.tokens[:-1], half, "nothing like it", ""):
        session = Session(tiny, default_tokenizer)
        reply = session.generate(messages, max_tokens=40, prediction=prediction)
        assert reply.tokens == plain.tokens and reply.text == plain.text, prediction
        assert np.array_equal(session.tokens, plain_session.tokens)  # no draft left behind
        assert mx.allclose(session.next_token_logits(), plain_session.next_token_logits(),
                           atol=1e-4)
        if prediction is plain.text:
            assert reply.drafts.predicted_accepted > len(plain.tokens) // 2
            assert reply.drafts.passes < len(plain.tokens) // 2
    with pytest.raises(ArgumentError, match="prediction"):
        Session(tiny, default_tokenizer).generate(messages, prediction=[1.5, 2])
