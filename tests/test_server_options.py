"""Chat-completion options over loopback with the real ``openai`` client.

``n`` > 1: a request's choices are generated one after another on one live session. Choice 0
is the reply the same request with ``n`` = 1 gets; with a seed the later choices are
reproducible and differ from it; greedy choices are all the same; streamed choices (read by the
client's own stream accumulator, chunk by chunk, by ``index``) equal the whole answer's; usage
counts every choice's tokens once and the prompt once; bad ``n`` is refused by name.

``prediction`` (OpenAI's predicted outputs): the reply is the same with a right, a partly right
or a wrong prediction, whole and streamed, greedy and sampled, with logprobs; usage says how
many predicted ids the reply kept and dropped; a malformed prediction is refused by name.

Heap trimming: replies trim the C heap at most once per ``trim_heap_s`` (counted in
``/health``), not at all with None; a bad ``--trim-heap`` is refused by name. An idle server
(``idle_release_s``) clears MLX's buffer cache and answers the same afterwards; its watcher
ends with the server.

Interleaving: a short request sent while a long reply streams is answered between that reply's
tokens (most of the long reply arrives after it), and gets the reply it gets alone; with
``interleave=False`` it waits for the long reply's end."""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

import jsonschema
import pytest

openai = pytest.importorskip("openai")

from test_server import (  # noqa: E402
    TINY_SCHEMAS,
    TINY_TOOLS,
    _tiny_llama,
    client,
    healthy,
    http,
    running,
)

from nexus_mlx._platform import heap  # noqa: E402
from nexus_mlx.models.tokenizer import eos_token_ids  # noqa: E402

ASK = dict(model="tiny", messages=[{"role": "user", "content": "Tell me a story."}],
           max_tokens=8)  # the choices' request


@pytest.fixture(scope="module")
def server(default_model):
    with running(_tiny_llama(), default_model[1], model_name="tiny") as tiny_server:
        yield tiny_server


def _texts(completion: Any) -> list[str]:
    return [c.message.content for c in sorted(completion.choices, key=lambda c: c.index)]


def test_sampled_choices_are_reproducible_and_choice_0_is_the_single_reply(server):
    c = client(server)
    sampled = dict(ASK, temperature=1.0, seed=11)
    single = c.chat.completions.create(**sampled)
    three = c.chat.completions.create(**sampled, n=3)
    again = c.chat.completions.create(**sampled, n=3)
    assert [x.index for x in three.choices] == [0, 1, 2]
    assert _texts(three) == _texts(again)
    assert _texts(three)[0] == single.choices[0].message.content
    assert len(set(_texts(three))) > 1, "each choice draws from its own stream of the seed"
    generated = sum(len(x.logprobs.content) for x in c.chat.completions.create(
        **sampled, n=3, logprobs=True).choices)
    assert three.usage.completion_tokens == generated == 3 * ASK["max_tokens"]
    assert three.usage.prompt_tokens == single.usage.prompt_tokens
    assert three.usage.total_tokens == three.usage.prompt_tokens + generated
    assert all(x.finish_reason == "length" for x in three.choices)


def test_greedy_choices_are_the_same_reply(server):
    c = client(server)
    one = c.chat.completions.create(**ASK)
    assert _texts(c.chat.completions.create(**ASK, n=2)) == [one.choices[0].message.content] * 2


def test_streamed_choices_equal_the_whole_ones(server):
    c = client(server)
    sampled = dict(ASK, temperature=0.8, seed=5, n=3)
    whole = c.chat.completions.create(**sampled)
    chunks = list(c.chat.completions.create(**sampled, stream=True,
                                            stream_options={"include_usage": True}))
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            finishes[choice.index] = choice.finish_reason or finishes.get(choice.index)
    assert [texts[i] for i in range(3)] == _texts(whole)
    assert [finishes[i] for i in range(3)] == ["length"] * 3
    usages = [ch.usage for ch in chunks if ch.usage is not None]
    assert len(usages) == 1 and chunks[-1].usage is not None and not chunks[-1].choices
    assert usages[0].completion_tokens == whole.usage.completion_tokens
    with c.chat.completions.stream(**sampled) as stream:  # the SDK's accumulator, by index
        for _ in stream:
            pass
        final = stream.current_completion_snapshot  # (its final one refuses a cut reply)
    assert _texts(final) == _texts(whole)


