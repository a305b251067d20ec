"""``nexus-mlx serve`` driven over loopback by the official ``openai`` client (and by raw HTTP
where the wire format itself is checked).

Two servers: the default model (SmolLM2-135M) where behaviour matters (tool calls under each
``tool_choice``, a ``json_schema`` reply, a streamed tool call equal to the whole one, a
tool-result follow-up served from the cache), and a tiny random-weight llama with the default
model's tokenizer and chat template where it does not (request checking, concurrency,
disconnects, seeds, the session pool). Every server listens on 127.0.0.1 on a free port and is
stopped by its handle.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx.utils import tree_flatten

openai = pytest.importorskip("openai")

from nexus_mlx.agent.session import Session  # noqa: E402
from nexus_mlx.cli.main import main  # noqa: E402
from nexus_mlx.decode.call_format import cut_at_stop, parse_tool_calls  # noqa: E402
from nexus_mlx.models.build import model_classes  # noqa: E402
from nexus_mlx.models.forward import forward, make_cache  # noqa: E402
from nexus_mlx.server import Server, serve  # noqa: E402
from nexus_mlx.server import responses as R  # noqa: E402
from nexus_mlx.server.pool import SessionPool, reuse_of  # noqa: E402
from nexus_mlx.server.protocol import ApiError, parse_chat_request  # noqa: E402
from nexus_mlx.server.sampling import make_logits_processors  # noqa: E402
from nexus_mlx.server.stream import ReplyAssembler  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TIME_SCHEMA = {"type": "object", "properties": {"timezone": {"type": "string"}},
               "required": ["timezone"]}
CITY_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_time", "description": "Current time in a "
                                      "timezone", "parameters": TIME_SCHEMA}},
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                      "parameters": CITY_SCHEMA}},
]
SCHEMAS = {"get_time": TIME_SCHEMA, "get_weather": CITY_SCHEMA}
ASK_TIME = [{"role": "user", "content": "What time is it in Tokyo?"}]
TINY_CONTEXT = 2048


# ---- fixtures ------------------------------------------------------------------------------
def _tiny_llama(vocab_size: int = 49152) -> Any:
    """A random-weight llama (hidden 64, 2 layers) over the default tokenizer's vocabulary
    (a larger ``vocab_size``: a head padded past it, as Qwen's is); untied, so its greedy
    replies depend on the prompt."""
    config = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
              "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
              "rms_norm_eps": 1e-5, "vocab_size": vocab_size, "rope_theta": 10000.0,
              "max_position_embeddings": TINY_CONTEXT, "tie_word_embeddings": False}
    model_cls, args_cls = model_classes(config)
    mx.random.seed(0)
    model = model_cls(args_cls.from_dict(config))
    norms = [(k, 1.0 + 0.5 * mx.random.normal(v.shape))
             for k, v in tree_flatten(model.parameters()) if "norm" in k]
    model.load_weights(norms, strict=False)
    mx.eval(model.parameters())
    model.eval()
    return model


@pytest.fixture(scope="module")
def tiny(default_model):
    return _tiny_llama(), default_model[1]


@contextmanager
def running(model: Any, tokenizer: Any, **options: Any):
    server = serve(model, tokenizer, host="127.0.0.1", port=0, **options)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def tiny_server(tiny):
    server = serve(*tiny, model_name="tiny", host="127.0.0.1", port=0)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def real_server(default_model):
    server = serve(*default_model, model_name="default", host="127.0.0.1", port=0)
    yield server
    server.stop()


def client(server: Server) -> Any:
    return openai.OpenAI(base_url=server.base_url, api_key="not-needed", max_retries=0,
                         timeout=300)


def http(server: Server, path: str, body: Any = None, *, raw: bytes | None = None,
         method: str | None = None) -> tuple[int, Any]:
    """(status, decoded JSON body) of one plain HTTP request."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(server.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def healthy(server: Server) -> dict[str, Any]:
    status, body = http(server, "/health")
    assert status == 200 and body["status"] == "ok", body
    return body


def calls_of(message: Any) -> list[tuple[str, str]]:
    return [(c.function.name, c.function.arguments) for c in message.tool_calls or []]


def assemble(stream: Any) -> tuple[str, list[dict[str, Any]], str | None, Any, list[Any]]:
    """(content, tool calls, finish reason, usage, chunks) of a streamed reply."""
    content, calls, finish, usage, chunks = "", [], None, None, []
    for chunk in stream:
        chunks.append(chunk)
        if chunk.usage is not None:
            usage = chunk.usage
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for d in choice.delta.tool_calls or []:
            if d.index == len(calls):
                assert d.id and d.function.name, "a call's first delta names it"
                calls.append({"id": d.id, "name": d.function.name, "arguments": ""})
            calls[d.index]["arguments"] += d.function.arguments or ""
        finish = choice.finish_reason or finish
    return content, calls, finish, usage, chunks


# ---- the default model: a tool call and a schema reply ----------------------------------------
def test_the_default_model_calls_a_tool_and_its_result_is_served_from_the_cache(real_server):
    c = client(real_server)
    whole = c.chat.completions.create(
        model="default", messages=ASK_TIME, tools=TOOLS, max_tokens=48,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        parallel_tool_calls=False)
    choice = whole.choices[0]
    assert whole.object == "chat.completion" and whole.id.startswith("chatcmpl-")
    assert whole.model == "default" and isinstance(whole.created, int)
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_time"
    jsonschema.validate(json.loads(call.function.arguments), TIME_SCHEMA)
    usage = whole.usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    nexus = usage.model_extra["nexus"]
    assert {"path", "reason", "reused", "spliced", "repaired", "computed", "deleted",
            "timings"} <= set(nexus)
    assert {"ttft", "decode", "queue", "total"} <= set(nexus["timings"])

    # the client sends the reply back (as the SDK's own object) with the tool's result
    follow = c.chat.completions.create(
        model="default", tools=TOOLS, max_tokens=2,
        messages=[*ASK_TIME, choice.message,
                  {"role": "tool", "tool_call_id": call.id, "content": "10:42"}])
    cached = follow.usage.prompt_tokens_details.cached_tokens
    extra = follow.usage.model_extra["nexus"]
    assert cached >= whole.usage.prompt_tokens, extra
    assert cached == extra["reused"] + extra["spliced"]


def test_json_schema_reply_validates(real_server):
    schema = {"type": "object", "properties": {"name": {"type": "string"},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    reply = client(real_server).chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Give a person as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person",
                                                                "schema": schema}},
        max_tokens=40).choices[0]
    assert reply.finish_reason == "stop"
    jsonschema.validate(json.loads(reply.message.content), schema)


