"""SUR and its four controls: exact budgets for every budget and suffix, whole-unit admission,
query preference, BM25 against hand-computed values, relevance, and end-to-end repair.
A tiny random-weight model whose vocabulary is the real default tokenizer's."""

from __future__ import annotations

import math

import mlx.nn as nn
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nexus_mlx.errors import ArgumentError, TokenError
from nexus_mlx.models.forward import forward, make_cache
from nexus_mlx.models.tokenizer import token_char_spans
from nexus_mlx.refresh import Edit, budget_tokens, repair, shift
from nexus_mlx.refresh.allocators import (
    AllocationRequest,
    checked_selection,
    get_allocator,
    top_k_positions,
)
from nexus_mlx.refresh.allocators.semantic import bm25, terms
from nexus_mlx.sur.relevance import embedding_rows, token_relevance
from nexus_mlx.sur.select import (
    SEAM_ROWS,
    best_window,
    decay_envelope,
    rank,
    unit_means,
    unit_scores,
    with_seam,
)
from nexus_mlx.sur.units import units_from_text

NAMES = ("sur", "dense_tokens", "single_window", "bm25_units", "random_units")
TEXT_ALLOCATORS = ("sur", "bm25_units", "random_units")
PARTS = [
    "A sentence about rivers. ", "Another one about mountains!\n", "\n\n", "<|im_start|>user\n",
    "<|im_end|>\n", "```python\nx = 1\n```\n", '{"k": [1, 2], "v": "s, t"}\n', "- item\n",
    "# Title\n", "日本語。", "😀 ", "word " * 30, "The vault key is under the blue mat. ",
]
DOC = (
    "<|im_start|>user\nPlease read the notes below and keep them in mind.<|im_end|>\n"
    "<|im_start|>assistant\nSure. Here are the notes from the trip:\n"
    "- We left early on Monday morning.\n- It rained for most of the afternoon.\n\n"
    "The hotel was near the station. Breakfast was served at seven every day.\n\n"
    "```python\ndef total(xs):\n    return sum(xs)\n```\n"
    "The vault key is under the blue mat. Nobody else knows about it.\n"
    '{"city": "Lyon", "nights": 3, "rating": [4, 5, 4]}\n'
    "We came back on Thursday, tired but happy.<|im_end|>\n"
)
QUERY = "Where is the vault key?"


@pytest.fixture(scope="module")
def model(tiny):
    """The tiny real-vocabulary llama of ``conftest.py``."""
    return tiny


def filled(model, ids):
    cache = make_cache(model)
    forward(model, np.asarray(ids), cache, logits="last")
    cache.evaluate()
    return cache


def request(model, tok, text, p0, p1, budget_pct, query=QUERY, seed=0):
    ids = tok.encode(text, add_special_tokens=False)
    cache = filled(model, ids)
    edit = Edit(p0, p1)
    shifted = shift(cache, edit)
    q = np.array(tok.encode(query, add_special_tokens=False))
    b = budget_tokens(shifted.n_past - p0, budget_pct)
    return AllocationRequest(model, cache, shifted, edit, q, b, tok, seed)


def with_budget(req, b, **options):
    return AllocationRequest(req.model, req.dirty, req.shifted, req.edit, req.query_tokens, b,
                             req.tokenizer, req.seed, {**req.options, **options})


def paper_rule(req, b):
    """``req`` at budget ``b`` with no seam: SUR exactly as paper 2 states it."""
    return with_budget(req, b, seam=0)


def units_of(req):
    return units_from_text(*token_char_spans(req.tokenizer, req.suffix_tokens))


# ----------------------------------------------------------------------------- exact budgets


def test_every_budget_is_exact(model, default_tokenizer):
    req = request(model, default_tokenizer, DOC, 2, 12, 0)
    s = req.suffix_length
    for name in NAMES:
        allocate = get_allocator(name)
        for b in range(s + 1):
            checked_selection(allocate(with_budget(req, b)), s, b, name)


@settings(max_examples=20, deadline=None)
@given(parts=st.lists(st.sampled_from(PARTS), min_size=1, max_size=12),
       edit=st.tuples(st.integers(0, 400), st.integers(1, 40)),
       pct=st.floats(0, 100), seed=st.integers(0, 2**31))
def test_exact_budget_any_suffix(model, default_tokenizer, parts, edit, pct, seed):
    ids = default_tokenizer.encode("".join(parts), add_special_tokens=False)
    if len(ids) < 2:
        return
    p0 = edit[0] % (len(ids) - 1)
    p1 = min(len(ids), p0 + edit[1])
    req = request(model, default_tokenizer, "".join(parts), p0, p1, pct, seed=seed)
    for name in NAMES:
        got = checked_selection(get_allocator(name)(req), req.suffix_length, req.budget, name)
        assert got.size == req.budget


