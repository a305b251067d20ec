"""One tool call, name then arguments: machinery on a tiny random-weight model with the real
vocabulary (any sampled path must give a valid call), then the real default model on requests."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest

from nexus_mlx.decode.generate import generate_tokens
from nexus_mlx.decode.grounding import Evidence
from nexus_mlx.decode.json_constraint import JsonConstraint, compile_schema
from nexus_mlx.decode.name_fsm import NameFSM, vocab_of
from nexus_mlx.decode.placeholders import find_placeholders
from nexus_mlx.decode.tool_call import (
    CALL_PREFIX,
    call_tool,
    describe,
    generate_tool_call,
    quoted_text,
    tool_call_prompt,
)
from nexus_mlx.errors import ArgumentError
from nexus_mlx.models.forward import forward, make_cache
from nexus_mlx.tools.ir import tool_signature
from nexus_mlx.tools.registry import load_tools
from nexus_mlx.tools.tool import Tool

TIME_TOOL = Tool(  # mcp-server-time's tool, as it lists it
    "get_current_time",
    "Get current time in a specific timezones",
    {"type": "object", "required": ["timezone"], "properties": {"timezone": {
        "type": "string",
        "description": "IANA timezone name (e.g., 'America/New_York', 'Europe/London'). Use "
                       "'UTC' as local timezone if no timezone provided by the user."}}},
)
CANDIDATES = ("create_repository", "list_issues", "get_me", "fork_repository")


@pytest.fixture(scope="session")
def github(github_tools_file):
    return load_tools(github_tools_file)


def _sampler(seed: int):
    key = [mx.random.key(seed)]

    def sample(logprobs: mx.array) -> mx.array:
        key[0], sub = mx.random.split(key[0])
        return mx.random.categorical(logprobs, key=sub)

    return sample


def _check(result, tools, default_tokenizer, prompt, cache) -> None:
    by_name = {t.name: t for t in tools}
    assert result.valid, describe(result)
    assert result.name in by_name and result.mode == "strict"
    call = json.loads(result.text)
    assert call == {"name": result.name, "arguments": result.arguments}
    assert result.text.startswith(CALL_PREFIX)
    assert find_placeholders(result.arguments, by_name[result.name].input_schema) == []
    assert default_tokenizer.decode(list(result.tokens)) == result.text[len(CALL_PREFIX):]
    assert cache.n_past == len(prompt) + len(result.tokens) - 1  # like generate_tokens
    assert result.timings.total_s >= result.timings.prefill_s > 0


@pytest.mark.parametrize("seed", [None, 1, 2, 3])
def test_random_model_calls_are_always_valid(tiny, default_tokenizer, github, seed):
    """Whatever a random model prefers (greedy or sampled), the call parses and validates."""
    tools = [github.get(n) for n in CANDIDATES]
    prompt = tool_call_prompt(default_tokenizer, "create a private repository named demo", tools)
    cache = make_cache(tiny)
    sampler = None if seed is None else _sampler(seed)
    result = generate_tool_call(tiny, default_tokenizer, cache, prompt, tools, sampler=sampler,
                                max_argument_tokens=24, closing_budget=64)
    _check(result, tools, default_tokenizer, prompt, cache)
    assert result.mask_overhead.arguments_us and result.mask_overhead.median_us > 0


def test_single_candidate_forces_the_name(tiny, default_tokenizer):
    prompt = tool_call_prompt(default_tokenizer, "what time is it in Tokyo?", [TIME_TOOL])
    cache = make_cache(tiny)
    result = generate_tool_call(tiny, default_tokenizer, cache, prompt, [TIME_TOOL], sampler=_sampler(7),
                                max_argument_tokens=8)
    _check(result, [TIME_TOOL], default_tokenizer, prompt, cache)
    assert result.name == "get_current_time" and result.mask_overhead.name_us == ()


def test_quoted_text_is_the_request_or_every_non_system_message():
    assert quoted_text("star pallets/flask") == "star pallets/flask"
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": None}, {"role": "tool", "content": "12:00"}]
    assert quoted_text(messages) == "hi\n12:00"


def test_a_quoted_placeholder_like_value_is_not_an_error(tiny, default_tokenizer):
    """The schema forces the title "TODO": an error unless the request says it."""
    tool = Tool("set_title", "Set a title", {"type": "object", "properties": {
        "title": {"type": "string", "pattern": "^TODO$"}}, "required": ["title"]})
    prompt = tool_call_prompt(default_tokenizer, "title it TODO", [tool])
    plain = generate_tool_call(tiny, default_tokenizer, None, prompt, [tool], max_argument_tokens=8)
    quoted = generate_tool_call(tiny, default_tokenizer, None, prompt, [tool], max_argument_tokens=8,
                                quoted="title it TODO")
    assert plain.arguments == quoted.arguments == {"title": "TODO"}
    assert plain.errors == ("/title: placeholder text",) and quoted.errors == ()
    assert call_tool(tiny, default_tokenizer, "title it TODO", [tool],
                     max_argument_tokens=8).errors == ()  # call_tool quotes the request


def test_zero_budget_closes_without_the_model(tiny, default_tokenizer, github):
    tools = [github.get("list_issues"), github.get("get_me")]
    prompt = tool_call_prompt(default_tokenizer, "list issues", tools)
    cache = make_cache(tiny)
    result = generate_tool_call(tiny, default_tokenizer, cache, prompt, tools, max_argument_tokens=0)
    _check(result, tools, default_tokenizer, prompt, cache)


def test_processors_plug_into_generate_tokens(tiny, default_tokenizer, github):
    """The FSM and JSON constraint as mlx-lm logits processors in the ordinary sampling loop."""
    names = [t.name for t in github]
    fsm = NameFSM(names, default_tokenizer)
    prompt = tool_call_prompt(default_tokenizer, "list issues", [github.get("list_issues")])
    eos = set(vocab_of(default_tokenizer).eos_ids)
    out = list(generate_tokens(tiny, prompt, make_cache(tiny), max_tokens=64, eos_token_ids=eos,
                               sampler=_sampler(5), logits_processors=[fsm.logits_processor()]))
    assert out[-1] in eos and fsm.matched_name() in names
    assert default_tokenizer.decode(out[:-1]) == fsm.matched_name() + '"'
    schema = github.get("get_me").input_schema
    constraint = JsonConstraint(compile_schema(schema), default_tokenizer)
    out = list(generate_tokens(tiny, prompt, make_cache(tiny), max_tokens=64, eos_token_ids=eos,
                               logits_processors=[constraint.logits_processor()]))
    assert out[-1] in eos and constraint.is_complete()
    assert json.loads(default_tokenizer.decode(out[:-1])) == constraint.value()


def test_prompt_format(default_tokenizer, github):
    tools = [github.get("create_repository"), TIME_TOOL]
    prompt = tool_call_prompt(default_tokenizer, "make a repo", tools)
    text = default_tokenizer.decode(prompt)
    assert text.endswith("<|im_start|>assistant\n" + CALL_PREFIX)
    assert all(tool_signature(t) in text for t in tools) and "make a repo" in text


def test_caller_errors(tiny, default_tokenizer, github):
    tools = [github.get("get_me")]
    prompt = tool_call_prompt(default_tokenizer, "who am I", tools)
    with pytest.raises(ArgumentError, match="at least one"):
        generate_tool_call(tiny, default_tokenizer, None, prompt, [])
    with pytest.raises(ArgumentError, match="duplicate"):
        generate_tool_call(tiny, default_tokenizer, None, prompt, tools * 2)
    with pytest.raises(ArgumentError, match="must end with"):
        generate_tool_call(tiny, default_tokenizer, None, prompt[:-2], tools)
    with pytest.raises(ArgumentError):
        tool_call_prompt(default_tokenizer, "x", [])


# ----------------------------------------------------------------------------- real model

REQUESTS = [  # (request, tool the call must name)
    ("create a private repository named demo", "create_repository"),
    ("list open issues in octocat/hello-world", "list_issues"),
    ("get the current time in Tokyo", "get_current_time"),
]


@pytest.mark.slow
def test_default_model_three_requests(default_model, github):
    """The three requests over one candidate set, sharing the system prompt's KV prefix."""
    model, tokenizer = default_model
    tools = [github.get("create_repository"), github.get("list_issues"), github.get("get_me"),
             TIME_TOOL]
    prompts = [tool_call_prompt(tokenizer, r, tools) for r, _ in REQUESTS]
    shared = 0
    while all(p[shared] == prompts[0][shared] for p in prompts):
        shared += 1
    base = make_cache(model)
    mx.eval(forward(model, prompts[0][:shared], base, logits="last"))
    for (request, expected), prompt in zip(REQUESTS, prompts, strict=True):
        cache = base.fork()
        result = generate_tool_call(model, tokenizer, cache, prompt[shared:], tools,
                                    max_argument_tokens=40, closing_budget=64)
        print(request, "->", describe(result))
        _check(result, tools, tokenizer, prompt, cache)
        assert result.name == expected