# ---- wire format, models, health ------------------------------------------------------------
def test_models_health_and_the_sse_wire_format(tiny_server):
    c = client(tiny_server)
    assert [m.id for m in c.models.list()] == ["tiny"]
    assert c.models.retrieve("tiny").owned_by == "nexus-mlx"
    assert healthy(tiny_server)["models"] == ["tiny"]
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "stream": True}
    request = urllib.request.Request(tiny_server.url + "/v1/chat/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        events = [line.decode().strip() for line in response if line.startswith(b"data:")]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data:"):]) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)


def test_a_streamed_reply_equals_the_whole_one_and_follow_ups_are_cached(tiny_server):
    c = client(tiny_server)
    messages = [{"role": "user", "content": "Tell me about the sea."}]
    whole = c.chat.completions.create(model="tiny", messages=messages, max_tokens=12,
                                      stop=["\n\n"])
    content, calls, finish, _, _ = assemble(c.chat.completions.create(
        model="tiny", messages=messages, max_tokens=12, stop=["\n\n"], stream=True))
    assert (content, calls, finish) == (whole.choices[0].message.content, [],
                                        whole.choices[0].finish_reason)
    follow = c.chat.completions.create(model="tiny", max_tokens=2, messages=[
        *messages, {"role": "assistant", "content": content},
        {"role": "user", "content": "And the mountains?"}])
    assert follow.usage.prompt_tokens_details.cached_tokens > 0


def test_a_deleted_turn_is_repaired_in_place_not_re_encoded(tiny):
    long_turn = " ".join(f"Fact {i}: the valve {i} opens at {3 * i} bar." for i in range(12))
    first = [{"role": "user", "content": "Note: the pump is off."},
             {"role": "assistant", "content": "Noted."},
             {"role": "user", "content": long_turn}]
    with running(*tiny, model_name="tiny", policy="repair", budget=10.0) as server:
        c = client(server)
        c.chat.completions.create(model="tiny", messages=first, max_tokens=1)
        edited = c.chat.completions.create(model="tiny", messages=first[2:], max_tokens=1)
    nexus = edited.usage.model_extra["nexus"]
    assert nexus["path"] == "repair" and nexus["spliced"] >= 64 and nexus["deleted"] > 0, nexus
    assert 0 < nexus["repaired"] < nexus["spliced"]
    assert edited.usage.prompt_tokens_details.cached_tokens == nexus["reused"] + nexus["spliced"]


def test_healing_after_a_reply_leaves_the_next_request_an_exact_cache(tiny):
    # The deletion leaves stale rows at a 10% budget; --heal-after-reply recomputes them after
    # the reply, so the follow-up starts from a cache equal to a fresh prefill, and its reply is
    # the one an exact server gives.
    from nexus_mlx._platform.mlx_thread import run_on_mlx_thread

    model, _ = tiny
    long_turn = " ".join(f"Fact {i}: the valve {i} opens at {3 * i} bar." for i in range(12))
    first = [{"role": "user", "content": "Note: the pump is off."},
             {"role": "assistant", "content": "Noted."},
             {"role": "user", "content": long_turn}]
    follow = [*first[2:], {"role": "assistant", "content": "ok"},
              {"role": "user", "content": "Which valve opens at 9 bar?"}]
    replies = {}
    for policy, heal in (("repair", True), ("exact", False)):
        with running(*tiny, model_name="tiny", policy=policy, budget=10.0,
                     heal_after_reply=heal, guard=None) as server:  # stale rows left to heal
            c = client(server)
            c.chat.completions.create(model="tiny", messages=first, max_tokens=1)
            edited = c.chat.completions.create(model="tiny", messages=first[2:], max_tokens=2)
            run_on_mlx_thread(lambda: None)  # the queued heal has run
            stats = server.engine.stats()
            if heal:
                assert edited.usage.model_extra["nexus"]["path"] == "repair"
                assert stats["healed_rows"] > 0 and stats["heal_failures"] == 0, stats
                (entry,) = server.engine.pool.entries
                session = entry.session
                assert session.stale_rows == 0
                fresh = forward(model, session.tokens, make_cache(model), logits="last")[0, -1]
                assert float(mx.max(mx.abs(fresh - session.next_token_logits()))) <= 1e-4
            else:
                assert stats["healed_rows"] == 0
            replies[policy] = c.chat.completions.create(model="tiny", messages=follow,
                                                        max_tokens=8).choices[0].message.content
    assert replies["repair"] == replies["exact"]


def test_a_guarded_server_answers_an_edit_as_an_exact_one(tiny):
    # With a guard no margin passes (1e9 nats) every token after an edit is a close call: the
    # repaired session heals before deciding it, so the reply equals an exact server's.
    long_turn = " ".join(f"Fact {i}: the valve {i} opens at {3 * i} bar." for i in range(12))
    first = [{"role": "user", "content": "Note: the pump is off."},
             {"role": "assistant", "content": "Noted."},
             {"role": "user", "content": long_turn}]
    replies = {}
    for policy, guard in (("repair", 1e9), ("exact", None)):
        with running(*tiny, model_name="tiny", policy=policy, budget=10.0, guard=guard) as server:
            c = client(server)
            c.chat.completions.create(model="tiny", messages=first, max_tokens=1)
            edited = c.chat.completions.create(model="tiny", messages=first[2:], max_tokens=8)
            replies[policy] = edited.choices[0].message.content
            if guard is not None:
                assert edited.usage.model_extra["nexus"]["path"] == "repair"
                (entry,) = server.engine.pool.entries
                assert entry.session.guard == guard and entry.session.stale_rows == 0
    assert replies["repair"] == replies["exact"]


