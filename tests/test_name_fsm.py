"""Tool-name trie FSM on the 117 GitHub MCP tool names with the default model's real tokenizer."""

from __future__ import annotations

import random

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nexus_mlx.decode.name_fsm import NameFSM, TokenVocab, vocab_of
from nexus_mlx.decode.tool_call import NAME_GLUE
from nexus_mlx.errors import ToolError
from nexus_mlx.tools.registry import load_tools

TERMINATORS = ('"', NAME_GLUE)


@pytest.fixture(scope="session")
def vocab(default_tokenizer) -> TokenVocab:
    return vocab_of(default_tokenizer)


@pytest.fixture(scope="session")
def names(github_tools_file) -> list[str]:
    return load_tools(github_tools_file).names()


@pytest.fixture(scope="session", params=TERMINATORS, ids=["quote", "glue"])
def fsm(request, names, vocab) -> NameFSM:
    return NameFSM(names, vocab, terminator=request.param)


def _targets(fsm: NameFSM) -> list[bytes]:
    return [(n + fsm.terminator).encode() for n in fsm.names]


def _prefix_set(fsm: NameFSM) -> set[bytes]:
    return {t[:k] for t in _targets(fsm) for k in range(len(t) + 1)}


def test_vocab_bytes_match_llguidance(default_tokenizer, vocab):
    """Our byte view of every token equals llguidance's (the JSON phase sees the same text)."""
    from nexus_mlx.decode.json_constraint import ll_tokenizer

    ll = ll_tokenizer(default_tokenizer)
    assert vocab.size == ll.vocab_size == 49152
    assert vocab.eos_ids == (0, 2) and 2 in vocab.special_ids
    normal = [i for i in range(vocab.size) if i not in vocab.special_ids]
    assert all(vocab.token_bytes[i] == ll.decode_bytes([i]) for i in normal)
    assert vocab_of(default_tokenizer) is vocab  # cached per tokenizer object


def test_every_name_accepted_in_canonical_tokenization(fsm, default_tokenizer):
    """Each name, tokenized as it appears after ``{"name": "``, walks to completion."""
    prefix = default_tokenizer.encode('{"name": "', add_special_tokens=False)
    for name in fsm.names:
        ids = default_tokenizer.encode('{"name": "' + name + fsm.terminator, add_special_tokens=False)
        assert ids[: len(prefix)] == prefix
        fsm.reset()
        for token in ids[len(prefix):]:
            assert fsm.allowed_mask()[token], (name, token)
            assert not fsm.is_complete()
            assert fsm.accept_token(token)
        assert fsm.is_complete() and fsm.matched_name() == name
        assert not fsm.allowed_mask().any()  # nothing after completion
    fsm.reset()


def test_every_name_accepted_in_other_splits(fsm, vocab):
    """Byte by byte, and random splits into vocabulary tokens: the trie is over bytes."""
    rng = random.Random(0)
    for name in fsm.names:
        target = (name + fsm.terminator).encode()
        for split in ("bytes", "random"):
            fsm.reset()
            pos = 0
            while pos < len(target):
                if split == "bytes":
                    step = 1
                else:
                    options = [k for k in range(1, len(target) - pos + 1)
                               if target[pos: pos + k] in vocab.by_bytes]
                    step = rng.choice(options)
                token = vocab.by_bytes[target[pos: pos + step]][0]
                assert fsm.accept_token(token)
                pos += step
            assert fsm.matched_name() == name
    fsm.reset()


def test_mask_equals_brute_force(fsm, vocab):
    """At the root and along random partial names, a token is allowed iff prefix + its bytes is
    still a prefix of some name + terminator (checked over the whole vocabulary)."""
    prefixes = _prefix_set(fsm)
    targets = _targets(fsm)
    rng = random.Random(1)
    states = [b""] + [t[: rng.randrange(1, len(t))] for t in rng.sample(targets, 12)]
    states += [t[: len(t) - len(fsm.terminator)] for t in targets[:3]]  # full name, no terminator
    for state in states:
        fsm.reset()
        pos = 0
        while pos < len(state):  # reach the state byte by byte
            assert fsm.accept_token(vocab.by_bytes[state[pos: pos + 1]][0])
            pos += 1
        expected = np.array([bool(b) and (state + b) in prefixes for b in vocab.token_bytes])
        expected[list(vocab.special_ids)] = False
        assert np.array_equal(fsm.allowed_mask(), expected), state
        for token in rng.sample(range(vocab.size), 200):
            before = (fsm.prefix, list(fsm.tokens))
            ok = fsm.accept_token(token)
            assert ok == bool(expected[token])
            if ok:
                fsm.reset()
                fsm.accept_tokens([vocab.by_bytes[state[k: k + 1]][0] for k in range(len(state))])
            else:  # a rejected token leaves the state as it was
                assert (fsm.prefix, list(fsm.tokens)) == before
    fsm.reset()