def test_default_model_time_request(default_model, github):
    """The default model on a short prompt: two candidates (the name FSM runs), fresh cache."""
    model, tokenizer = default_model
    tools = [TIME_TOOL, github.get("get_me")]
    result = call_tool(model, tokenizer, "get the current time in Tokyo", tools)
    print(describe(result))
    assert result.valid and result.name == "get_current_time"
    assert set(result.arguments) == {"timezone"}
    assert find_placeholders(result.arguments, TIME_TOOL.input_schema) == []


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_large_optional_margin_keeps_only_the_required_arguments(tiny, default_tokenizer,
                                                                   github, seed):
    tool = github.get("list_issues")
    prompt = tool_call_prompt(default_tokenizer, "list the open issues of octo/demo", [tool])
    cache = make_cache(tiny)
    result = generate_tool_call(tiny, default_tokenizer, cache, prompt, [tool],
                                sampler=_sampler(seed), max_argument_tokens=48,
                                optional_margin=1e4)
    _check(result, [tool], default_tokenizer, prompt, cache)
    assert set(result.arguments) == set(tool.input_schema["required"])


def test_the_member_choice_is_offered_only_where_the_object_may_end(default_tokenizer, github):
    tool = github.get("list_branches")  # required owner, repo; optional page, perPage
    vocab = vocab_of(default_tokenizer)
    constraint = JsonConstraint(compile_schema(tool.input_schema), default_tokenizer)

    def feed(text: str) -> None:
        for token in default_tokenizer.encode(text, add_special_tokens=False):
            assert constraint.accept_token(token), text

    feed('{"owner": "a", "repo": "b')  # in the last required value: close and end, or go on
    ends, goes_on = constraint.member_choice()
    assert {vocab.token_bytes[t].replace(b" ", b"")[:2] for t in ends} == {b'"}'}
    assert {vocab.token_bytes[t].replace(b" ", b"")[:2] for t in goes_on} == {b'",'}
    feed('"')
    ends, goes_on = constraint.member_choice()
    texts = [vocab.token_bytes[t].lstrip()[:1] for t in ends], \
        [vocab.token_bytes[t].lstrip()[:1] for t in goes_on]
    assert set(texts[0]) == {b"}"} and set(texts[1]) <= {b",", b'"'}
    feed(', "page": 2')
    assert constraint.member_choice() is not None
    short = JsonConstraint(compile_schema(tool.input_schema), default_tokenizer)
    for token in default_tokenizer.encode('{"owner": "a"', add_special_tokens=False):
        short.accept_token(token)
    assert short.member_choice() is None  # "repo" is required: the object may not end yet


