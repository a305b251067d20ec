"""``prediction`` (OpenAI's predicted outputs) over loopback with the real ``openai`` client:
the reply is the same with a right, a partly right or a wrong prediction, whole and streamed,
greedy and sampled; usage says how many predicted ids the reply kept and dropped; a malformed
prediction is refused by name."""

from __future__ import annotations

from typing import Any

import pytest

openai = pytest.importorskip("openai")

from test_server import _tiny_llama, client, http  # noqa: E402

from nexus_mlx.server import serve  # noqa: E402

ASK = dict(model="tiny", messages=[{"role": "user", "content": "Rewrite: x = 1; y = x + 2"}],
           max_tokens=24)


@pytest.fixture(scope="module")
def server(default_model):
    running = serve(_tiny_llama(), default_model[1], model_name="tiny", host="127.0.0.1",
                    port=0)
    yield running
    running.stop()


def _predicted(text: str, parts: bool = False) -> dict[str, Any]:
    content: Any = [{"type": "text", "text": text[:5]}, {"type": "text", "text": text[5:]}] \
        if parts else text
    return {"type": "content", "content": content}


@pytest.mark.parametrize("sampled", [False, True])
def test_the_reply_is_the_same_with_any_prediction(server, sampled):
    c = client(server)
    ask = dict(ASK, temperature=0.9, seed=4) if sampled else ASK
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
    status, answer = http(server, "/v1/chat/completions", {**ASK, "prediction": prediction})
    assert status == 400 and answer["error"]["param"] == "prediction", answer