def test_each_choice_is_a_checked_tool_call(server):
    c = client(server)
    reply = c.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=TINY_TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=40,
        temperature=1.0, seed=3, n=2)
    assert len(reply.choices) == 2
    for choice in reply.choices:
        assert choice.finish_reason == "tool_calls"
        [call] = choice.message.tool_calls
        jsonschema.validate(json.loads(call.function.arguments), TINY_SCHEMAS[call.function.name])


@pytest.mark.parametrize("n", [0, 129, True, 2.0, "2"])
def test_bad_n_is_refused_by_name(server, n):
    status, answer = http(server, "/v1/chat/completions", {**ASK, "n": n})
    assert status == 400 and answer["error"]["param"] == "n", answer


def test_the_responses_api_takes_no_n(server):
    status, answer = http(server, "/v1/responses", {"model": "tiny", "input": "hi", "n": 2})
    assert status == 400 and answer["error"]["param"] == "n", answer


# ---- prediction ----------------------------------------------------------------------------
REWRITE = dict(model="tiny", max_tokens=24,
               messages=[{"role": "user", "content": "Rewrite: x = 1; y = x + 2"}])


def _predicted(text: str, parts: bool = False) -> dict[str, Any]:
    content: Any = [{"type": "text", "text": text[:5]}, {"type": "text", "text": text[5:]}] \
        if parts else text
    return {"type": "content", "content": content}


@pytest.mark.parametrize("sampled", [False, True])
def test_the_reply_is_the_same_with_any_prediction(server, sampled):
    c = client(server)
    ask = dict(REWRITE, temperature=0.9, seed=4) if sampled else REWRITE
    plain = c.chat.completions.create(**ask)
    text = plain.choices[0].message.content
    details = plain.usage.completion_tokens_details
    assert (details.accepted_prediction_tokens, details.rejected_prediction_tokens) == (0, 0)
    for prediction in (_predicted(text), _predicted(text, parts=True),
                       _predicted(text[:10] + " an edit " + text[10:]),
                       _predicted("something else entirely")):
        reply = c.chat.completions.create(**ask, prediction=prediction)
        assert reply.choices[0].message.content == text
        assert reply.usage.completion_tokens == plain.usage.completion_tokens
    right = c.chat.completions.create(**ask, prediction=_predicted(text))
    kept = right.usage.completion_tokens_details.accepted_prediction_tokens
    assert kept > plain.usage.completion_tokens // 2
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in
                       c.chat.completions.create(**ask, prediction=_predicted(text), stream=True)
                       if chunk.choices)
    assert streamed == text
    scored = [c.chat.completions.create(**ask, logprobs=True, top_logprobs=2, **extra)
              for extra in ({}, {"prediction": _predicted(text)})]
    assert [[(e.token, round(e.logprob, 3)) for e in s.choices[0].logprobs.content]
            for s in scored] == [[(e.token, round(e.logprob, 3))
                                  for e in scored[0].choices[0].logprobs.content]] * 2


@pytest.mark.parametrize("prediction", [
    "text", {"type": "text", "content": "x"}, {"type": "content"},
    {"type": "content", "content": 7}, {"type": "content", "content": [{"type": "image"}]},
    {"type": "content", "content": "x", "extra": 1}])
def test_a_malformed_prediction_is_refused_by_name(server, prediction):
    status, answer = http(server, "/v1/chat/completions", {**REWRITE, "prediction": prediction})
    assert status == 400 and answer["error"]["param"] == "prediction", answer


# ---- heap trimming -------------------------------------------------------------------------
@pytest.mark.skipif(not sys.platform.startswith("linux") or heap._malloc_trim() is None,
                    reason="needs glibc's malloc_trim")