def test_rejections_leave_state_unchanged(names, vocab, default_tokenizer):
    fsm = NameFSM(names, vocab)
    assert fsm.accept_tokens(default_tokenizer.encode("create", add_special_tokens=False)) > 0
    before = (fsm.prefix, list(fsm.tokens), fsm.allowed_mask().copy(), fsm.candidates())
    for bad in [*vocab.special_ids, vocab.by_bytes[b"xyz"][0], -1, vocab.size,
                vocab.by_bytes[b'"'][0]]:
        assert not fsm.accept_token(bad)
        assert (fsm.prefix, list(fsm.tokens)) == before[:2]
        assert np.array_equal(fsm.allowed_mask(), before[2]) and fsm.candidates() == before[3]
    assert not fsm.allowed_mask()[list(vocab.special_ids)].any()


def test_name_that_prefixes_another_needs_the_terminator(vocab):
    fsm = NameFSM(["get_issue", "get_issue_comments"], vocab)
    fsm.accept_tokens([vocab.by_bytes[b"get"][0], vocab.by_bytes[b"_"][0],
                       vocab.by_bytes[b"issue"][0]])
    assert not fsm.is_complete() and fsm.matched_name() is None
    assert fsm.candidates() == ["get_issue", "get_issue_comments"] and fsm.remaining() is None
    allowed = {vocab.token_bytes[t] for t in fsm.allowed_tokens()}
    assert {b'"', b"_"} <= allowed
    assert fsm.accept_token(vocab.by_bytes[b'"'][0])
    assert fsm.matched_name() == "get_issue"


def test_remaining_names_the_single_candidate(vocab):
    fsm = NameFSM(["list_issues", "list_tags", "get_me"], vocab)
    fsm.accept_token(vocab.by_bytes[b"list"][0])
    assert fsm.remaining() is None
    fsm.accept_token(vocab.by_bytes[b"_"][0])
    fsm.accept_token(vocab.by_bytes[b"t"][0])
    assert fsm.remaining() == b'ags"'


@pytest.mark.parametrize("bad", [[], ["a", "a"]])
def test_bad_name_lists_raise(vocab, bad):
    with pytest.raises(ToolError):
        NameFSM(bad, vocab)


def test_ambiguous_terminator_raises(vocab):
    with pytest.raises(ToolError, match="prefix"):
        NameFSM(["a", 'a"b'], vocab, terminator='"')
    with pytest.raises(ToolError):
        NameFSM(["a"], vocab, terminator="")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_random_walks_end_in_a_valid_name(fsm, seed):
    """Any walk through allowed tokens ends, within the target's byte length, in name + term."""
    rng = random.Random(seed)
    fsm.reset()
    longest = max(len(t) for t in _targets(fsm))
    for _ in range(longest):
        if fsm.is_complete():
            break
        allowed = fsm.allowed_tokens()
        assert allowed.size > 0
        assert fsm.accept_token(int(allowed[rng.randrange(allowed.size)]))
    assert fsm.is_complete()
    name = fsm.matched_name()
    assert name in fsm.names and fsm.prefix == (name + fsm.terminator).encode()


def test_logits_processor_follows_sampled_tokens(names, vocab, default_tokenizer):
    fsm = NameFSM(names, vocab)
    process = fsm.logits_processor()
    prompt = mx.array(default_tokenizer.encode('{"name": "', add_special_tokens=False))
    logits = mx.zeros((1, vocab.size + 64))  # a head wider than the tokenizer
    out = process(prompt, logits)
    allowed = np.array(out[0] > -np.inf)
    assert np.array_equal(allowed[: vocab.size], fsm.allowed_mask()) and not allowed[vocab.size:].any()
    ids = default_tokenizer.encode("list_issues", add_special_tokens=False)
    history = mx.concatenate([prompt, mx.array(ids)])
    out = process(history, logits)
    assert fsm.prefix == b"list_issues"
    assert np.array(out[0] > -np.inf)[vocab.by_bytes[b'"'][0]]


def test_masks_are_cached_per_state(names, vocab):
    fsm = NameFSM(names, vocab)
    first = fsm.allowed_mask()
    assert fsm.allowed_mask() is first and not first.flags.writeable
    assert fsm.allowed_mask_mx() is fsm.allowed_mask_mx()
