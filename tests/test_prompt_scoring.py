"""A prompt's own log probabilities (teacher forcing) equal a log-softmax of mlx-lm's own
forward over the whole prompt, across the head's chunks and for Gemma's soft-capped logits;
alternatives are the best ids below the vocabulary size, best first; degenerate prompts. A
scorer that reuses the last prompt's shared prefix scores as a fresh scoring does and computes
only the rows past that prefix."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from tiny_models import VOCAB, tiny_model

from nexus_mlx.agent import prompt_scoring
from nexus_mlx.agent.prompt_scoring import SCORE_CHUNK, PromptScorer, prompt_logprobs
from nexus_mlx.errors import ArgumentError


def _reference(model, ids: np.ndarray) -> np.ndarray:
    logits = model(mx.array(ids)[None])[0].astype(mx.float32)
    return np.array(logits - mx.logsumexp(logits, axis=-1, keepdims=True))  # (T, V)


@pytest.mark.parametrize("arch", ["llama-untied", "qwen2", "gemma2"])
def test_scores_equal_mlx_lm_s_forward_across_head_chunks(arch):
    model = tiny_model(arch)
    ids = np.random.default_rng(1).integers(0, VOCAB, size=2 * SCORE_CHUNK + 7)
    want = _reference(model, ids)
    got = prompt_logprobs(model, ids, 3, VOCAB)
    assert len(got) == ids.size - 1
    for i, scored in enumerate(got, start=1):
        assert scored.id == ids[i]
        assert scored.logprob == pytest.approx(want[i - 1, ids[i]], abs=1e-4)
        best = np.sort(want[i - 1])[::-1][:3]  # the three best values, best first
        assert [lp for _, lp in scored.top] == pytest.approx(list(best), abs=1e-4)
        assert all(want[i - 1, t] == pytest.approx(lp, abs=1e-4) for t, lp in scored.top)


def test_alternatives_stay_below_the_vocabulary_size(monkeypatch):
    model = tiny_model("llama-untied")
    monkeypatch.setattr(prompt_scoring, "SCORE_CHUNK", 5)
    ids = np.arange(20) % VOCAB
    got = prompt_logprobs(model, ids, 20, 16)  # a head "padded" past id 15
    assert all(t < 16 for s in got for t, _ in s.top)
    assert [s.logprob for s in got] == pytest.approx(
        [s.logprob for s in prompt_logprobs(model, ids, 0, VOCAB)], abs=1e-6)


def test_one_id_scores_nothing_and_no_ids_is_refused():
    model = tiny_model("llama")
    assert prompt_logprobs(model, [3], 2, VOCAB) == []
    with pytest.raises(ArgumentError, match="at least one token"):
        prompt_logprobs(model, [], 2, VOCAB)


def test_a_scorer_reuses_a_shared_prefix_and_scores_as_a_fresh_scoring_does():
    """Continuations of one context, a repeated prompt, a prefix of the last one, another
    alternatives count and an unrelated prompt: every score equals a fresh scoring's, and only
    the rows past the shared prefix are computed."""
    model = tiny_model("qwen2")
    rng = np.random.default_rng(3)
    context = list(rng.integers(0, VOCAB, size=SCORE_CHUNK + 30))
    scorer = PromptScorer(model, VOCAB)
    prompts = [context + [5, 6, 7], context + [9, 10], context + [9, 10], context[:40],
               context + [9, 11, 12], list(rng.integers(0, VOCAB, size=20))]
    tops = [2, 2, 2, 2, 4, 4]
    computed = []
    for ids, top in zip(prompts, tops, strict=True):
        before = scorer.computed
        got = scorer.score(ids, top)
        computed.append(scorer.computed - before)
        want = prompt_logprobs(model, ids, top, VOCAB)
        assert [s.id for s in got] == [s.id for s in want]
        assert [s.logprob for s in got] == pytest.approx([s.logprob for s in want], abs=1e-5)
        assert [len(s.top) for s in got] == [top] * len(want)
        for g, w in zip(got, want, strict=True):
            assert [lp for _, lp in g.top] == pytest.approx([lp for _, lp in w.top], abs=1e-5)
    n = len(context)
    # fresh; the rows from the context's last one; none; none (a prefix); another top: all; new
    assert computed == [n + 2, 2, 0, 0, n + 2, 19]


def test_a_scorer_lends_the_rows_of_its_last_prompt():
    model = tiny_model("llama")
    scorer = PromptScorer(model, VOCAB)
    prompt = list(range(10, 40))
    assert scorer.cache is None and scorer.rows_for(prompt) == 0
    scorer.score(prompt, 1)
    assert scorer.cache is not None and scorer.cache.n_past == len(prompt) - 1
    assert list(scorer.cache.tokens[:scorer.cache.n_past]) == prompt[:-1]
    assert scorer.rows_for(prompt) == len(prompt) - 1
    assert scorer.rows_for(prompt + [7, 8]) == len(prompt) - 1
    assert scorer.rows_for(prompt[:12]) == 11  # all but the last of a shorter prompt
    assert scorer.rows_for(prompt[:5] + [99] + prompt[6:]) == 5
    assert scorer.rows_for([1, 2, 3]) == 0
