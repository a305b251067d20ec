"""``POST /v1/responses`` over loopback with the real ``openai`` client: whole and streamed
answers agree (the stream read by the client's own accumulator), calls and their results round
trip through the live session, a response continued by ``previous_response_id`` answers as the
whole conversation sent again does, stored responses are read back (and their input items
listed, page by page) and deleted, log probabilities asked by ``include`` are the chat API's for
the same reply, and what the server cannot honour is refused by name."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

openai = pytest.importorskip("openai")

from test_server import (  # noqa: E402
    TINY_CONTEXT,
    TINY_SCHEMAS,
    _tiny_llama,
    client,
    http,
    running,
)

from nexus_mlx.errors import ArgumentError  # noqa: E402
from nexus_mlx.server import serve  # noqa: E402
from nexus_mlx.server.protocol import ApiError  # noqa: E402
from nexus_mlx.server.response_store import (  # noqa: E402
    ResponseStore,
    StoredResponse,
    input_items_page,
)
from nexus_mlx.server.responses_api_output import ResponseWriter  # noqa: E402
from nexus_mlx.server.responses_api_request import (  # noqa: E402
    LOGPROBS_INCLUDE,
    parse_responses_request,
)

TOOLS = [{"type": "function", "name": name, "parameters": schema}
         for name, schema in TINY_SCHEMAS.items()]


@pytest.fixture(scope="module")
def server(default_model):
    with running(_tiny_llama(), default_model[1], model_name="tiny") as tiny_server:
        yield tiny_server


def _streamed(c: Any, **ask: Any) -> tuple[Any, list[Any]]:
    """The final response the client's stream accumulator builds (the terminal event's, for
    an incomplete one: the client builds only completed ones), and the events."""
    with c.responses.stream(**ask) as stream:
        events = list(stream)
        if events[-1].type == "response.incomplete":
            return events[-1].response, events
        return stream.get_final_response(), events


def _items(response: Any) -> list[tuple[Any, ...]]:
    return [(o.type, o.name, o.arguments) if o.type == "function_call"
            else (o.type, o.content[0].text) for o in response.output]


def test_a_text_reply_streamed_equals_the_whole_one(server):
    c = client(server)
    ask = dict(model="tiny", input="Say something.", instructions="Be brief.",
               max_output_tokens=8, metadata={"run": "1"})
    whole = c.responses.create(**ask)
    assert whole.object == "response" and whole.status == "incomplete"
    assert whole.incomplete_details.reason == "max_output_tokens"
    assert whole.output_text and whole.metadata == {"run": "1"}
    assert whole.output[-1].status == "incomplete"  # the item the limit cut
    assert whole.usage.output_tokens == 8 and whole.instructions == "Be brief."
    final, events = _streamed(c, **ask)
    assert _items(final) == _items(whole) and final.status == "incomplete"
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.incomplete" and "response.output_text.delta" in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    # the second request repeats the first's prompt: the live session kept it
    assert final.usage.input_tokens_details.cached_tokens > 0


def test_calls_round_trip_and_the_follow_up_reuses_the_session(server):
    c = client(server)
    ask = dict(model="tiny", input="What time is it in Tokyo?", tools=TOOLS,
               tool_choice="required", parallel_tool_calls=False, max_output_tokens=40)
    whole = c.responses.create(**ask)
    assert whole.status == "completed"
    [call] = whole.output
    assert call.type == "function_call" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), TINY_SCHEMAS[call.name])
    final, events = _streamed(c, **ask)
    assert _items(final) == _items(whole)
    assert "response.function_call_arguments.delta" in [e.type for e in events]
    follow = c.responses.create(
        model="tiny", tools=TOOLS, max_output_tokens=6, tool_choice="none",
        input=[{"role": "user", "content": "What time is it in Tokyo?"},
               {"type": "function_call", "call_id": call.call_id, "name": call.name,
                "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id,
                "output": '{"time": "18:00"}'}])
    assert [o.type for o in follow.output] == ["message"]
    assert follow.usage.input_tokens_details.cached_tokens > 0
    named = c.responses.create(**{**ask, "tool_choice": {"type": "function",
                                                         "name": "get_weather"}})
    assert [o.name for o in named.output] == ["get_weather"]
    allowed = c.responses.create(**{**ask, "tool_choice": {
        "type": "allowed_tools", "mode": "required",
        "tools": [{"type": "function", "name": "get_weather"}]}})
    assert [o.name for o in allowed.output] == ["get_weather"]


def test_the_default_model_calls_and_its_own_output_items_come_back_as_input(default_model):
    # an agent's loop: the response's output items (as the SDK holds them, with their ids and
    # statuses) go back in input with the tool's result; the live session keeps the prompt
    time_tool = {"type": "function", "name": "get_time", "description": "Current time",
                 "parameters": {"type": "object", "properties": {"zone": {"type": "string"}},
                                "required": ["zone"]}}
    ask = [{"role": "user", "content": "What time is it in Tokyo?"}]
    with serve(*default_model, model_name="default", host="127.0.0.1", port=0) as running:
        c = client(running)
        first = c.responses.create(model="default", input=ask, tools=[time_tool],
                                   tool_choice="required", parallel_tool_calls=False,
                                   max_output_tokens=48)
        [call] = first.output
        assert first.status == "completed" and call.name == "get_time"
        jsonschema.validate(json.loads(call.arguments), time_tool["parameters"])
        items = [o.model_dump(exclude_none=True) for o in first.output]
        follow = c.responses.create(
            model="default", tools=[time_tool], max_output_tokens=12,
            input=[*ask, *items, {"type": "function_call_output", "call_id": call.call_id,
                                  "output": "10:42"}])
    assert [o.type for o in follow.output] == ["message"] and follow.output_text
    assert follow.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 1


def test_a_json_schema_format_shapes_the_text(server):
    schema = {"type": "object", "properties": {"city": {"enum": ["Oslo", "Lima"]}},
              "required": ["city"], "additionalProperties": False}
    reply = client(server).responses.create(
        model="tiny", input=[{"role": "developer", "content": [
            {"type": "input_text", "text": "Answer in JSON."}]},
            {"role": "user", "content": "Pick a city."}],
        text={"format": {"type": "json_schema", "name": "city", "schema": schema,
                         "strict": True}}, max_output_tokens=24)
    assert reply.status == "completed", reply
    jsonschema.validate(json.loads(reply.output_text), schema)


def test_a_failure_mid_stream_ends_with_response_failed(server, monkeypatch):
    from nexus_mlx.agent.session import Session

    def broken(self, messages, tools=None, *, on_token=None, **options):
        on_token(0, "Hel")
        yield  # the server decodes replies as steps (Session.generate_steps)
        raise RuntimeError("the model broke")

    monkeypatch.setattr(Session, "generate_steps", broken)
    with client(server).responses.create(model="tiny", input="hi", stream=True) as stream:
        events = list(stream)
    assert [e.type for e in events][-2:] == ["error", "response.failed"]
    assert "the model broke" in events[-2].message
    assert events[-1].response.status == "failed" and events[-1].response.error.message
    monkeypatch.undo()
    assert healthy_after(server)
    with pytest.raises(openai.APIError, match="the model broke"):  # chat: an error chunk
        monkeypatch.setattr(Session, "generate_steps", broken)
        list(client(server).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True))


@pytest.mark.parametrize("body, param", [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"previous_response_id": 7}, "previous_response_id"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"reasoning": {"effort": "low"}}, "reasoning"),
    ({"truncation": "auto"}, "truncation"),
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"tools": [{"type": "function", "name": "f", "parameters": {}, "color": 1}]}, "tools"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input"),
    ({"input": [{"type": "function_call", "call_id": 7, "name": "f", "arguments": "{}"}]},
     "input"),
    ({"input": 42}, "input"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format"),
    ({"tool_choice": {"type": "allowed_tools", "tools": []}}, "tool_choice"),
    ({"frobnicate": 1}, "frobnicate"),
    ({"include": ["message.output_text.logprob"]}, "include"),
    ({"include": LOGPROBS_INCLUDE}, "include"),
    ({"top_logprobs": 21}, "top_logprobs"),
    ({"max_tool_calls": 0}, "max_tool_calls"),
    ({"top_logprobs": True, "include": [LOGPROBS_INCLUDE]}, "top_logprobs"),
    # the engine's checks, named as the Responses API names the fields
    ({"max_output_tokens": TINY_CONTEXT}, "max_output_tokens"),
    ({"input": "word " * (TINY_CONTEXT + 10)}, "input"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": 7}}}},
     "text.format"),
])
def test_what_cannot_be_honoured_is_refused_by_name(server, body, param):
    status, answer = http(server, "/v1/responses",
                          {"model": "tiny", "input": "hi", **body})
    assert status == 400 and answer["error"]["param"] == param, answer
    assert healthy_after(server)


def healthy_after(server: Any) -> bool:
    status, body = http(server, "/health")
    return status == 200 and body["status"] == "ok"


def _entries(logprobs: Any) -> list[tuple[Any, ...]]:
    return [(e.token, round(e.logprob, 4), tuple(e.bytes),
             tuple((t.token, round(t.logprob, 4)) for t in e.top_logprobs)) for e in logprobs]


def test_logprobs_asked_by_include_are_the_chat_apis_for_the_same_reply(server):
    c = client(server)
    ask = dict(model="tiny", input="Say words.", max_output_tokens=6,
               include=[LOGPROBS_INCLUDE, "reasoning.encrypted_content"], top_logprobs=2)
    whole = c.responses.create(**ask)
    [message] = whole.output
    part = message.content[0]
    chat = c.chat.completions.create(model="tiny", max_tokens=6, logprobs=True, top_logprobs=2,
                                     messages=[{"role": "user", "content": "Say words."}])
    assert part.text == chat.choices[0].message.content  # the same greedy reply
    assert _entries(part.logprobs) == _entries(chat.choices[0].logprobs.content)
    assert len(part.logprobs) == 6 and whole.top_logprobs == 2
    spelled = b"".join(bytes(e.bytes) for e in part.logprobs)
    assert spelled.decode("utf-8", errors="replace") == part.text
    final, events = _streamed(c, **ask)
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert [(e.token, round(e.logprob, 4)) for d in deltas for e in d.logprobs] == \
        [(e.token, round(e.logprob, 4)) for e in part.logprobs]
    [done] = [e for e in events if e.type == "response.output_text.done"]
    assert len(done.logprobs) == 6 and _entries(final.output[0].content[0].logprobs) == \
        _entries(part.logprobs)
    unasked = c.responses.create(**{**ask, "include": None})  # top_logprobs alone: nothing
    assert unasked.output[0].content[0].logprobs == [] and unasked.top_logprobs == 2


def test_fields_that_change_nothing_here_are_accepted():
    parsed = parse_responses_request({
        "model": "m", "input": "hi", "max_tool_calls": 5, "truncation": "disabled",
        "include": ["reasoning.encrypted_content", "file_search_call.results"], "store": False,
        "top_logprobs": 3, "prompt_cache_key": "agent-1", "metadata": {"a": "b"}})
    assert not isinstance(parsed, ApiError), parsed
    assert not parsed.chat.logprobs and parsed.echo["top_logprobs"] == 3 and not parsed.store


def test_a_calls_own_ids_carry_no_text_logprobs():
    parsed = parse_responses_request({"model": "m", "input": "hi", "include": [LOGPROBS_INCLUDE]})
    assert not isinstance(parsed, ApiError), parsed
    writer = ResponseWriter(parsed)
    entry = [{"token": t, "logprob": -0.5, "bytes": list(t.encode()), "top_logprobs": []}
             for t in ("Sure", "<tool_call>", "{\"", " Done")]
    writer.logprob(entry[0])
    first = writer.events([{"content": "Sure"}])
    writer.logprob(entry[1])
    writer.logprob(entry[2])
    writer.events([{"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                    "function": {"name": "f", "arguments": ""}}]},
                   {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}])
    writer.logprob(entry[3])
    writer.events([{"content": " Done"}])
    assert [e["logprobs"] for e in first if e["type"] == "response.output_text.delta"] == \
        [[entry[0]]]
    texts = [o for o in writer.output if o["type"] == "message"]
    assert [t["content"][0]["logprobs"] for t in texts] == [[entry[0]], [entry[3]]]
    added = [e for e in first if e["type"] == "response.content_part.added"]
    assert added[0]["part"]["logprobs"] == []  # a copy: what was sent is not changed after


def test_an_unknown_model_is_not_found(server):
    with pytest.raises(openai.NotFoundError):
        client(server).responses.create(model="gpt-9", input="hi")


def test_items_become_one_conversation():
    parsed = parse_responses_request({"model": "m", "instructions": "Be brief.", "input": [
        {"role": "user", "content": "hi"},
        {"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "b", "name": "g", "arguments": '{"x": 1}'},
        {"type": "function_call_output", "call_id": "a", "output": "1"},
        {"type": "function_call_output", "call_id": "b", "output": [
            {"type": "input_text", "text": "2"}]},
    ], "tools": [{"type": "function", "name": "f", "parameters": {}},
                 {"type": "function", "name": "g", "description": "G"}],
        "tool_choice": {"type": "function", "name": "g"}, "store": True})
    assert not isinstance(parsed, Exception) and hasattr(parsed, "chat"), parsed
    chat = parsed.chat
    assert [m["role"] for m in chat.messages] == ["system", "user", "assistant", "tool", "tool"]
    assistant = chat.messages[2]
    assert assistant["content"] == "Checking."
    assert [c["function"]["name"] for c in assistant["tool_calls"]] == ["f", "g"]
    assert [m["content"] for m in chat.messages[3:]] == ["1", "2"]
    assert chat.tool_choice == {"type": "function", "function": {"name": "g"}}
    assert [t["function"]["name"] for t in chat.tools] == ["f", "g"]


# ---- stored responses: previous_response_id, GET and DELETE -----------------------------------
def _call_then_result(c: Any, **first: Any) -> tuple[Any, Any, list[dict[str, Any]]]:
    """A forced call, and the tool result that answers it (the next turn's new input)."""
    response = c.responses.create(model="tiny", input="What time is it in Tokyo?", tools=TOOLS,
                                  tool_choice="required", parallel_tool_calls=False,
                                  max_output_tokens=40, **first)
    [call] = response.output
    return response, call, [{"type": "function_call_output", "call_id": call.call_id,
                             "output": '{"time": "18:00"}'}]


def test_a_continued_response_answers_as_the_whole_conversation_does(server):
    c = client(server)
    first, call, result = _call_then_result(c)
    assert first.store and first.previous_response_id is None
    ask = dict(model="tiny", tools=TOOLS, tool_choice="none", max_output_tokens=8)
    continued = c.responses.create(previous_response_id=first.id, input=result, **ask)
    assert continued.previous_response_id == first.id
    # the oracle: the client sends the whole conversation itself
    whole = c.responses.create(input=[
        {"role": "user", "content": "What time is it in Tokyo?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name,
         "arguments": call.arguments}, *result], **ask)
    assert _items(continued) == _items(whole)
    assert continued.usage.input_tokens == whole.usage.input_tokens
    assert whole.usage.input_tokens_details.cached_tokens > 0  # one live session served both
    # a third turn continues the second, streamed; the stored chain holds all five items
    third, _ = _streamed(c, previous_response_id=continued.id, input="And in Lima?",
                         **{**ask, "max_output_tokens": 6})
    assert third.previous_response_id == continued.id
    assert third.usage.input_tokens > continued.usage.input_tokens
    assert third.usage.input_tokens_details.cached_tokens >= continued.usage.input_tokens - 1
    assert c.responses.retrieve(third.id).output[0].content[0].text == third.output_text


def test_stored_responses_are_read_back_and_deleted(server):
    c = client(server)
    first, _, result = _call_then_result(c)
    assert c.responses.retrieve(first.id).model_dump() == first.model_dump()
    second = c.responses.create(model="tiny", previous_response_id=first.id, input=result,
                                max_output_tokens=4)
    status, body = http(server, f"/v1/responses/{first.id}", method="DELETE")
    assert status == 200 and body == {"id": first.id, "object": "response.deleted",
                                      "deleted": True}
    for method in ("GET", "DELETE"):
        status, body = http(server, f"/v1/responses/{first.id}", method=method)
        assert status == 404 and body["error"]["code"] == "not_found", (method, body)
    with pytest.raises(openai.BadRequestError) as refused:
        c.responses.create(model="tiny", previous_response_id=first.id, input=result)
    assert refused.value.code == "previous_response_not_found"
    # the second response holds its whole conversation: deleting the first loses nothing
    again = c.responses.create(model="tiny", previous_response_id=second.id, input="Thanks.",
                               max_output_tokens=4)
    assert again.usage.input_tokens > second.usage.input_tokens
    assert healthy_after(server)


def test_store_false_keeps_nothing(server):
    c = client(server)
    unstored, _, result = _call_then_result(c, store=False)
    assert unstored.store is False
    assert http(server, f"/v1/responses/{unstored.id}")[0] == 404
    with pytest.raises(openai.BadRequestError, match="not found"):
        c.responses.create(model="tiny", previous_response_id=unstored.id, input=result)


def test_a_server_that_stores_nothing_says_so(default_model):
    with serve(_tiny_llama(), default_model[1], model_name="tiny", host="127.0.0.1", port=0,
               max_stored_responses=0) as running:
        reply = client(running).responses.create(model="tiny", input="hi", max_output_tokens=2)
        assert reply.store is False
        assert http(running, f"/v1/responses/{reply.id}")[0] == 404


def test_a_continuation_takes_the_stored_items_and_only_the_new_instructions():
    stored = [{"type": "message", "role": "user", "content": "hi"},
              {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": "Hello.", "annotations": []}]}]
    previous = {"resp_a": stored}.get
    parsed = parse_responses_request({"model": "m", "instructions": "Be terse.",
                                      "previous_response_id": "resp_a", "input": "More?"},
                                     previous)
    assert not isinstance(parsed, ApiError), parsed
    assert [(m["role"], m["content"]) for m in parsed.chat.messages] == [
        ("system", "Be terse."), ("user", "hi"), ("assistant", "Hello."), ("user", "More?")]
    assert list(parsed.items) == [*stored, {"type": "message", "role": "user",
                                            "content": "More?"}]
    assert parsed.store and parsed.echo["previous_response_id"] == "resp_a"
    missing = parse_responses_request({"model": "m", "previous_response_id": "resp_b",
                                       "input": "x"}, previous)
    assert isinstance(missing, ApiError) and missing.code == "previous_response_not_found"
    # an error in the new input is named by its own index, not the stored items'
    bad = parse_responses_request({"model": "m", "previous_response_id": "resp_a",
                                   "input": [{"type": "message", "role": "robot"}]}, previous)
    assert isinstance(bad, ApiError) and bad.param == "input" and "input[0]" in bad.message


def test_the_store_drops_the_least_recently_used():
    store = ResponseStore(2)
    for name in ("a", "b"):
        store.put({"id": name}, [{"n": name}])
    assert store.get("a") is not None  # read: now the most recently used
    store.put({"id": "c"}, [])
    assert store.get("b") is None and store.get("a") and store.get("c") and len(store) == 2
    assert store.delete("a") and not store.delete("a")
    off = ResponseStore(0)
    off.put({"id": "a"}, [])
    assert not off.enabled and off.get("a") is None
    with pytest.raises(ArgumentError):
        ResponseStore(-1)


def test_a_responses_input_items_are_listed_page_by_page(server):
    c = client(server)
    first, call, result = _call_then_result(c)
    second = c.responses.create(model="tiny", previous_response_id=first.id, input=result,
                                tool_choice="none", max_output_tokens=4)
    third = c.responses.create(model="tiny", previous_response_id=second.id,
                               input="And in Lima?", max_output_tokens=2)
    listed = list(c.responses.input_items.list(third.id, order="asc", limit=2))  # 3 pages
    assert [item.type for item in listed] == [
        "message", "function_call", "function_call_output", "message", "message"]
    assert listed[0].content[0].text == "What time is it in Tokyo?"
    assert listed[1].id == call.id and listed[1].arguments == call.arguments
    assert listed[3].id == second.output[0].id  # the second response's own output item
    assert listed[4].role == "user" and listed[4].content[0].type == "input_text"
    ids = [item.id for item in listed]
    assert len(set(ids)) == 5 and all(ids)
    # the same ids on every read, newest first by default; an earlier response lists its own
    newest = c.responses.input_items.list(third.id)
    assert [item.id for item in newest.data] == ids[::-1] and not newest.has_more
    assert [item.id for item in c.responses.input_items.list(second.id, order="asc")] == ids[:3]
    for query, code in (("limit=0", 400), ("limit=x", 400), ("order=up", 400),
                        ("after=msg_nothing", 400)):
        status, body = http(server, f"/v1/responses/{third.id}/input_items?{query}")
        assert status == code and body["error"]["type"] == "invalid_request_error", query
    assert http(server, "/v1/responses/resp_nothing/input_items")[0] == 404


def test_input_items_take_ids_once_and_page_after_one():
    store = ResponseStore()
    given = [{"type": "message", "role": "user", "content": "hi"},
             {"type": "function_call_output", "call_id": "c1", "output": "4"}]
    output = [{"id": "msg_out", "type": "message", "role": "assistant", "content": []}]
    store.put({"id": "r", "output": output}, [*given, *output])
    stored = store.get("r")
    assert isinstance(stored, StoredResponse) and len(stored.input_items) == 2
    first, second = stored.input_items
    assert first["id"].startswith("msg_") and second["id"].startswith("fco_")
    assert "id" not in given[0]  # stored as a copy, the caller's item untouched
    page = input_items_page(stored, limit=1, order="asc")
    assert [i["id"] for i in page["data"]] == [first["id"]] and page["has_more"]
    rest = input_items_page(stored, after=page["last_id"], limit=1, order="asc")
    assert rest["data"][0]["output"] == "4" and rest["data"][0]["status"] == "completed"
    assert not rest["has_more"] and rest["first_id"] == rest["last_id"] == second["id"]
    for bad in ({"limit": 101}, {"limit": True}, {"order": "newest"}, {"after": "x"}):
        with pytest.raises(ArgumentError):
            input_items_page(stored, **bad)


def test_stored_responses_outlive_a_restart_with_a_session_dir(default_model, tmp_path):
    """A chain continued after a restart answers as it does on the server that stored it, from
    the restored session's rows."""
    model, tokenizer = _tiny_llama(), default_model[1]
    ask = dict(model="tiny", tools=TOOLS, tool_choice="none", max_output_tokens=8)
    with running(model, tokenizer, model_name="tiny", session_dir=tmp_path) as first_server:
        first, _, result = _call_then_result(client(first_server))
        same = client(first_server).responses.create(previous_response_id=first.id,
                                                     input=result, **ask)
        client(first_server).responses.delete(same.id)
    assert (tmp_path / "responses.json").is_file()
    with running(model, tokenizer, model_name="tiny", session_dir=tmp_path) as second_server:
        assert second_server.responses_restored == 1
        c = client(second_server)
        assert c.responses.retrieve(first.id).model_dump() == first.model_dump()
        continued = c.responses.create(previous_response_id=first.id, input=result, **ask)
    assert _items(continued) == _items(same)
    assert continued.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens


def test_a_responses_snapshot_round_trips_and_a_bad_one_changes_nothing(tmp_path):
    from nexus_mlx.errors import FormatError

    store = ResponseStore(4)
    shared = [{"role": "user", "content": "hi"}]
    store.put({"id": "resp_a", "output": [{"type": "message", "role": "assistant",
                                          "content": "yo"}]}, [*shared, {"role": "assistant",
                                                                         "content": "yo"}])
    a = store.get("resp_a")
    assert a is not None
    store.put({"id": "resp_b", "output": []}, [*a.items, {"role": "user", "content": "more"}])
    assert store.save(tmp_path / "r.json") == 2
    text = (tmp_path / "r.json").read_text()
    assert text.count('"hi"') == 1  # an item shared by both responses is written once
    back = ResponseStore(4)
    assert back.load(tmp_path / "r.json") == 2
    got_a, got_b = back.get("resp_a"), back.get("resp_b")
    assert got_a is not None and got_b is not None
    assert list(got_b.items) == list(store.get("resp_b").items)
    assert got_b.items[0] is got_a.items[0]  # shared again, not copied
    one = ResponseStore(1)
    assert one.load(tmp_path / "r.json") == 1 and one.get("resp_b") is not None
    assert ResponseStore(4).load(tmp_path / "missing.json") == 0
    for bad, field in (("[]", "format"), ('{"format": "nexus-mlx-responses", "items": {}, '
                                          '"responses": [["x", []]]}', "responses[0]"),
                       ("{not json", "not a readable")):
        (tmp_path / "bad.json").write_text(bad)
        with pytest.raises(FormatError, match=field.replace("[", r"\[").replace("]", r"\]")):
            back.load(tmp_path / "bad.json")
        assert back.get("resp_a") is not None and len(back) == 2


def test_a_responses_snapshot_is_not_written_again_while_nothing_changed(tmp_path):
    store = ResponseStore(4)
    store.put({"id": "resp_a", "output": []}, [{"role": "user", "content": "hi"}])
    path = tmp_path / "r.json"
    assert store.save(path) == 1
    path.write_text("sentinel")  # any write would replace it
    assert store.save(path) == 1 and path.read_text() == "sentinel"
    assert store.save(tmp_path / "other.json") == 1  # another file is written
    store.delete("resp_a")
    assert store.save(path) == 0 and path.read_text() != "sentinel"
