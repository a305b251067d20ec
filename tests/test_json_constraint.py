"""Schema-constrained JSON (llguidance) with the real tokenizer: every GitHub MCP schema and 200
Seal-Tools schemas driven by random allowed tokens always give valid, placeholder-free JSON."""

from __future__ import annotations

import json
import random

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nexus_mlx.decode.json_constraint import JsonConstraint, compile_schema, prepare_schema
from nexus_mlx.decode.name_fsm import vocab_of
from nexus_mlx.decode.placeholders import PlaceholderPolicy, check_arguments, find_placeholders
from nexus_mlx.errors import ToolError
from nexus_mlx.tools.registry import load_seal_tools, load_tools

FREE_STEPS = 40  # random tokens before the walker starts closing
MAX_STEPS = 400  # a walk that has not completed by then fails the test


@pytest.fixture(scope="session")
def github_tools(github_tools_file):
    return list(load_tools(github_tools_file))


@pytest.fixture(scope="session")
def seal_tools(seal_tools_file):
    return random.Random(0).sample(list(load_seal_tools(seal_tools_file)), 200)


def encode(default_tokenizer, text: str) -> list[int]:
    return list(default_tokenizer.encode(text, add_special_tokens=False))


def walk(constraint: JsonConstraint, rng: random.Random, free: int) -> bool:
    """Uniformly random allowed tokens for ``free`` steps, then the closing policy (random when
    it has no preference); True when the grammar completed within :data:`MAX_STEPS`."""
    for step in range(MAX_STEPS):
        if constraint.is_complete():
            return True
        token = constraint.closing_token() if step >= free else None
        if token is None:
            allowed = np.flatnonzero(constraint.allowed_mask())
            assert allowed.size, constraint.text
            token = int(allowed[rng.randrange(allowed.size)])
        assert constraint.accept_token(token)
    return constraint.is_complete()


def test_closing_leaves_a_placeholder_echo_within_a_few_tokens(default_tokenizer):
    schema = {"type": "object", "properties": {"owner": {"type": "string"}},
              "required": ["owner"]}
    constraint = JsonConstraint(compile_schema(schema), default_tokenizer, names=["get_repo"])
    for token in encode(default_tokenizer, '{"owner": "owner'):
        assert constraint.accept_token(token)
    for _ in range(4):  # the guard bans the closing quote after "owner" and "owner0..."
        if constraint.is_complete():
            break
        token = constraint.closing_token()
        assert token is not None
        assert constraint.accept_token(token)
    assert constraint.is_complete(), constraint.text
    value = json.loads(constraint.text)
    assert find_placeholders(value, schema, ["get_repo"]) == [], value


def check_walks(tools, default_tokenizer, seed: int, walks: int = 1) -> None:
    rng = random.Random(seed)
    for tool in tools:
        compiled = compile_schema(tool.input_schema)
        assert compiled.mode == "strict", (tool.name, compiled.notes)
        constraint = JsonConstraint(compiled, default_tokenizer, names=[tool.name])
        for _ in range(walks):
            constraint.reset()
            assert walk(constraint, rng, rng.randrange(FREE_STEPS)), (tool.name, constraint.text)
            value = json.loads(constraint.text)
            assert isinstance(value, dict)
            assert check_arguments(value, tool.input_schema, [tool.name]) == [], constraint.text
            assert find_placeholders(value, tool.input_schema, [tool.name]) == []


def test_every_github_schema_random_walks_validate(github_tools, default_tokenizer):
    assert len(github_tools) == 117
    check_walks(github_tools, default_tokenizer, seed=0)


def test_seal_tools_schemas_random_walks_validate(seal_tools, default_tokenizer):
    check_walks(seal_tools, default_tokenizer, seed=1)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(index=st.integers(0, 116), seed=st.integers(0, 2**32 - 1))
def test_hypothesis_walks_on_github_schemas(github_tools, default_tokenizer, index, seed):
    check_walks([github_tools[index]], default_tokenizer, seed=seed)


def test_canonical_call_text_is_accepted_and_completes(default_tokenizer):
    schema = {"type": "object", "properties": {"name": {"type": "string"},
              "private": {"type": "boolean"}}, "required": ["name"]}
    compiled = compile_schema(schema, leading_space=True, after="}")
    constraint = JsonConstraint(compiled, default_tokenizer)
    ids = encode(default_tokenizer, ' {"name": "demo", "private": true}}')
    assert constraint.accept_tokens(ids) == len(ids)
    assert constraint.is_complete() and constraint.value() == {"name": "demo", "private": True}
    assert constraint.json_text() == '{"name": "demo", "private": true}'
    assert constraint.forced_tokens() == []