def test_a_seed_makes_sampling_reproducible(tiny_server):
    c = client(tiny_server)

    def sample(seed: int, **kw: Any) -> str:
        return c.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Pick words."}], max_tokens=8,
            temperature=1.0, seed=seed, **kw).choices[0].message.content

    assert sample(7) == sample(7) and sample(7, top_p=0.5) == sample(7, top_p=0.5)
    assert len({sample(7), sample(8), sample(9)}) > 1
    greedy = c.chat.completions.create(model="tiny", messages=[{"role": "user",
                                                               "content": "Pick words."}],
                                       max_tokens=8).choices[0].message.content
    assert greedy == c.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Pick words."}], max_tokens=8,
        temperature=0, seed=3).choices[0].message.content


# ---- tool choices and streaming on the tiny model (the grammar decides, not the model) --------
TINY_TOOLS = [
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["JST", "UTC", "CET"]}},
        "required": ["zone"]}}},
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Oslo", "Lima"]}},
        "required": ["city"]}}},
]
TINY_SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TINY_TOOLS}


def test_a_streamed_tool_call_equals_the_whole_one(tiny_server):
    c = client(tiny_server)
    ask = dict(model="tiny", messages=ASK_TIME, tools=TINY_TOOLS, max_tokens=40,
               tool_choice={"type": "function", "function": {"name": "get_weather"}},
               parallel_tool_calls=False)
    whole = c.chat.completions.create(**ask).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.content is None
    [(name, arguments)] = calls_of(whole.message)
    assert name == "get_weather"
    jsonschema.validate(json.loads(arguments), TINY_SCHEMAS[name])
    content, calls, finish, usage, chunks = assemble(c.chat.completions.create(
        **ask, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(ch.object == "chat.completion.chunk" and ch.id == chunks[0].id for ch in chunks)
    header = next(d for ch in chunks if ch.choices for d in ch.choices[0].delta.tool_calls or [])
    assert header.id.startswith("call_") and header.type == "function"
    assert (header.function.name, header.function.arguments) == ("get_weather", "")
    fragments = [d.function.arguments for ch in chunks if ch.choices
                 for d in ch.choices[0].delta.tool_calls or [] if d.function.arguments]
    assert len(fragments) > 1, "arguments arrive in pieces as they are generated"
    assert (content or None, [(k["name"], k["arguments"]) for k in calls], finish) == (
        whole.message.content, calls_of(whole.message), whole.finish_reason)
    assert usage.prompt_tokens_details.cached_tokens > 0


def test_required_none_and_auto_tool_choices(tiny_server):
    c = client(tiny_server)
    ask = dict(model="tiny", messages=ASK_TIME, tools=TINY_TOOLS, parallel_tool_calls=False)
    required = c.chat.completions.create(**ask, tool_choice="required", max_tokens=40).choices[0]
    assert required.finish_reason == "tool_calls" and len(required.message.tool_calls) == 1
    for name, arguments in calls_of(required.message):
        jsonschema.validate(json.loads(arguments), TINY_SCHEMAS[name])
    bare = c.chat.completions.create(model="tiny", messages=ASK_TIME, max_tokens=1)
    for choice in ("none", "auto"):
        reply = c.chat.completions.create(**ask, tool_choice=choice, max_tokens=4)
        assert reply.usage.prompt_tokens > bare.usage.prompt_tokens, "the tools are in the prompt"
        message, finish = reply.choices[0].message, reply.choices[0].finish_reason
        assert (finish == "tool_calls") == bool(message.tool_calls), "finish says what was sent"
        if choice == "none" or finish != "tool_calls":
            assert message.tool_calls is None and isinstance(message.content, str)
        else:  # "auto" and the model chose to call: the call is well formed
            for name, arguments in calls_of(message):
                jsonschema.validate(json.loads(arguments), TINY_SCHEMAS[name])


def test_harmless_newer_fields_are_accepted_and_stream_chunks_carry_a_null_usage():
    body = {"model": "tiny", "messages": USER, "safety_identifier": "u-1",
            "prompt_cache_key": "agent-7", "prompt_cache_retention": "24h"}
    assert not isinstance(parse_chat_request(body), ApiError)
    assert R.chunk_body("c", 0, "tiny", {}, with_usage=True)["usage"] is None
    assert "usage" not in R.chunk_body("c", 0, "tiny", {})


def test_the_finish_reason_says_whether_the_reply_sent_carries_calls():
    # the session's parser may read a call (a bare JSON one) that the reply sent does not carry,
    # or reject one it does: the client's finish_reason follows what it receives
    for session_finish, called, want in [("tool_calls", False, "stop"), ("stop", True, "tool_calls"),
                                         ("tool_calls", True, "tool_calls"), ("stop", False, "stop"),
                                         ("stop_string", False, "stop"), ("length", True, "length")]:
        assert R.finish_reason(SimpleNamespace(finish_reason=session_finish), called) == want


def test_a_json_object_reply_is_one_object(tiny_server):
    reply = client(tiny_server).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "JSON please."}], max_tokens=24,
        response_format={"type": "json_object"}).choices[0]
    assert reply.message.content.startswith("{") and reply.message.tool_calls is None
    if reply.finish_reason == "stop":  # a random model may not close it within 24 tokens
        assert isinstance(json.loads(reply.message.content), dict)


def test_allowed_tools_keep_the_prompt_and_restrict_the_calls(tiny_server):
    # the whole tool list stays in the prompt (the follow-up reuses the cache); calls may take
    # only the allowed tools
    c = client(tiny_server)
    weather_only = {"type": "allowed_tools", "allowed_tools": {
        "mode": "required", "tools": [{"type": "function", "function": {"name": "get_weather"}}]}}
    ask = dict(model="tiny", messages=ASK_TIME, tools=TINY_TOOLS, max_tokens=40,
               parallel_tool_calls=False)
    free = c.chat.completions.create(**ask, tool_choice="required")
    reply = c.chat.completions.create(**ask, tool_choice=weather_only)
    assert [name for name, _ in calls_of(reply.choices[0].message)] == ["get_weather"]
    assert reply.usage.prompt_tokens == free.usage.prompt_tokens  # the same prompt
    assert reply.usage.prompt_tokens_details.cached_tokens >= reply.usage.prompt_tokens - 1