# ----------------------------------------------------------------------------- SUR


def is_whole_units_plus_one_window(selection, units) -> bool:
    chosen = set(selection.tolist())
    partial = 0
    for a, b in units:
        inside = [t for t in range(a, b) if t in chosen]
        if 0 < len(inside) < b - a:
            partial += 1
            if inside != list(range(inside[0], inside[0] + len(inside))):
                return False
    return partial <= 1


def test_sur_admits_whole_units_and_prefers_the_query_unit(model, default_tokenizer):
    req = request(model, default_tokenizer, DOC, 2, 12, 0)
    units = units_of(req)
    pieces = [default_tokenizer.decode(req.suffix_tokens[a:b].tolist()) for a, b in units]
    target = next(k for k, p in enumerate(pieces) if "vault key" in p)
    r = token_relevance(model, req.suffix_tokens, req.query_tokens)
    assert rank(unit_scores(r, units))[0] == target
    a, b = units.ranges[target]
    sur = get_allocator("sur")
    assert sur(paper_rule(req, b - a)).tolist() == list(range(a, b))
    inside = sur(paper_rule(req, 3))  # smaller than the unit: a window inside it
    assert a <= inside[0] and inside[-1] < b and np.all(np.diff(inside) == 1)
    for budget in range(0, req.suffix_length + 1, 7):
        assert is_whole_units_plus_one_window(sur(paper_rule(req, budget)), units)
        seamed, _ = with_seam(units, min(SEAM_ROWS, budget))
        assert is_whole_units_plus_one_window(sur(with_budget(req, budget)), seamed)


def test_sur_seam_comes_right_after_the_best_unit(model, default_tokenizer):
    req = request(model, default_tokenizer, DOC, 2, 12, 0)
    units = units_of(req)
    r = token_relevance(model, req.suffix_tokens, req.query_tokens)
    a, b = units.ranges[rank(unit_scores(r, units), unit_means(r, units))[0]]
    assert a >= SEAM_ROWS  # the best unit lies away from the edit
    sur = get_allocator("sur")
    best = list(range(a, b))
    assert sur(with_budget(req, b - a)).tolist() == best  # the best unit first, whole
    assert sur(with_budget(req, 3)).tolist() == sur(paper_rule(req, 3)).tolist()
    for seam in (1, SEAM_ROWS, 9):
        got = sur(with_budget(req, b - a + seam, seam=seam)).tolist()
        assert got == sorted([*range(seam), *best])  # then the rows right after the edit
    more = sur(with_budget(req, b - a + SEAM_ROWS + 5)).tolist()
    assert set(range(SEAM_ROWS)) | set(best) <= set(more) and len(more) == b - a + SEAM_ROWS + 5


def test_with_seam_cuts_the_units_it_overlaps():
    from nexus_mlx.sur.units import Units

    units = Units([(0, 2), (2, 10), (10, 15)], [0, 1, 2])
    same, origin = with_seam(units, 0)
    assert same is units and origin.tolist() == [0, 1, 2]
    cut, origin = with_seam(units, 4)
    assert cut.ranges == [(0, 4), (4, 10), (10, 15)] and origin.tolist() == [0, 1, 2]
    cut, origin = with_seam(units, 2)
    assert cut.ranges == [(0, 2), (2, 10), (10, 15)] and origin.tolist() == [0, 1, 2]
    cut, origin = with_seam(units, 12)
    assert cut.ranges == [(0, 12), (12, 15)] and cut.containers == [0, 2]
    assert origin.tolist() == [0, 2]


def test_sur_seam_inside_the_best_unit_is_that_unit(model, default_tokenizer):
    # the question right after the edit: the seam cuts the best unit, which still ranks first
    # and is admitted whole, seam included, as the paper's rule would
    text = ("Intro line.\n\nWhere is the vault key? Tell me where the vault key is.\n\n"
            + "Some other words about the weather and the trip.\n\n" * 3)
    req = request(model, default_tokenizer, text, 1, 3, 0)
    units = units_of(req)
    r = token_relevance(model, req.suffix_tokens, req.query_tokens)
    best = rank(unit_scores(r, units), unit_means(r, units))[0]
    a, b = units.ranges[best]
    assert a < SEAM_ROWS < b  # the case this test is about
    sur = get_allocator("sur")
    for budget in (b - a, b - a + 5):
        assert sur(with_budget(req, budget)).tolist() == sur(paper_rule(req, budget)).tolist()