def test_rejected_tokens_leave_the_state_unchanged(default_tokenizer):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    constraint = JsonConstraint(compile_schema(schema), default_tokenizer)
    assert constraint.accept_tokens(encode(default_tokenizer, '{"n": ')) > 0
    before = (constraint.text, list(constraint.tokens), constraint.allowed_mask().copy())
    for bad in encode(default_tokenizer, '"x}') + [-1, 10**6] + list(vocab_of(default_tokenizer).eos_ids):
        assert not constraint.accept_token(bad)
        assert (constraint.text, list(constraint.tokens)) == before[:2]
        assert np.array_equal(constraint.allowed_mask(), before[2])
    assert constraint.accept_tokens(encode(default_tokenizer, "7}")) == 2
    assert constraint.is_complete() and constraint.value() == {"n": 7}


def test_closed_objects_and_required_first():
    schema = {"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "string"},
              "sub": {"type": "object", "properties": {"x": {"type": "integer"}}}},
              "required": ["a"]}
    prepared = prepare_schema(schema)
    assert list(prepared["properties"]) == ["a", "b", "sub"]
    assert prepared["additionalProperties"] is False
    assert prepared["properties"]["sub"]["additionalProperties"] is False
    combined = {"type": "object", "properties": {"a": {}}, "allOf": [{"properties": {"b": {}}}]}
    assert "additionalProperties" not in prepare_schema(combined)
    undeclared = {"type": "object", "properties": {"a": {}}, "required": ["z"]}
    assert "additionalProperties" not in prepare_schema(undeclared)
    assert prepare_schema(schema, closed=False, required_first=False) == schema


def test_extra_keys_are_rejected(default_tokenizer):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    constraint = JsonConstraint(compile_schema(schema), default_tokenizer)
    ids = encode(default_tokenizer, '{"zz": 1}')
    assert constraint.accept_tokens(ids) < len(ids)
    open_ = JsonConstraint(compile_schema(schema, closed=False), default_tokenizer)
    assert open_.accept_tokens(ids) == len(ids) and open_.is_complete()


def test_fallback_modes_and_invalid_schemas(default_tokenizer):
    lenient = compile_schema({"type": "object", "properties": {
        "a": {"type": "string", "not": {"const": "x"}}}})
    assert lenient.mode == "lenient" and not lenient.exact and "not" in " ".join(lenient.notes)
    constraint = JsonConstraint(lenient, default_tokenizer)
    ids = encode(default_tokenizer, '{"a": "x"}')
    assert constraint.accept_tokens(ids) == len(ids) and constraint.is_complete()
    assert check_arguments(constraint.value(), lenient.schema) != []  # caught afterwards
    broken = compile_schema({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}})
    assert broken.mode == "any_object" and len(broken.notes) == 2
    assert check_arguments({"a": 1}, broken.schema)[0].startswith("/: schema cannot")
    with pytest.raises(ToolError, match="invalid JSON Schema"):
        compile_schema({"type": "str"})
    with pytest.raises(ToolError):
        compile_schema([1, 2])  # type: ignore[arg-type]
    assert compile_schema({"type": "object"}) is compile_schema({"type": "object"})  # cached


@pytest.mark.parametrize("value,key,names,expected", [
    ("string", None, (), True), ("String[]", None, (), True), ("string|null", None, (), True),
    ("<value>", None, (), True), ("{{owner}}", None, (), True), ("${repo}", None, (), True),
    ("...", None, (), True), ("", None, (), True), ("  ", None, (), True), ("TODO", None, (), True),
    ("your_username", None, (), True), ("owner", "owner", (), True), ("owner_name", "owner", (), True),
    ("repo_1", "repo", (), True), ("create_repository_x", None, ("create_repository",), True),
    ("demo", "name", (), False), ("octocat", "owner", (), False), ("Asia/Tokyo", None, (), False),
    ("strings attached", None, (), False), ("a string", None, (), False), ("0", None, (), False),
])
def test_placeholder_policy(value, key, names, expected):
    assert PlaceholderPolicy(None, names).is_placeholder(value, key) is expected


def test_find_placeholders_paths_and_exemptions():
    schema = {"type": "object", "properties": {"kind": {"enum": ["string", "number"]},
              "owner": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}}}
    value = {"kind": "string", "owner": "tags", "tags": ["ok", "<tag>"]}
    assert find_placeholders(value, schema) == ["/owner", "/tags/1"]


def test_quoted_text_is_never_a_placeholder():
    """The user's own words pass whatever they look like; the rest is judged as before."""
    request = 'Comment "Your fix works" on issue 4 and set its title to TODO'
    for value in ("Your fix works", "your fix works ", "TODO"):
        assert PlaceholderPolicy(None).is_placeholder(value, "body")
        assert not PlaceholderPolicy(None, quoted=request).is_placeholder(value, "body")
    assert PlaceholderPolicy(None, quoted=request).is_placeholder("your_username", "owner")
    assert PlaceholderPolicy(None, quoted="evaluate it").is_placeholder("value", "x")  # words
    assert find_placeholders({"body": "Your fix works"}, quoted=request) == []
    assert check_arguments({"body": "Your fix works"}, {"type": "object"}) != []