def test_a_negative_optional_margin_is_refused(tiny, default_tokenizer):
    prompt = tool_call_prompt(default_tokenizer, "time?", [TIME_TOOL])
    with pytest.raises(ArgumentError, match="optional_margin"):
        generate_tool_call(tiny, default_tokenizer, None, prompt, [TIME_TOOL], optional_margin=-1)


def test_restraint_drops_members_and_changes_no_value(tiny, default_tokenizer, github):
    tool = github.get("list_issues")
    prompt = tool_call_prompt(default_tokenizer, "list the open issues of octo/demo", [tool])
    free = generate_tool_call(tiny, default_tokenizer, None, prompt, [tool], max_argument_tokens=48)
    held = generate_tool_call(tiny, default_tokenizer, None, prompt, [tool], max_argument_tokens=48,
                              optional_margin=1e4)
    required = tool.input_schema["required"]
    assert held.valid and held.arguments == {k: free.arguments[k] for k in required}


def test_generate_tool_call_drops_only_what_the_request_does_not_support(tiny, default_tokenizer):
    """A random model fills optional arguments with noise: with the request as evidence the
    noise is dropped and reported; the required argument, the text and the tokens stay."""
    tool = Tool("set_mode", "Set a mode", {"type": "object", "required": ["on"], "properties": {
        "on": {"type": "boolean"}, "level": {"type": "integer"}, "verbose": {"type": "boolean"},
        "mode": {"type": "string", "enum": ["fast", "slow", "auto"]}}})
    request = "switch it on, level 3"
    prompt = tool_call_prompt(default_tokenizer, request, [tool])
    seen = 0
    for seed in range(1, 7):
        kwargs = dict(max_argument_tokens=24, optional_margin=0, quoted=request)
        kept = generate_tool_call(tiny, default_tokenizer, None, prompt, [tool],
                                  sampler=_sampler(seed), **kwargs)
        raw = generate_tool_call(tiny, default_tokenizer, None, prompt, [tool],
                                 sampler=_sampler(seed), ground_optional=False, **kwargs)
        assert kept.text == raw.text and kept.tokens == raw.tokens and raw.dropped == {}
        assert raw.complete and json.loads(raw.text)["arguments"] == raw.arguments
        assert {**kept.arguments, **kept.dropped} == raw.arguments and "on" in kept.arguments
        evidence = Evidence(request)
        assert all(evidence.supports(v, k) for k, v in kept.arguments.items() if k != "on")
        assert all(not evidence.supports(v, k) for k, v in kept.dropped.items())
        seen += len(kept.dropped)
    assert seen > 0  # the random model did invent something, and it went