@pytest.mark.parametrize("seam", [-1, 1.5, True, "4", None])
def test_bad_seam_is_rejected_before_any_work(model, default_tokenizer, seam):
    text = DOC
    ids = default_tokenizer.encode(text, add_special_tokens=False)
    cache = filled(model, ids)
    before = cache.copy()
    with pytest.raises(ArgumentError, match="seam must be a non-negative int"):
        repair(model, cache, Edit(2, 12), QUERY, 20.0, "sur", tokenizer=default_tokenizer,
               in_place=True, seam=seam)
    assert np.array_equal(cache.tokens, before.tokens) and cache.n_past == before.n_past


def test_saturated_units_tie_to_the_one_most_about_the_query(model, default_tokenizer):
    # Every paragraph holds four query tokens ("the", "of", ...): top-4 means all saturate at
    # 1.25, and the question itself (last) wins on its mean relevance, not the first paragraph.
    doc = ("The history of the town is long, and the people of the town are proud of it.\n\n"
           "The river of the valley runs past the mill, and the name of the mill is old.\n\n"
           "Which is the name of the mill in the valley?")
    query = "Which is the name of the mill in the valley?"
    req = request(model, default_tokenizer, "Intro.\n\n" + doc, 1, 3, 0, query=query)
    units = units_of(req)
    r = token_relevance(model, req.suffix_tokens, req.query_tokens)
    scores = unit_scores(r, units)
    assert np.count_nonzero(scores == 1.25) >= 2  # the saturation this rule exists for
    last = len(units.ranges) - 1
    assert rank(scores)[0] != last  # by position alone the question would lose
    assert rank(scores, unit_means(r, units))[0] == last
    a, b = units.ranges[last]
    assert get_allocator("sur")(with_budget(req, b - a)).tolist() == list(range(a, b))


def test_rank_tiebreak():
    scores, tiebreak = np.array([1.0, 2.0, 2.0, 2.0]), np.array([9.0, 0.0, 5.0, 5.0])
    assert rank(scores, tiebreak).tolist() == [2, 3, 1, 0]
    assert rank(np.array([1.0, 1.0])).tolist() == [0, 1]


def test_sur_window_follows_the_decay_envelope(model, default_tokenizer):
    req = request(model, default_tokenizer, DOC, 2, 12, 0)
    units = units_of(req)
    r = token_relevance(model, req.suffix_tokens, req.query_tokens)
    order = rank(unit_scores(r, units), unit_means(r, units))
    first = units.ranges[order[0]]
    a, b = units.ranges[order[1]]
    w = 4
    got = get_allocator("sur")(paper_rule(req, first[1] - first[0] + w))
    start = a + best_window(decay_envelope(r[a:b]), w)
    assert got.tolist() == sorted([*range(*first), *range(start, start + w)])


def test_envelope_and_window_by_hand():
    u = decay_envelope(np.array([1.0, 0.0, 0.0, 1.0]))
    d = math.exp(-1 / 16)
    assert np.allclose(u, [1.0, d, d * d, 1.0])
    assert np.allclose(decay_envelope(np.array([0.0, 2.0])), [math.exp(-2), 1.0])
    assert best_window(np.array([1.0, 3.0, 0.0, 3.0, 1.0]), 2) == 0  # 4, 3, 3, 4: earliest
    assert best_window(np.array([0.0, 0.0, 5.0]), 1) == 2
    with pytest.raises(ValueError, match="window width 4"):
        best_window(np.zeros(3), 4)


# ----------------------------------------------------------------------------- the controls


def test_dense_tokens_and_single_window(model, default_tokenizer):
    req = request(model, default_tokenizer, DOC, 2, 12, 10)
    r = token_relevance(model, req.suffix_tokens, req.query_tokens)
    assert get_allocator("dense_tokens")(req).tolist() == top_k_positions(r, req.budget).tolist()
    window = get_allocator("single_window")(req)
    b = req.budget
    assert np.all(np.diff(window) == 1)
    sums = [r[s : s + b].sum() for s in range(req.suffix_length - b + 1)]
    assert math.isclose(r[window].sum(), max(sums), rel_tol=1e-12)