def _after(default_tokenizer, schema, text, names=(), quoted=None):
    constraint = JsonConstraint(compile_schema(schema), default_tokenizer, names=names,
                                quoted=quoted)
    ids = encode(default_tokenizer, text)
    assert constraint.accept_tokens(ids) == len(ids), text
    return constraint


def test_guard_bans_closing_a_placeholder(default_tokenizer):
    vocab = vocab_of(default_tokenizer)
    quote, quote_close = vocab.by_bytes[b'"'][0], vocab.by_bytes[b'"}'][0]
    schema = {"type": "object", "properties": {"owner": {"type": "string"}}}
    for text in ['{"owner": "string', '{"owner": "owner', '{"owner": "<value>', '{"owner": "']:
        constraint = _after(default_tokenizer, schema, text)
        assert not constraint.allowed_mask()[[quote, quote_close]].any(), text
        assert not constraint.accept_token(quote_close) and constraint.text == text
    assert _after(default_tokenizer, schema, '{"owner": "octocat').accept_token(quote_close)
    empty = _after(default_tokenizer, schema, '{"owner":')
    assert not empty.allowed_mask()[vocab.by_bytes[b' ""'][0]]  # opens and closes at once
    enum = {"type": "object", "properties": {"t": {"enum": ["string", "strong"]}}}
    assert _after(default_tokenizer, enum, '{"t": "string').accept_token(quote_close)
    quoted = _after(default_tokenizer, schema, '{"owner": "TODO', quoted="owner TODO please")
    assert quoted.accept_token(quote_close)  # the request says it
    unguarded = JsonConstraint(compile_schema(schema), default_tokenizer, guard_placeholders=False)
    unguarded.accept_tokens(encode(default_tokenizer, '{"owner": "string'))
    assert unguarded.accept_token(quote_close)


def test_released_guard_lets_a_placeholder_close_and_find_placeholders_reports_it(
        default_tokenizer):
    vocab = vocab_of(default_tokenizer)
    quote_close = vocab.by_bytes[b'"}'][0]
    schema = {"type": "object", "properties": {"owner": {"type": "string"}}}
    constraint = _after(default_tokenizer, schema, '{"owner": "your-owner-name')
    assert not constraint.allowed_mask()[quote_close]  # cached mask, guard on
    constraint.release_guard()
    assert constraint.allowed_mask()[quote_close]  # the cache was dropped
    assert constraint.accept_token(quote_close) and constraint.is_complete()
    assert find_placeholders(constraint.value(), schema) != []


def test_guard_bans_starting_a_value_with_a_tool_name(default_tokenizer):
    vocab = vocab_of(default_tokenizer)
    schema = {"type": "object", "properties": {"name": {"type": "string"}}}
    constraint = _after(default_tokenizer, schema, '{"name": "create_', names=["create_repository"])
    completing = [i for i, data in enumerate(vocab.token_bytes) if data.startswith(b"repository")]
    assert completing and not constraint.allowed_mask()[completing].any()
    assert constraint.accept_token(vocab.by_bytes[b"repo"][0])  # "create_repo" is fine so far
    assert constraint.accept_token(vocab.by_bytes[b"s"][0])
    assert not constraint.accept_token(vocab.by_bytes[b"itory"][0])
    assert constraint.accept_token(vocab.by_bytes[b"it"][0])  # "create_reposit" still fine
    assert check_arguments({"name": "create_repository_x"}, schema, ["create_repository"])


def test_forced_tokens_for_constants(default_tokenizer):
    schema = {"type": "object", "properties": {"v": {"const": "fixed-value"}}, "required": ["v"]}
    constraint = JsonConstraint(compile_schema(schema), default_tokenizer)
    forced = constraint.forced_tokens()
    assert forced and constraint.accept_tokens(forced) == len(forced)
    assert constraint.text.startswith('{"v": "fixed')


def test_logits_processor_masks_and_follows(default_tokenizer):
    vocab = vocab_of(default_tokenizer)
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]}
    constraint = JsonConstraint(compile_schema(schema), default_tokenizer)
    process = constraint.logits_processor()
    prompt = mx.array([1, 2, 3])
    logits = mx.zeros((1, vocab.size))
    allowed = np.array(process(prompt, logits)[0] > -np.inf)
    assert np.array_equal(allowed, constraint.allowed_mask())
    history = mx.concatenate([prompt, mx.array(encode(default_tokenizer, '{"a": true}'))])
    allowed = np.array(process(history, logits)[0] > -np.inf)
    assert constraint.is_complete() and set(np.flatnonzero(allowed)) == set(vocab.eos_ids)