def test_stop_strings_do_not_cut_a_forced_tool_call(tiny_server):
    # A forced turn is calls alone: "\n" (inside "<tool_call>\n{...}") and "}" would cut the
    # call, leaving no call under "required" or arguments that are not JSON.
    c = client(tiny_server)
    ask = dict(model="tiny", messages=ASK_TIME, tools=TINY_TOOLS, max_tokens=40,
               tool_choice={"type": "function", "function": {"name": "get_weather"}},
               parallel_tool_calls=False, stop=["\n", "}"])
    whole = c.chat.completions.create(**ask).choices[0]
    assert whole.finish_reason == "tool_calls", whole
    [(name, arguments)] = calls_of(whole.message)
    jsonschema.validate(json.loads(arguments), TINY_SCHEMAS[name])
    _, calls, finish, _, _ = assemble(c.chat.completions.create(**ask, stream=True))
    assert (finish, [(k["name"], k["arguments"]) for k in calls]) == ("tool_calls",
                                                                      [(name, arguments)])


def test_penalties_and_logit_bias_match_the_reference():
    logits = mx.array(np.random.default_rng(0).normal(size=(1, 50)).astype(np.float32))
    ids = mx.array([3, 7, 3, 3, 9], dtype=mx.int32)
    [penalize] = make_logits_processors(0.5, 1.25)
    counts = np.bincount([3, 7, 3, 3, 9], minlength=50)
    expected = np.array(logits) - 0.5 * counts - 1.25 * (counts > 0)
    np.testing.assert_allclose(np.array(penalize(ids, logits)), expected, rtol=1e-6)
    assert np.array_equal(np.array(penalize(mx.array([], dtype=mx.int32), logits)),
                          np.array(logits))
    [bias] = make_logits_processors(logit_bias={4: -100.0, 8: 2.5})
    shifted = np.array(logits)
    shifted[0, 4] -= 100.0
    shifted[0, 8] += 2.5
    np.testing.assert_allclose(np.array(bias(ids, logits)), shifted, rtol=1e-6)
    assert make_logits_processors(0.0, 0.0, {}) == []


def test_penalties_and_logit_bias_are_applied_as_the_library_applies_them(tiny_server, tiny):
    # a bias of 20 makes the reply one word over and over; the penalties break the run as the
    # library's processors do
    c, tokenizer = client(tiny_server), tiny[1]
    word = tokenizer.encode(" banana", add_special_tokens=False)[0]
    ask = dict(model="tiny", messages=[{"role": "user", "content": "Count."}], max_tokens=12,
               logit_bias={str(word): 20})
    plain = c.chat.completions.create(**ask).choices[0].message.content
    assert plain == tokenizer.decode([word] * 12)
    penalized = c.chat.completions.create(**ask, frequency_penalty=2.0,
                                          presence_penalty=2.0).choices[0].message.content
    same = Session(*tiny).generate(ask["messages"], max_tokens=12,
                                   logits_processors=make_logits_processors(2.0, 2.0,
                                                                            {word: 20.0}))
    assert penalized == same.text != plain and " banana" in penalized


def test_logprobs_whole_and_streamed_agree_and_spell_the_content(tiny_server):
    c = client(tiny_server)
    ask = dict(model="tiny", messages=[{"role": "user", "content": "Say words."}], max_tokens=6,
               logprobs=True, top_logprobs=2)
    whole = c.chat.completions.create(**ask).choices[0]
    entries = whole.logprobs.content
    spelled = b"".join(bytes(e.bytes) for e in entries).decode("utf-8", errors="replace")
    assert len(entries) == 6 and spelled == whole.message.content
    for e in entries:  # a token may hold part of a character: its bytes are exact
        assert e.logprob <= 0 and bytes(e.bytes).decode("utf-8", errors="replace") == e.token
        assert len(e.top_logprobs) == 2 and e.top_logprobs[0].token == e.token  # greedy
    streamed = [e for chunk in c.chat.completions.create(**ask, stream=True)
                if chunk.choices and chunk.choices[0].logprobs
                for e in chunk.choices[0].logprobs.content]
    assert [(e.token, round(e.logprob, 4)) for e in streamed] == \
        [(e.token, round(e.logprob, 4)) for e in entries]
    plain = c.chat.completions.create(**{**ask, "logprobs": False, "top_logprobs": None})
    assert plain.choices[0].logprobs is None


def test_logprobs_of_a_head_padded_past_the_tokenizer_name_only_real_tokens(tiny):
    with running(_tiny_llama(vocab_size=53248), tiny[1], model_name="padded") as server:
        reply = client(server).chat.completions.create(
            model="padded", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
            logprobs=True, top_logprobs=20)
    for e in reply.choices[0].logprobs.content:
        assert len(e.top_logprobs) == 20 and all(-9999 <= t.logprob <= 0 for t in e.top_logprobs)


def test_a_negative_seed_samples_reproducibly(tiny_server):
    # OpenAI's seed is any 64-bit signed integer; numpy's generators take only non-negative ones
    c = client(tiny_server)
    ask = dict(model="tiny", messages=[{"role": "user", "content": "Pick words."}], max_tokens=6,
               temperature=1.0, seed=-(1 << 63))
    first = c.chat.completions.create(**ask).choices[0].message.content
    content, _, finish, _, _ = assemble(c.chat.completions.create(**ask, stream=True))
    assert content == first and finish == "length"
    with pytest.raises(openai.BadRequestError) as info:
        c.chat.completions.create(**{**ask, "seed": 1 << 63})
    assert info.value.body["param"] == "seed"


def test_a_response_format_with_tools_gives_calls_or_content_in_the_format(tiny_server):
    # As OpenAI reads the pair: under "auto" the model calls or answers in the format; a forced
    # call has no content, so the format does not hold it back
    c = client(tiny_server)
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    ask = dict(model="tiny", messages=ASK_TIME, tools=TINY_TOOLS, max_tokens=48,
               parallel_tool_calls=False,
               response_format={"type": "json_schema", "json_schema": {"name": "city",
                                                                       "schema": schema}})
    for choice in ("auto", "required"):
        whole = c.chat.completions.create(**ask, tool_choice=choice).choices[0]
        if whole.message.tool_calls:
            [(name, arguments)] = calls_of(whole.message)
            jsonschema.validate(json.loads(arguments), TINY_SCHEMAS[name])
            assert whole.finish_reason == "tool_calls" and not whole.message.content
        else:
            assert choice == "auto" and whole.finish_reason == "stop"
            jsonschema.validate(json.loads(whole.message.content), schema)
        content, calls, finish, _, _ = assemble(c.chat.completions.create(
            **ask, tool_choice=choice, stream=True))
        assert (content or None, [(k["name"], k["arguments"]) for k in calls], finish) == (
            whole.message.content or None, calls_of(whole.message), whole.finish_reason)