def test_terms_and_bm25_by_hand():
    assert terms("Hello, WORLD_42 café x-ray") == ["hello", "world", "42", "caf", "x", "ray"]
    docs = [["a", "b", "a"], ["b", "c"], ["d"]]
    # N = 3, avgdl = 2; idf(a) = ln(1 + 2.5 / 1.5), idf(b) = ln(1 + 1.5 / 2.5)
    # doc 0: dl = 3, K = 1.2 (0.25 + 0.75 * 1.5) = 1.65
    #   a: tf 2 -> 2 * 2.2 / 3.65; b: tf 1 -> 2.2 / 2.65
    # doc 1: dl = 2, K = 1.2; b: tf 1 -> 2.2 / 2.2 = 1
    expected = [0.980829 * 1.205479 + 0.470004 * 0.830189, 0.470004, 0.0]
    got = bm25(docs, ["a", "b", "b", "zzz"])  # repeated / unseen query terms count once / zero
    assert np.allclose(got, expected, atol=1e-5)
    assert math.isclose(got[0], 1.572565, abs_tol=1e-5)
    assert bm25([[], []], ["a"]).tolist() == [0.0, 0.0] and bm25([], ["a"]).size == 0


def test_bm25_units_take_the_matching_unit_first(model, default_tokenizer):
    req = request(model, default_tokenizer, DOC, 2, 12, 0)
    units = units_of(req)
    pieces = [default_tokenizer.decode(req.suffix_tokens[a:b].tolist()) for a, b in units]
    target = next(k for k, p in enumerate(pieces) if "vault key" in p)
    a, b = units.ranges[target]
    allocate = get_allocator("bm25_units")
    assert allocate(with_budget(req, b - a)).tolist() == list(range(a, b))
    assert allocate(with_budget(req, 2)).tolist() == [a, a + 1]  # prefix fill


def test_random_units_follow_the_seed(model, default_tokenizer):
    req = request(model, default_tokenizer, DOC, 2, 12, 30, seed=7)
    allocate = get_allocator("random_units")
    one = allocate(req)
    assert allocate(req).tolist() == one.tolist()
    again = [allocate(AllocationRequest(req.model, req.dirty, req.shifted, req.edit,
                                        req.query_tokens, req.budget, req.tokenizer, s))
             for s in range(5)]
    assert any(x.tolist() != one.tolist() for x in again)
    assert is_whole_units_plus_one_window(one, units_of(req))


def test_text_allocators_need_a_tokenizer(model, default_tokenizer):
    req = request(model, default_tokenizer, DOC, 2, 12, 10)
    bare = AllocationRequest(model, req.dirty, req.shifted, req.edit, req.query_tokens, req.budget)
    for name in TEXT_ALLOCATORS:
        with pytest.raises(ArgumentError, match=f"{name}.*tokenizer="):
            get_allocator(name)(bare)
    for name in ("dense_tokens", "single_window"):
        assert get_allocator(name)(bare).size == req.budget


# ----------------------------------------------------------------------------- relevance


def test_relevance_formula_blocks_and_quantized_table(model):
    rng = np.random.default_rng(0)
    suffix, query = rng.integers(0, 49152, 50), np.array([7, 11, 7, 3000])
    suffix[[3, 20]] = [11, 3000]
    table = np.array(model.model.embed_tokens.weight)
    unit = table / np.linalg.norm(table, axis=1, keepdims=True)
    expected = (unit[suffix] @ unit[query].T).max(axis=1) + 0.25 * np.isin(suffix, query)
    r = token_relevance(model, suffix, query)
    assert np.allclose(r, expected, atol=1e-6)
    assert r[3] == r[20] == 1.25  # a query token matches itself exactly, not to fp32 rounding
    assert r.max() <= 1.25
    # blocked GEMMs may round the last bit differently (BLAS edge tiles): equal to fp32 precision
    assert np.allclose(token_relevance(model, suffix, query, block=7), r, rtol=0, atol=1e-6)
    quantized = nn.QuantizedEmbedding.from_embedding(model.model.embed_tokens, group_size=64, bits=8)
    holder = type("Holder", (), {})()
    holder.model = type("Inner", (), {"embed_tokens": quantized})()
    rows = embedding_rows(holder, suffix)
    assert rows.dtype == np.float32 and np.allclose(rows, table[suffix], atol=0.02)
    assert np.allclose(token_relevance(holder, suffix, query), r, atol=0.02)
    with pytest.raises(TokenError, match="query token id 49152"):
        token_relevance(model, suffix, [49152])
    with pytest.raises(TokenError, match="at least one query token"):
        token_relevance(model, suffix, [])


# ----------------------------------------------------------------------------- end to end


@pytest.mark.parametrize("name", NAMES)
def test_repair_runs_end_to_end(model, default_tokenizer, name):
    ids = default_tokenizer.encode(DOC, add_special_tokens=False)
    cache = filled(model, ids)
    result = repair(model, cache, Edit(20, 40), QUERY, budget=10, allocator=name, tokenizer=default_tokenizer)
    s = len(ids) - 40
    assert result.suffix_length == s and result.budget_tokens == math.ceil(s / 10)
    assert result.selected.size == result.budget_tokens and result.cache.n_past == len(ids) - 20
