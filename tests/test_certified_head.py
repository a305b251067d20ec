"""The certified head: its bound holds on every row, a certified top is the full projection's,
near ties are refused rather than guessed, and greedy decoding through it gives the same ids as
the full projection (the default model, and tiny random llamas whose logits are close)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from tiny_models import tiny_model

import nexus_mlx.decode.certified_head as certified_head_module
from nexus_mlx.decode.certified_head import CertifiedHead
from nexus_mlx.decode.generate import GenerationStats, generate_tokens
from nexus_mlx.kernels.int8_scan import native_scan
from nexus_mlx.models.forward import forward_hidden, lm_head, make_cache

pytestmark = pytest.mark.skipif(native_scan() is None, reason="no native INT8 scan here")
SMALL_HEAD = 4096 * 64  # the tiny models' heads: built here, far under the library's threshold
MIN_VOCAB = 4096


@pytest.fixture(autouse=True)
def small_heads(monkeypatch):
    """Build heads for tiny models (and the default model's) in these tests."""
    monkeypatch.setattr(certified_head_module, "MIN_HEAD_WEIGHTS", SMALL_HEAD)


def tiny_llama(vocab: int = 8192, tied: bool = False, seed: int = 0):
    return tiny_model("llama" if tied else "llama-untied", seed, vocab_size=vocab)


def _hidden_states(model, n: int, seed: int) -> mx.array:
    """``(1, n, hidden)`` last-layer states of n random tokens (before the final norm)."""
    ids = np.random.default_rng(seed).integers(0, model.args.vocab_size, n)
    return forward_hidden(model, ids.tolist(), make_cache(model))


def _set_head(model, weight: np.ndarray) -> None:
    model.lm_head.weight = mx.array(weight)
    mx.eval(model.lm_head.weight)


@pytest.mark.parametrize("outliers", [False, True])
def test_the_bound_is_above_every_rows_logit(outliers):
    # a head with a few huge columns and hidden states with a few huge dims: the INT8 codes of
    # both are then coarse, which is where a loose derivation would fail
    model = tiny_llama()
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((MIN_VOCAB * 2, 64)).astype(np.float32) * 0.05
    if outliers:
        weight[:, :3] *= 40
        model.model.norm.weight = mx.array(np.where(np.arange(64) < 2, 60.0, 1.0), mx.float32)
    _set_head(model, weight)
    head = CertifiedHead.of(model)
    states = _hidden_states(model, 24, seed=2)
    for t in range(states.shape[1]):
        normed = model.model.norm(states[:, t : t + 1])
        x = np.asarray(normed.astype(mx.float32)).reshape(-1)
        exact = weight.astype(np.float64) @ x.astype(np.float64)
        assert np.all(head._upper_bounds(x) >= exact), t


def test_a_certified_top_is_the_full_projections():
    model = tiny_llama(seed=3)
    head = CertifiedHead.of(model)
    states = _hidden_states(model, 48, seed=4)
    for t in range(states.shape[1]):
        hidden = states[:, t : t + 1]
        top = head.top(hidden, n=2)
        if top is None:
            continue
        full = np.asarray(lm_head(model, hidden)[0, 0])
        assert list(top.ids) == list(np.argsort(-full)[:2])
        np.testing.assert_allclose(top.logits, full[top.ids], atol=1e-4)
    assert head.stats.certified + head.stats.refused == states.shape[1]


def test_a_tie_is_refused_not_guessed():
    model = tiny_llama()
    weight = np.random.default_rng(5).standard_normal((MIN_VOCAB, 64)).astype(np.float32)
    weight[7] = weight[3] = 4 * np.abs(weight[3])  # two equal rows: every logit ties
    _set_head(model, weight)
    head = CertifiedHead.of(model)
    hidden = mx.array(np.abs(np.random.default_rng(6).standard_normal((1, 1, 64))), mx.float32)
    model.model.norm.weight = mx.ones((64,))  # the normed state stays positive: rows 3/7 lead
    assert head.top(hidden) is None and head.stats.refused == 1
    assert head.top(mx.full((1, 1, 64), float("nan"))) is None  # refused, not an error


def test_where_a_head_is_not_built(monkeypatch):
    small = tiny_llama(vocab=MIN_VOCAB - 1)
    assert CertifiedHead.of(small) is None  # under the threshold
    half = tiny_llama()
    half.lm_head.weight = half.lm_head.weight.astype(mx.bfloat16)
    assert CertifiedHead.of(half) is None  # its full projection rounds in bfloat16
    model = tiny_llama()
    first = CertifiedHead.of(model)
    assert CertifiedHead.of(model) is first  # built once
    _set_head(model, np.asarray(model.lm_head.weight) * 2)
    assert CertifiedHead.of(model) is not first  # its weight was replaced
    tied = tiny_llama(tied=True)
    assert CertifiedHead.of(tied).weight.shape == tuple(tied.model.embed_tokens.weight.shape)
    monkeypatch.undo()
    assert CertifiedHead.of(tiny_llama(seed=9)) is None  # the library's own threshold


@pytest.mark.parametrize("seed", [0, 7])
def test_greedy_ids_are_the_full_projections_on_a_random_model(seed):
    # random weights make close logits: the head refuses many steps, and must never pick wrong
    model = tiny_llama(seed=seed)
    prompt = np.random.default_rng(seed).integers(0, 8192, 12).tolist()
    stats = GenerationStats()
    fast = list(generate_tokens(model, prompt, make_cache(model), max_tokens=24, stats=stats))
    full = list(generate_tokens(model, prompt, make_cache(model), max_tokens=24,
                                certified_head=False))
    assert fast == full
    assert stats.certified_tokens <= stats.generated_tokens == 24


def test_greedy_ids_are_the_full_projections_on_the_default_model(default_model):
    model, tokenizer = default_model
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name three prime numbers and say why they are prime."}],
        add_generation_prompt=True)
    stats = GenerationStats()
    cache = make_cache(model)
    fast = list(generate_tokens(model, prompt, cache, max_tokens=40, stats=stats))
    full_cache = make_cache(model)
    full = list(generate_tokens(model, prompt, full_cache, max_tokens=40, certified_head=False))
    assert fast == full
    assert stats.certified_tokens >= 30  # a real model's next id is mostly clear
    assert cache.n_past == full_cache.n_past == len(prompt) + len(fast) - 1