def test_replies_trim_the_heap_at_most_once_per_interval(default_model):
    from nexus_mlx._platform.mlx_thread import run_on_mlx_thread

    for interval, trims in ((0.0, 3), (3600.0, 1)):
        with running(_tiny_llama(), default_model[1], model_name="tiny",
                     trim_heap_s=interval) as tiny_server:
            for _ in range(3):
                client(tiny_server).chat.completions.create(**dict(ASK, max_tokens=2))
            run_on_mlx_thread(lambda: None)  # the queued trims have run
            health = healthy(tiny_server)
            assert health["heap_trims"] == trims and health["heap_trim_ms"] >= 0, health


def test_a_server_without_heap_trimming_reports_none(default_model):
    with running(_tiny_llama(), default_model[1], model_name="tiny",
                 trim_heap_s=None) as tiny_server:
        client(tiny_server).chat.completions.create(**dict(ASK, max_tokens=2))
        assert "heap_trims" not in healthy(tiny_server)


@pytest.mark.parametrize("value", ["-1", "soon", "inf", "nan"])
def test_a_bad_trim_interval_is_refused_by_name(value):
    from nexus_mlx.cli import checks
    from nexus_mlx.errors import ArgumentError

    with pytest.raises(ArgumentError, match="--trim-heap"):
        checks.seconds_or_off(value, "--trim-heap")
    assert checks.seconds_or_off("off", "--trim-heap") is None
    assert checks.seconds_or_off("2.5", "--trim-heap") == 2.5


def test_an_idle_server_gives_mlx_cache_back_and_answers_the_same_after(default_model):
    import time

    with running(_tiny_llama(), default_model[1], model_name="tiny",
                 idle_release_s=0.3) as tiny_server:
        c = client(tiny_server)
        first = c.chat.completions.create(**ASK).choices[0].message.content
        deadline = time.monotonic() + 20
        while healthy(tiny_server)["idle_releases"] < 1:
            assert time.monotonic() < deadline, healthy(tiny_server)
            time.sleep(0.05)
        health = healthy(tiny_server)
        assert health["mlx_cache_bytes"] == 0 and health["idle_release_failures"] == 0, health
        assert c.chat.completions.create(**ASK).choices[0].message.content == first
    assert tiny_server.engine.idle is not None and tiny_server.engine.idle._watcher is None


# ---- interleaving replies ----------------------------------------------------------------------
LONG_TOKENS = 600  # long enough that the short request arrives well before its middle


def _chunks_after_a_short_request(server: Any, tokenizer: Any) -> tuple[int, int, str]:
    """Stream a long reply (its end-of-turn ids banned), send a short request once its first
    chunk is read: (long chunks read after the short reply came back, long chunks in all, the
    short reply's text)."""
    c = client(server)
    no_end = {str(t): -100 for t in eos_token_ids(tokenizer)}
    stream = c.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Write a long story."}],
        max_tokens=LONG_TOKENS, logit_bias=no_end, stream=True)
    short_done, short = threading.Event(), {}

    def ask_short() -> None:
        short["reply"] = client(server).chat.completions.create(**ASK)
        short_done.set()

    asker = threading.Thread(target=ask_short)
    total = after = 0
    for chunk in stream:
        if not any(choice.delta.content for choice in chunk.choices):
            continue
        total += 1
        after += short_done.is_set()
        if total == 1:
            asker.start()
    asker.join(120)
    return after, total, short["reply"].choices[0].message.content


def test_a_short_request_is_answered_between_a_long_reply_s_tokens(default_model):
    tiny = _tiny_llama(), default_model[1]
    with running(*tiny, model_name="tiny") as server:
        alone = client(server).chat.completions.create(**ASK).choices[0].message.content
        after, total, text = _chunks_after_a_short_request(server, tiny[1])
    assert total >= LONG_TOKENS // 2 and after > total // 2, (after, total)
    assert text == alone
    with running(*tiny, model_name="tiny", interleave=False) as server:
        after, total, text = _chunks_after_a_short_request(server, tiny[1])
    assert after < total // 2, (after, total)  # it waited for the long reply's end
    assert text == alone