# ---- bad requests -----------------------------------------------------------------------------
USER = [{"role": "user", "content": "hi"}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
BAD_REQUESTS = [  # (name, body, status, param, code)
    ("json", b"{not json", 400, None, None),
    ("deep-json", b"[" * 100_000 + b"]" * 100_000, 400, None, None),
    ("not-an-object", [1, 2], 400, None, None),
    ("no-model", {"messages": USER}, 400, "model", "missing_required_parameter"),
    ("unknown-model", {"model": "gpt-9", "messages": USER}, 404, "model", "model_not_found"),
    ("no-messages", {"model": "tiny"}, 400, "messages", "missing_required_parameter"),
    ("empty-messages", {"model": "tiny", "messages": []}, 400, "messages", None),
    ("bad-role", {"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]}, 400,
     "messages", None),
    ("bad-content", {"model": "tiny", "messages": [{"role": "user", "content": 5}]}, 400,
     "messages", None),
    ("image-part", {"model": "tiny", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, "messages", None),
    ("arguments-not-json", {"model": "tiny", "messages": [
        *USER, {"role": "assistant", "tool_calls": [
            {**CALL, "function": {"name": "get_time", "arguments": "{oops"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "x"}]}, 400, "messages", None),
    ("deep-arguments", {"model": "tiny", "messages": [
        *USER, {"role": "assistant", "tool_calls": [
            {**CALL, "function": {"name": "get_time", "arguments": "[" * 50_000 + "]" * 50_000}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "x"}]}, 400, "messages", None),
    ("orphan-tool-result", {"model": "tiny", "messages": [
        *USER, {"role": "tool", "tool_call_id": "call_9", "content": "x"}]}, 400, "messages",
     None),
    ("unanswered-call", {"model": "tiny", "messages": [
        *USER, {"role": "assistant", "tool_calls": [CALL]}]}, 400, "messages", None),
    ("tools-not-a-list", {"model": "tiny", "messages": USER, "tools": {"a": 1}}, 400, "tools",
     None),
    ("bad-tool-name", {"model": "tiny", "messages": USER, "tools": [
        {"type": "function", "function": {"name": "no spaces"}}]}, 400, "tools", None),
    ("duplicate-tools", {"model": "tiny", "messages": USER, "tools": [TOOLS[0], TOOLS[0]]}, 400,
     "tools", None),
    ("schema-does-not-compile", {"model": "tiny", "messages": USER, "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"type": "banana"}}}}}]}, 400, "tools", None),
    ("unknown-tool-choice", {"model": "tiny", "messages": USER, "tools": TOOLS, "tool_choice": {
        "type": "function", "function": {"name": "launch"}}}, 400, "tool_choice", None),
    ("required-without-tools", {"model": "tiny", "messages": USER, "tool_choice": "required"},
     400, "tool_choice", None),
    ("allowed-tool-not-offered", {"model": "tiny", "messages": USER, "tools": TOOLS,
                                  "tool_choice": {"type": "allowed_tools", "allowed_tools": {
                                      "mode": "auto", "tools": [{"type": "function", "function": {
                                          "name": "launch"}}]}}}, 400, "tool_choice", None),
    ("allowed-tool-function-not-an-object", {
        "model": "tiny", "messages": USER, "tools": TOOLS, "tool_choice": {
            "type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
                {"type": "function", "function": "get_time"}]}}}, 400, "tool_choice", None),
    ("allowed-tools-mode-none", {"model": "tiny", "messages": USER, "tools": TOOLS,
                                 "tool_choice": {"type": "allowed_tools", "allowed_tools": {
                                     "mode": "none", "tools": []}}}, 400, "tool_choice", None),
    ("bad-response-format", {"model": "tiny", "messages": USER,
                             "response_format": {"type": "yaml"}}, 400, "response_format", None),
    ("response-schema-does-not-compile", {"model": "tiny", "messages": USER, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 7}}}}, 400,
     "response_format", None),
    ("max-tokens-zero", {"model": "tiny", "messages": USER, "max_tokens": 0}, 400, "max_tokens",
     None),
    ("max-tokens-text", {"model": "tiny", "messages": USER, "max_completion_tokens": "many"},
     400, "max_completion_tokens", None),
    ("hot", {"model": "tiny", "messages": USER, "temperature": 3}, 400, "temperature", None),
    ("top-p-zero", {"model": "tiny", "messages": USER, "top_p": 0}, 400, "top_p", None),
    ("seed-float", {"model": "tiny", "messages": USER, "seed": 1.5}, 400, "seed", None),
    ("penalty-too-big", {"model": "tiny", "messages": USER, "frequency_penalty": 3}, 400,
     "frequency_penalty", None),
    ("bias-key-not-an-id", {"model": "tiny", "messages": USER, "logit_bias": {"abc": 1}}, 400,
     "logit_bias", None),
    ("bias-too-big", {"model": "tiny", "messages": USER, "logit_bias": {"5": 101}}, 400,
     "logit_bias", None),
    ("bias-key-a-superscript", {"model": "tiny", "messages": USER, "logit_bias": {"\u00b2": 1}},
     400, "logit_bias", None),  # str.isdigit() holds, int() refuses it
    ("bias-outside-the-vocabulary", {"model": "tiny", "messages": USER,
                                     "logit_bias": {"10000000": 1}}, 400, "logit_bias", None),
    ("five-stops", {"model": "tiny", "messages": USER, "stop": list("abcde")}, 400, "stop", None),
    ("top-logprobs-alone", {"model": "tiny", "messages": USER, "top_logprobs": 3}, 400,
     "top_logprobs", None),
    ("top-logprobs-21", {"model": "tiny", "messages": USER, "logprobs": True,
                         "top_logprobs": 21}, 400, "top_logprobs", None),
    ("n-zero", {"model": "tiny", "messages": USER, "n": 0}, 400, "n", None),
    ("unknown-field", {"model": "tiny", "messages": USER, "frobnicate": 1}, 400, "frobnicate",
     "unknown_parameter"),
    ("stream-options-alone", {"model": "tiny", "messages": USER,
                              "stream_options": {"include_usage": True}}, 400, "stream_options",
     None),
    ("context-overflow", {"model": "tiny", "messages": [
        {"role": "user", "content": "word " * (TINY_CONTEXT + 10)}]}, 400, "messages",
     "context_length_exceeded"),
    ("completion-overflow", {"model": "tiny", "messages": USER, "max_tokens": TINY_CONTEXT},
     400, "max_tokens", "context_length_exceeded"),
]


@pytest.mark.parametrize("name,body,status,param,code", BAD_REQUESTS,
                         ids=[b[0] for b in BAD_REQUESTS])
def test_a_bad_request_is_answered_with_an_openai_error(tiny_server, name, body, status, param,
                                                        code):
    raw = body if isinstance(body, bytes) else None
    got, answer = http(tiny_server, "/v1/chat/completions", None if raw else body, raw=raw)
    assert got == status, answer
    error = answer["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"] == "invalid_request_error"
    assert (error["param"], error["code"]) == (param, code), error["message"]


def test_the_server_is_healthy_after_bad_requests(tiny_server):
    for _, body, *_ in BAD_REQUESTS[::3]:
        http(tiny_server, "/v1/chat/completions", None if isinstance(body, bytes) else body,
             raw=body if isinstance(body, bytes) else None)
    assert http(tiny_server, "/v1/chat/completions", method="GET")[0] == 405
    with pytest.raises(urllib.error.HTTPError) as wrong_method:
        urllib.request.urlopen(tiny_server.url + "/v1/chat/completions", timeout=30)
    assert wrong_method.value.headers["Allow"] == "POST"
    assert http(tiny_server, "/nowhere")[0] == 404
    with pytest.raises(openai.BadRequestError) as info:  # the SDK sees the error body too
        client(tiny_server).chat.completions.create(model="tiny", messages=[], max_tokens=1)
    assert info.value.body["param"] == "messages"
    body = healthy(tiny_server)
    assert body["in_flight"] == 0 and body["busy"] == 0
    reply = client(tiny_server).chat.completions.create(model="tiny", messages=USER, max_tokens=2)
    assert reply.choices[0].finish_reason == "length"


# ---- concurrency and disconnects ---------------------------------------------------------------
def _conversation(c: Any, index: int, turns: int) -> list[tuple[str, str, int]]:
    """One client's conversation: each turn resends the whole history plus a new question.
    Client 1 streams; client 2 samples with a seed."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": f"You are agent {index}."}]
    out = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Question {turn} from client {index}?"})
        kw: dict[str, Any] = {"temperature": 0.9, "seed": 100 + turn} if index == 2 else {}
        ask = dict(model="tiny", messages=messages, max_tokens=6, **kw)
        if index == 1:
            content, _, finish, usage, _ = assemble(c.chat.completions.create(
                **ask, stream=True, stream_options={"include_usage": True}))
        else:
            reply = c.chat.completions.create(**ask)
            content, finish, usage = (reply.choices[0].message.content,
                                      reply.choices[0].finish_reason, reply.usage)
        out.append((content, finish, usage.prompt_tokens_details.cached_tokens))
        messages.append({"role": "assistant", "content": content})
    return out


def test_four_parallel_clients_get_what_one_client_alone_gets(tiny):
    clients, turns = 4, 5
    with running(*tiny, model_name="tiny") as server:
        c = client(server)
        alone = [_conversation(c, i, turns) for i in range(clients)]
    with running(*tiny, model_name="tiny") as server:
        results: dict[int, Any] = {}
        barrier = threading.Barrier(clients)

        def run(i: int) -> None:
            barrier.wait()
            try:
                results[i] = _conversation(client(server), i, turns)
            except Exception as exc:  # reported below
                results[i] = exc

        threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert healthy(server)["served"] == clients * turns
    together = [results[i] for i in range(clients)]
    assert [[(t, f) for t, f, _ in conv] for conv in together] == \
        [[(t, f) for t, f, _ in conv] for conv in alone]
    assert all(cached > 0 for conv in together for _, _, cached in conv[1:]), together


def test_a_client_that_drops_mid_stream_leaves_the_server_healthy(tiny_server):
    c = client(tiny_server)
    before = healthy(tiny_server)
    stream = c.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Write forever."}],
        max_tokens=TINY_CONTEXT - 64, stream=True)
    for n, _ in enumerate(stream):
        if n == 3:
            break
    stream.close()
    deadline = time.monotonic() + 30
    while (state := healthy(tiny_server))["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert state["in_flight"] == 0 and state["busy"] == 0
    assert state["cancelled"] == before["cancelled"] + 1, "the generation stopped early"
    reply = c.chat.completions.create(model="tiny", messages=USER, max_tokens=2)
    assert reply.choices[0].finish_reason == "length"


# ---- the pool and the assembler, without HTTP --------------------------------------------------
def test_the_pool_reuses_the_longest_prefix_and_keeps_to_its_budget(tiny):
    model, tokenizer = tiny
    rng = np.random.default_rng(0)
    a, b = rng.integers(10, 40000, 40), rng.integers(10, 40000, 40)
    pool = SessionPool(lambda: Session(model, tokenizer), max_sessions=2, cache_budget=1 << 30)

    def serve_ids(ids: np.ndarray) -> int:
        entry = pool.acquire(ids)
        assert entry is not None
        entry.session.step_ids(ids)
        pool.release(entry)
        return entry.id

    first = serve_ids(a)
    assert serve_ids(np.r_[a, b[:5]]) == first  # an append: the same session
    second = serve_ids(b)  # unrelated: a new session rather than overwriting the first
    assert second != first
    assert serve_ids(np.r_[a[:30], b]) == first  # the longest common prefix wins
    assert reuse_of(a, np.r_[a, b], repair=True, min_reuse=8) == (40, 0, 40)
    assert reuse_of(np.r_[a, b], np.r_[a[:10], b], repair=True, min_reuse=8) == (50, 30, 10)
    assert reuse_of(np.r_[a, b], np.r_[a[:10], b], repair=False, min_reuse=8) == (10, 70, 10)
    pool.cache_budget = 1  # every idle cache is over it: all dropped, least recently used first
    serve_ids(a)
    assert pool.stats()["sessions"] == 0 and pool.evicted == 2


def test_kv_held_elsewhere_counts_in_the_pool_s_budget(tiny):
    model, tokenizer = tiny
    rng = np.random.default_rng(3)
    elsewhere = [0]
    pool = SessionPool(lambda: Session(model, tokenizer), max_sessions=3, cache_budget=1 << 30,
                       held_elsewhere=lambda: elsewhere[0])
    for n in (30, 40):
        entry = pool.acquire(rng.integers(10, 40000, n))
        assert entry is not None
        entry.session.step_ids(rng.integers(10, 40000, n))
        pool.release(entry)
    sizes = sorted((e.last_used, e.nbytes) for e in pool.entries)
    assert pool.stats()["cache_bytes_elsewhere"] == 0 and len(sizes) == 2
    elsewhere[0] = pool.cache_budget - sizes[1][1]  # room for the newer session alone
    pool.fit()
    assert [e.nbytes for e in pool.entries] == [sizes[1][1]] and pool.evicted == 1
    assert pool.stats()["cache_bytes_elsewhere"] == elsewhere[0]


def test_conversations_sharing_a_prefix_get_their_own_sessions_seeded_with_it(tiny):
    model, tokenizer = tiny
    rng = np.random.default_rng(1)
    shared, a, b, c = (rng.integers(10, 40000, n) for n in (80, 30, 20, 25))
    pool = SessionPool(lambda: Session(model, tokenizer, min_reuse=16), max_sessions=3,
                       cache_budget=1 << 30)

    def serve_ids(ids: np.ndarray, reply: tuple[int, ...] = ()) -> tuple[int, Any]:
        entry = pool.acquire(ids)
        assert entry is not None
        report = entry.session.step_ids(ids)
        for token in reply:  # the reply's rows stay in the cache, as after a generation
            entry.session.advance(token)
        pool.release(entry)
        return entry.id, report

    first, _ = serve_ids(np.r_[shared, a], reply=(5, 6, 7))
    second, report = serve_ids(np.r_[shared, b])  # another agent with the same system prompt
    assert second != first and (report.reused, report.computed) == (80, 20), "seeded, not recomputed"
    fresh = forward(model, np.r_[shared, b], make_cache(model), logits="last")[0, -1]
    entry = next(e for e in pool.entries if e.id == second)
    assert float(mx.max(mx.abs(entry.session.next_token_logits() - fresh))) <= 1e-4
    # the first conversation goes on, its reply sent back re-rendered (rows 112.. differ): its own
    # session serves it, though there is room for another
    assert serve_ids(np.r_[shared, a, 5, 6, 9, c])[0] == first
    assert serve_ids(np.r_[shared, b, c])[0] == second
    # an edit of a conversation (a message deleted) is repaired in its own session
    assert serve_ids(np.r_[shared, a[:5], a[25:], 5, 6, 9, c])[0] == first
    third, _ = serve_ids(rng.integers(10, 40000, 30))  # unrelated: the last free place
    # no room: the least recently used session is overwritten, the ones served since stay
    assert serve_ids(rng.integers(10, 40000, 30))[0] == second
    assert sorted(e.id for e in pool.entries) == sorted([first, second, third])
    # no room, a shared prefix: the least recently used one serves, seeded from the first
    assert serve_ids(np.r_[shared, a[:5], a[25:], 5, 6, 9, c, 1])[0] == first
    served, report = serve_ids(np.r_[shared, rng.integers(10, 40000, 10)])
    assert served == third and (report.reused, report.computed) == (80, 10)
    assert serve_ids(np.r_[shared, a[:5], a[25:], 5, 6, 9, c, 1, 2])[0] == first  # kept its own


def test_a_branch_is_seeded_from_the_longest_shared_prefix_not_the_cheapest_session(tiny):
    """A small unrelated session drops the fewest rows, but a new branch of a long document is
    seeded from the session that shares the document's start."""
    model, tokenizer = tiny
    rng = np.random.default_rng(2)
    doc, tail, other = (rng.integers(10, 40000, n) for n in (120, 300, 60))
    pool = SessionPool(lambda: Session(model, tokenizer, policy="exact"), max_sessions=4,
                       cache_budget=1 << 30)
    reports = []
    for ids in (np.r_[doc, tail], rng.integers(10, 40000, 6), np.r_[doc[:100], other]):
        entry = pool.acquire(ids)
        assert entry is not None
        reports.append(entry.session.step_ids(ids))
        pool.release(entry)
    assert (reports[2].reused, reports[2].computed) == (100, 60)


def test_the_assembler_reads_text_as_the_session_parser_does():
    text = ('  Sure.\n<tool_call>\n{"name": "get_time", "arguments": {"timezone": "Asia/Tokyo"}}'
            '\n</tool_call>\n<tool_call>\n{"arguments": {"city": "Oslo"}, "name": "get_weather"}'
            '\n</tool_call>\n Done. STOP never shown')
    assembler, deltas = ReplyAssembler(calls=True, stop=["STOP"]), []
    for end in range(1, len(text) + 1):  # one character at a time
        deltas += assembler.feed(text[:end])
    deltas += assembler.finish(text[:text.index("STOP")])
    expected = parse_tool_calls(text[:text.index("STOP")])
    assert assembler.content == expected.content == "Sure.\n\n\n Done."
    assert "".join(d.get("content", "") for d in deltas) == expected.content
    assert [(c.name, json.loads(c.arguments)) for c in assembler.tool_calls] == \
        [(c.name, c.arguments) for c in expected.calls]
    first = [d for d in deltas if "tool_calls" in d and d["tool_calls"][0]["index"] == 0]
    assert first[0]["tool_calls"][0]["function"] == {"name": "get_time", "arguments": ""}
    assert len(first) > 5, "the first call's arguments were streamed in pieces"
    plain = ReplyAssembler(calls=False)
    assert plain.finish("<tool_call>{}") == [{"content": "<tool_call>{}"}]
    held = ReplyAssembler(calls=True, stop=["STOP"])
    assert held.feed("caf\ufffd") == [{"content": "caf"}]  # the rest of a character to come
    assert held.feed("café ST") == [{"content": "é"}]  # " ST" may begin the stop string
    assert held.feed("café STOP and more") == [] and held.finish("café ") == []
    assert held.content == "café"


_PROSE = st.lists(st.sampled_from(["Sure.", " ", "\n", "STOP", "ST", "x", "}", "<", "<tool_"]),
                  max_size=4).map("".join)
_CALL_TEXT = st.sampled_from([
    '<tool_call>\n{"name": "get_time", "arguments": {"timezone": "UTC"}}\n</tool_call>',
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "x\\nSTOP}"}}\n</tool_call>'])


@settings(max_examples=200, deadline=None)
@given(_PROSE, st.lists(st.tuples(st.sampled_from(["", "\n"]), _CALL_TEXT), max_size=3),
       st.integers(0, 90), st.lists(st.sampled_from(["STOP", "\n", "}", "x"]), max_size=2),
       st.booleans())
def test_the_assembler_agrees_with_the_session_on_any_text(prose, calls, cut, stop, ended):
    # Texts as the constrained decoder writes them under "auto" (prose, then calls), cut short
    # anywhere: the session cuts at a stop string outside calls and parses; the assembler, fed
    # the growing text, reaches the same content and the same whole calls
    text = prose + "".join(gap + call for gap, call in calls)
    text = text[: len(text) - cut] if cut < len(text) else text
    final = cut_at_stop(text, stop, calls=True)
    assembler, deltas = ReplyAssembler(calls=True, stop=stop), []
    for end in range(1, len(text) + 1):
        deltas += assembler.feed(text[:end])
    deltas += assembler.finish(final, ended)  # ended: the model's own end, not the limit
    expected = parse_tool_calls(final, ended=ended)
    assert assembler.content == expected.content
    assert "".join(d.get("content", "") for d in deltas) == expected.content
    # a call cut short may have been announced already: it stays, its arguments as written
    whole = [c for c in assembler.tool_calls if _parses(c.arguments)]
    assert [(c.name, json.loads(c.arguments)) for c in whole] == \
        [(c.name, c.arguments) for c in expected.calls]
    assert len(assembler.tool_calls) - len(whole) <= 1


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def test_a_plain_text_reply_keeps_its_whitespace_as_generated():
    # Without tool calls the content is the text exactly (mlx_lm.server and the OpenAI API
    # return "...fix-login\n\n", not "...fix-login"), streamed or whole, up to a stop string.
    text = "\n  git branch -b fix-login\n\n STOP and more"
    streamed, deltas = ReplyAssembler(calls=False, stop=["STOP"]), []
    for end in range(1, len(text) + 1):
        deltas += streamed.feed(text[:end])
    deltas += streamed.finish(text[:text.index("STOP")])
    whole = ReplyAssembler(calls=False, stop=["STOP"])
    whole.finish(text[:text.index("STOP")])
    assert whole.content == streamed.content == "\n  git branch -b fix-login\n\n "
    assert "".join(d["content"] for d in deltas) == whole.content


# ---- the command line -----------------------------------------------------------------------
@pytest.mark.parametrize("argv,needle", [
    (["--port", "70000"], "--port"),
    (["--max-sessions", "0"], "--max-sessions"),
    (["--cache-budget", "-1"], "--cache-budget"),
    (["--budget", "101"], "--budget"),
    (["--host", "no where"], "--host"),
])
def test_serve_checks_its_arguments_before_loading(monkeypatch, capsys, argv, needle):
    import nexus_mlx.cli.commands as commands

    monkeypatch.setattr(commands, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main(["serve", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("nexus-mlx: error:") and needle in err and "\n" not in err


def test_serve_refuses_a_busy_port_before_loading(monkeypatch, capsys):
    import nexus_mlx.cli.commands as commands

    monkeypatch.setattr(commands, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        assert main(["serve", "--port", str(busy.getsockname()[1])]) == 2
    assert "in use" in capsys.readouterr().err


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_the_serve_command_prints_its_url_and_stops_on_ctrl_c(default_model, signum):
    # faulthandler: if the child hangs, SIGABRT makes it print every thread's stack
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "nexus_mlx.cli", "serve", "--port", "0"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline()
        assert "http://127.0.0.1:" in line, (line, proc.stderr.read() if proc.poll() else "")
        url = line.split(" at ")[1].split()[0]
        with urllib.request.urlopen(url + "/models", timeout=30) as response:
            assert json.loads(response.read())["data"][0]["id"] == "default"
        proc.send_signal(signum)
        try:
            _, err = proc.communicate(timeout=60)  # drains both pipes: none can block the exit
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            _, err = proc.communicate(timeout=30)
            pytest.fail(f"serve did not exit within 60 s of {signum!r}; its threads:\n{err[-8000:]}")
        status = proc.returncode
        assert status == 0 and "stopping" in err, (status, err[-2000:])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_keeps_its_sessions_in_a_session_dir_across_a_restart(default_model, tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "nexus_mlx.cli", "serve", "--port", "0", "--session-dir",
            str(tmp_path)]
    body = json.dumps({"model": "default", "max_tokens": 3, "messages": [
        {"role": "user", "content": "Say hello."}]}).encode()
    errs = []
    for _ in range(2):
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            line = proc.stdout.readline()
            assert "http://127.0.0.1:" in line, (line, proc.stderr.read() if proc.poll() else "")
            url = line.split(" at ")[1].split()[0]
            request = urllib.request.Request(url + "/chat/completions", data=body,
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=120) as response:
                assert json.loads(response.read())["choices"]
            proc.send_signal(signal.SIGTERM)
            errs.append(proc.communicate(timeout=60)[1])
            assert proc.returncode == 0, errs[-1][-2000:]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert "restored 0 session(s)" in errs[0] and "saved 1 session(s)" in errs[0], errs[0]
    assert "restored 1 session(s)" in errs[1] and "saved 1 session(s)" in errs[1], errs[1]
    assert "(1 written now)" in errs[0] and "(1 written now)" in errs[1]  # it served again
    assert sorted(p.suffix for p in tmp_path.iterdir()) == ["", ".json", ".json", ".safetensors"]