TIME_TOOL = {"type": "function", "function": {
    "name": "get_current_time", "description": "The current time in an IANA timezone",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string"},
                                                    "format": {"type": "string"}},
                   "required": ["timezone"]}}}
NOTES = [{"role": "system", "content": "You are a helpful assistant."},
         {"role": "user", "content": "Here is a note about rivers. " * 20},
         {"role": "user", "content": "And one about mountains. " * 20}]


def _turns(session):
    """A free-text answer, the same after a repaired deletion (stale rows: the guard's
    margin), a forced call (schema-constrained, with an optional member), a JSON reply under a
    response_format."""
    ask = [{"role": "user", "content": "What time is it in Tokyo? Then name a river."}]
    shaped = {"type": "json_schema", "json_schema": {"schema": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    return [
        session.generate([*NOTES, *ask], max_tokens=24),
        session.generate([*NOTES[:1], *NOTES[2:], *ask], max_tokens=24),
        session.generate(ask, [TIME_TOOL], tool_choice="required", max_tokens=40),
        session.generate(ask, response_format=shaped, max_tokens=24),
    ]


def test_session_replies_are_the_full_projections(default_model):
    from nexus_mlx.agent.session import Session

    model, tokenizer = default_model
    head = CertifiedHead.of(model)
    before = (head.stats.certified, head.stats.refused)
    # a narrow guard: the repaired turn decodes over stale rows (a wide one heals them first)
    fast = _turns(Session(model, tokenizer, guard=0.05))
    full = _turns(Session(model, tokenizer, guard=0.05, certified_head=False))
    assert [r.tokens for r in fast] == [r.tokens for r in full]
    assert [r.guarded for r in fast] == [r.guarded for r in full]
    assert fast[1].report.path == "repair" and fast[1].report.stale and fast[2].tool_calls
    # forced ids (a call's opener, JSON the grammar fixes) read no row; most rows read certify
    certified, refused = head.stats.certified - before[0], head.stats.refused - before[1]
    assert certified > 4 * refused and certified >= 20


def test_a_mask_narrower_than_the_head_allows_none_of_the_ids_past_it():
    # a tokenizer's vocabulary may be narrower than the head (Qwen: 151,665 of 151,936 rows)
    model = tiny_llama(seed=3)
    head = CertifiedHead.of(model)
    hidden = _hidden_states(model, 6, seed=3)
    logits = np.asarray(lm_head(model, hidden)[0])
    for i in range(6):
        row = hidden[:, i: i + 1]
        narrow = np.ones(MIN_VOCAB, dtype=bool)
        top = head.top(row, 1, narrow)
        if top is not None:
            assert int(top.ids[0]) == int(np.argmax(logits[i, :MIN_VOCAB]))
        assert head.top(row, 1, np.zeros(MIN_VOCAB, dtype=bool)) is None  # nothing allowed


@pytest.mark.parametrize("draft_tokens", [0, 3])
def test_tool_calls_are_the_full_projections_on_the_default_model(default_model, github_tools_file,
                                                                  draft_tokens):
    """The name FSM over several tools, the schema-constrained arguments (with the optional
    members' restraint, which reads full logits) and copy drafts: the same call, certified."""
    from nexus_mlx.decode.tool_call import call_tool
    from nexus_mlx.tools.registry import load_tools

    model, tokenizer = default_model
    github = load_tools(github_tools_file)
    tools = [github.get(n) for n in ("create_repository", "list_issues", "get_me")]
    request = "List the open issues of the repository octocat/hello-world"
    fast = call_tool(model, tokenizer, request, tools, draft_tokens=draft_tokens)
    full = call_tool(model, tokenizer, request, tools, draft_tokens=draft_tokens,
                     certified_head=False)
    assert (fast.tokens, fast.text, fast.name) == (full.tokens, full.text, full.name)
    assert full.certified_tokens == 0 < fast.certified_tokens <= fast.sampled_tokens


def test_a_constrained_steps_top_is_the_masked_argmax():
    # only allowed rows compete: a sparse mask (fewer ids than the candidates) is certified
    # whenever its best is clear, whatever the disallowed rows' bounds
    model = tiny_llama(seed=4)
    head = CertifiedHead.of(model)
    hidden = _hidden_states(model, 8, seed=4)
    logits = np.asarray(lm_head(model, hidden)[0])
    rng = np.random.default_rng(4)
    certified = 0
    for i in range(8):
        for density in (0.005, 0.2):
            allowed = rng.random(8192) < density
            top = head.top(hidden[:, i: i + 1], 1, allowed)
            if top is not None:
                assert int(top.ids[0]) == int(np.argmax(np.where(allowed, logits[i], -np.inf)))
                certified += 1
    assert certified >= 8  # at least the sparse masks
