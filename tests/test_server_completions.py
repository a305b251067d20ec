"""``POST /v1/completions`` over loopback with the real ``openai`` client (and raw HTTP where the
wire format is checked).

A raw prompt is continued without the chat template: greedy text equals mlx-lm's own greedy
generation from the same ids (the oracle), for a string prompt and the same prompt as token ids;
streamed chunks add up to the whole answer (echo first, a finish reason last, usage with
``include_usage``); ``echo`` repeats the prompt; ``logprobs`` carries each token with its
alternatives and offsets; ``echo`` with ``logprobs`` scores the prompt as mlx-lm's forward does,
also alone (``max_tokens`` 0); a batch of prompts answers each one's choices in order; a stop
string cuts the text; ``n`` choices are reproducible with a seed; a prompt that extends an earlier
one reuses its rows. Bad requests are refused by name, and the server still answers afterwards; the
parser, fuzzed, answers any body with a request or a named error. A tiny random-weight llama with
the default model's tokenizer, and the default model where behaviour matters (its continuation of a
plain text, and " Paris" scored above " London" after "The capital of France is").
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.generate import generate_step

openai = pytest.importorskip("openai")

from test_server import _tiny_llama, client, healthy, http, running  # noqa: E402

from nexus_mlx.server.completions_api import (  # noqa: E402
    legacy_logprobs,
    parse_completions_request,
)
from nexus_mlx.server.protocol import ApiError  # noqa: E402

PROMPT = "The three primary colours are red, yellow and"


@pytest.fixture(scope="module")
def tiny(default_model):
    return _tiny_llama(), default_model[1]


@pytest.fixture(scope="module")
def server(tiny):
    with running(*tiny, model_name="tiny") as tiny_server:
        yield tiny_server


def greedy_text(model: Any, tokenizer: Any, ids: list[int], max_tokens: int) -> tuple[str, str]:
    """mlx-lm's greedy continuation of ``ids``: (text, finish reason as OpenAI names it)."""
    out: list[int] = []
    eos = set(tokenizer.eos_token_ids)
    for token, _ in generate_step(mx.array(ids), model, max_tokens=max_tokens,
                                  sampler=lambda lp: mx.argmax(lp, axis=-1)):
        token = int(token)
        if token in eos:
            return tokenizer.decode(out), "stop"
        out.append(token)
    return tokenizer.decode(out), "length"


def test_greedy_text_equals_mlx_lm_for_a_string_and_for_its_ids(server, tiny):
    model, tokenizer = tiny
    ids = list(tokenizer.encode(PROMPT))
    want, finish = greedy_text(model, tokenizer, ids, 12)
    c = client(server)
    by_text = c.completions.create(model="tiny", prompt=PROMPT, max_tokens=12)
    by_ids = c.completions.create(model="tiny", prompt=ids, max_tokens=12)
    for answer in (by_text, by_ids):
        assert answer.object == "text_completion" and answer.id.startswith("cmpl-")
        [choice] = answer.choices
        assert choice.text == want and choice.finish_reason == finish and choice.index == 0
        assert choice.logprobs is None
        assert answer.usage.prompt_tokens == len(ids)
        assert answer.usage.completion_tokens == 12
    assert by_ids.usage.prompt_tokens_details.cached_tokens >= len(ids) - 1  # rows kept


def test_the_default_model_continues_a_plain_text_as_mlx_lm_does(default_model):
    model, tokenizer = default_model
    ids = list(tokenizer.encode(PROMPT))
    want, finish = greedy_text(model, tokenizer, ids, 8)
    context = "The capital of France is"
    with running(model, tokenizer, model_name="default") as real:
        c = client(real)
        answer = c.completions.create(model="default", prompt=[PROMPT], max_tokens=8)
        scored = c.completions.create(  # as an evaluation harness scores two continuations
            model="default", prompt=[context + " Paris", context + " London"], max_tokens=0,
            echo=True, logprobs=1)
    assert answer.choices[0].text == want and answer.choices[0].finish_reason == finish
    assert want.strip(), "a plain continuation, not the end of a turn"
    n = len(tokenizer.encode(context))
    paris, london = (sum(ch.logprobs.token_logprobs[n:]) for ch in scored.choices)
    assert paris > london + 1.0, (paris, london)


def test_a_stream_adds_up_to_the_whole_answer_with_echo_first_and_usage_last(server):
    c = client(server)
    whole = c.completions.create(model="tiny", prompt=PROMPT, max_tokens=10, echo=True)
    chunks = list(c.completions.create(model="tiny", prompt=PROMPT, max_tokens=10, echo=True,
                                       stream=True, stream_options={"include_usage": True}))
    texts = [ch.choices[0].text for ch in chunks if ch.choices]
    assert texts[0] == PROMPT  # the echo comes first, before any generated text
    assert "".join(texts) == whole.choices[0].text
    assert whole.choices[0].text.startswith(PROMPT)
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and not any(finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens
    assert all(ch.usage is None for ch in chunks[:-1])
    assert all(ch.object == "text_completion" and ch.id == chunks[0].id for ch in chunks)


def test_logprobs_carry_each_token_its_alternatives_and_offsets(server):
    c = client(server)
    answer = c.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, logprobs=3)
    choice = answer.choices[0]
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 8
    if not any("\ufffd" in t for t in lp.tokens):  # whole characters: tokens spell the text
        assert "".join(lp.tokens) == choice.text
    offsets = [0]
    for token in lp.tokens[:-1]:
        offsets.append(offsets[-1] + len(token))
    assert lp.text_offset == offsets
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert 1 <= len(top) <= 3 and logprob <= 0.0
        assert max(top.values()) == pytest.approx(logprob, abs=1e-5)  # greedy: the best one
        assert top.get(token, logprob) == pytest.approx(logprob, abs=1e-5)
    streamed = list(c.completions.create(model="tiny", prompt=PROMPT, max_tokens=8,
                                         logprobs=3, stream=True))
    tokens = [t for ch in streamed if ch.choices and ch.choices[0].logprobs
              for t in ch.choices[0].logprobs.tokens]
    offsets = [o for ch in streamed if ch.choices and ch.choices[0].logprobs
               for o in ch.choices[0].logprobs.text_offset]
    assert tokens == lp.tokens and offsets == lp.text_offset


def test_echo_with_logprobs_scores_the_prompt_as_mlx_lm_s_forward_does(server, tiny):
    model, tokenizer = tiny
    ids = list(tokenizer.encode(PROMPT))
    logits = model(mx.array(ids)[None])[0].astype(mx.float32)  # mlx-lm's own forward
    want = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    c = client(server)
    answer = c.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, echo=True,
                                  logprobs=2)
    choice = answer.choices[0]
    lp = choice.logprobs
    n = len(ids)
    assert len(lp.tokens) == n + 3 and choice.text.startswith(PROMPT)
    assert "".join(lp.tokens[:n]) == PROMPT
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for i in range(1, n):
        assert lp.token_logprobs[i] == pytest.approx(float(want[i - 1, ids[i]]), abs=1e-4)
        assert max(lp.top_logprobs[i].values()) == pytest.approx(float(want[i - 1].max()),
                                                                  abs=1e-4)
    assert lp.text_offset[n] == len(PROMPT)  # the reply's first token starts after the echo
    alone = c.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, logprobs=2)
    assert choice.text == PROMPT + alone.choices[0].text
    assert lp.token_logprobs[n:] == pytest.approx(alone.choices[0].logprobs.token_logprobs,
                                                  abs=1e-5)
    streamed = list(c.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, echo=True,
                                         logprobs=2, stream=True))
    first = streamed[0].choices[0]
    assert first.text == PROMPT and first.logprobs.tokens == lp.tokens[:n]
    assert [t for ch in streamed for t in ch.choices[0].logprobs.tokens] == lp.tokens
    assert [o for ch in streamed for o in ch.choices[0].logprobs.text_offset] == lp.text_offset


def test_max_tokens_0_with_echo_scores_the_prompt_alone_whole_and_streamed(server, tiny):
    model, tokenizer = tiny
    ids = list(tokenizer.encode(PROMPT))
    c = client(server)
    scored = c.completions.create(model="tiny", prompt=ids, max_tokens=0, echo=True,
                                  logprobs=10)
    choice = scored.choices[0]
    assert choice.text == PROMPT and choice.finish_reason == "length"
    assert len(choice.logprobs.tokens) == len(ids) and choice.logprobs.token_logprobs[0] is None
    assert all(len(top) == 10 for top in choice.logprobs.top_logprobs[1:])
    assert scored.usage.completion_tokens == 0 and scored.usage.prompt_tokens == len(ids)
    assert scored.usage.model_extra["nexus"]["path"] == "score"
    reused = healthy(server)["scored_rows_reused"]
    with_reply = c.completions.create(model="tiny", prompt=ids, max_tokens=2, echo=True,
                                      logprobs=10)
    assert healthy(server)["scored_rows_reused"] == reused + len(ids) - 1  # scored before
    assert with_reply.choices[0].logprobs.token_logprobs[:len(ids)] == pytest.approx(
        choice.logprobs.token_logprobs, abs=1e-5)
    streamed = list(c.completions.create(model="tiny", prompt=ids, max_tokens=0, echo=True,
                                         logprobs=10, stream=True))
    assert "".join(ch.choices[0].text for ch in streamed) == PROMPT
    assert [t for ch in streamed for t in ch.choices[0].logprobs.tokens] == \
        choice.logprobs.tokens
    echoed = c.completions.create(model="tiny", prompt=PROMPT, max_tokens=0, echo=True)
    assert echoed.choices[0].text == PROMPT and echoed.choices[0].logprobs is None
    assert echoed.usage.model_extra["nexus"]["computed"] == 0  # nothing was run


def test_a_batch_of_prompts_answers_each_prompt_s_choices_in_order(server, tiny):
    tokenizer = tiny[1]
    prompts = [PROMPT, "Once upon a time", list(tokenizer.encode("def add(a, b):"))]
    c = client(server)
    alone = [c.completions.create(model="tiny", prompt=p, max_tokens=5).choices[0].text
             for p in prompts]
    batch = c.completions.create(model="tiny", prompt=prompts, max_tokens=5, n=2)
    assert [ch.index for ch in batch.choices] == list(range(6))
    assert [ch.text for ch in batch.choices] == [t for t in alone for _ in range(2)]
    streamed = list(c.completions.create(model="tiny", prompt=prompts, max_tokens=5,
                                         stream=True, echo=True))
    texts = ["", "", ""]
    for ch in streamed:
        texts[ch.choices[0].index] += ch.choices[0].text
    echoes = [tokenizer.decode(p) if isinstance(p, list) else p for p in prompts]
    assert texts == [e + t for e, t in zip(echoes, alone, strict=True)]


def test_a_stop_string_cuts_the_text(server, tiny):
    model, tokenizer = tiny
    full, _ = greedy_text(model, tokenizer, list(tokenizer.encode(PROMPT)), 16)
    stop = full[len(full) // 2:len(full) // 2 + 3]
    if not stop.strip():
        pytest.skip("the greedy text has no visible characters to stop at")
    answer = client(server).completions.create(model="tiny", prompt=PROMPT, max_tokens=16,
                                               stop=[stop])
    assert answer.choices[0].text == full[:full.index(stop)]
    assert answer.choices[0].finish_reason == "stop"


def test_sampled_choices_are_reproducible_with_a_seed(server):
    c = client(server)
    ask = dict(model="tiny", prompt=PROMPT, max_tokens=6, temperature=1.0, seed=5, n=2)
    first, again = c.completions.create(**ask), c.completions.create(**ask)
    assert [ch.index for ch in first.choices] == [0, 1]
    assert [ch.text for ch in first.choices] == [ch.text for ch in again.choices]
    if all(ch.finish_reason == "length" for ch in first.choices):
        assert first.usage.completion_tokens == 12  # both choices' tokens
    assert first.usage.prompt_tokens == again.usage.prompt_tokens  # the prompt once
    single = c.completions.create(**dict(ask, n=1))
    assert single.choices[0].text == first.choices[0].text  # choice 0 is the single reply


def test_a_longer_prompt_reuses_the_rows_of_an_earlier_one(server, tiny):
    tokenizer = tiny[1]
    ids = list(tokenizer.encode("Once upon a time, in a quiet village by the sea, there lived"))
    c = client(server)
    c.completions.create(model="tiny", prompt=ids, max_tokens=4)
    extended = ids + list(tokenizer.encode(" an old fisherman who"))
    later = c.completions.create(model="tiny", prompt=extended, max_tokens=4)
    assert later.usage.prompt_tokens == len(extended)
    assert later.usage.prompt_tokens_details.cached_tokens >= len(ids)


@pytest.mark.parametrize("body, param", [
    ({"prompt": ["one", ["two"]]}, "prompt"),
    ({"prompt": ["one"] * 65, "n": 2}, "prompt"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [1, "x"]}, "prompt"),
    ({"prompt": [True, 2]}, "prompt"),
    ({"prompt": [10**9]}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"logprobs": 21}, "logprobs"),
    ({"best_of": 3}, "best_of"),
    ({"best_of": 1, "n": 2}, "best_of"),
    ({"suffix": "end"}, "suffix"),  # SmolLM2's vocabulary has no FIM tokens
    ({"suffix": 3}, "suffix"),
    ({"suffix": "end", "echo": True}, "echo"),
    ({"echo": "yes"}, "echo"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"temperature": 3}, "temperature"),
    ({"messages": []}, "messages"),
    ({"prompt": "x " * 3000}, "prompt"),
])
def test_bad_requests_are_refused_by_name_and_the_server_goes_on(server, body, param):
    status, answer = http(server, "/v1/completions",
                          {"model": "tiny", "prompt": PROMPT, "max_tokens": 4, **body})
    assert status == 400, answer
    assert answer["error"]["param"] == param, answer
    assert healthy(server)["failed"] == 0


def test_a_missing_prompt_and_an_unknown_model_are_refused(server):
    status, answer = http(server, "/v1/completions", {"model": "tiny"})
    assert status == 400 and answer["error"]["code"] == "missing_required_parameter"
    status, answer = http(server, "/v1/completions", {"model": "other", "prompt": "a"})
    assert status == 404 and answer["error"]["code"] == "model_not_found"
    status, answer = http(server, "/v1/completions",
                          {"model": "tiny", "prompt": PROMPT, "max_tokens": 2, "best_of": 1,
                           "suffix": "", "user": "u"})
    assert status == 200 and answer["choices"][0]["finish_reason"] == "length"


def test_an_idle_server_forgets_its_scored_prompt(default_model):
    import time

    with running(_tiny_llama(), default_model[1], model_name="tiny",
                 idle_release_s=0.3) as idle_server:
        c = client(idle_server)
        ask = dict(model="tiny", prompt=PROMPT, max_tokens=0, echo=True, logprobs=1)
        first = c.completions.create(**ask).choices[0].logprobs.token_logprobs
        computed = healthy(idle_server)["scored_rows_computed"]
        deadline = time.monotonic() + 20
        while healthy(idle_server)["idle_releases"] < 1:
            assert time.monotonic() < deadline, healthy(idle_server)
            time.sleep(0.05)
        again = c.completions.create(**ask).choices[0].logprobs.token_logprobs
        assert healthy(idle_server)["scored_rows_computed"] == 2 * computed  # scored anew
        assert again == pytest.approx(first, abs=1e-6)


def test_the_scorer_s_kv_counts_in_the_cache_budget(default_model):
    """The scorer's kept prompt is K/V like a session's: /health counts it beside the sessions',
    and a prompt that alone passes the budget is not kept (the next scoring computes anew)."""
    ask = dict(model="tiny", prompt=PROMPT, max_tokens=0, echo=True, logprobs=1)
    with running(_tiny_llama(), default_model[1], model_name="tiny") as roomy:
        client(roomy).completions.create(**ask)
        kept = healthy(roomy)
        assert kept["cache_bytes_elsewhere"] > 0
        client(roomy).completions.create(**ask)
        assert healthy(roomy)["scored_rows_computed"] == kept["scored_rows_computed"]
    with running(_tiny_llama(), default_model[1], model_name="tiny",
                 cache_budget_mib=0) as tight:
        c = client(tight)
        first = c.completions.create(**ask).choices[0].logprobs.token_logprobs
        computed = healthy(tight)["scored_rows_computed"]
        assert healthy(tight)["cache_bytes_elsewhere"] == 0
        again = c.completions.create(**ask).choices[0].logprobs.token_logprobs
        assert healthy(tight)["scored_rows_computed"] == 2 * computed
        assert again == pytest.approx(first, abs=1e-6)


def test_a_batch_with_one_bad_prompt_is_refused_whole_naming_it(server):
    status, answer = http(server, "/v1/completions",
                          {"model": "tiny", "prompt": [PROMPT, "x " * 3000], "max_tokens": 2})
    assert status == 400 and answer["error"]["param"] == "prompt"
    assert answer["error"]["message"].startswith("prompt 1: ")
    assert answer["error"]["code"] == "context_length_exceeded"


def test_a_scored_prompt_that_is_continued_is_computed_once(server, tiny):
    """echo + logprobs with max_tokens >= 1: the session that continues the prompt starts from
    the scorer's rows (all but the last), and the reply is the one the prompt gets alone."""
    model, tokenizer = tiny
    prompt = "A prompt no earlier test has sent: seven silver swans swam south"
    ids = list(tokenizer.encode(prompt))
    c = client(server)
    scored = c.completions.create(model="tiny", prompt=prompt, max_tokens=4, echo=True,
                                  logprobs=1)
    assert scored.usage.prompt_tokens_details.cached_tokens == len(ids) - 1
    want, _ = greedy_text(model, tokenizer, ids, 4)
    assert scored.choices[0].text == prompt + want


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 70000) | st.floats(-3, 3)
                     | st.text(max_size=6),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)
_FIELDS = ["model", "prompt", "max_tokens", "logprobs", "echo", "best_of", "suffix", "n",
           "stream", "stream_options", "temperature", "top_p", "seed", "stop", "logit_bias",
           "frequency_penalty", "presence_penalty", "user", "other"]


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(_FIELDS), _JSON, max_size=8), st.booleans())
def test_the_parser_answers_any_body_with_a_request_or_a_named_error(body, well_formed):
    if well_formed:  # most fuzzed bodies fail early: half the time make the start valid
        body = {"model": "m", "prompt": "p", **{k: v for k, v in body.items()
                                                if k not in ("model", "prompt")}}
    parsed = parse_completions_request(body)
    if isinstance(parsed, ApiError):
        assert parsed.status == 400 and parsed.param is not None or "JSON object" in \
            parsed.message
        return
    chats = parsed.chats()
    assert chats and all(c.prompt is not None and not c.messages for c in chats)
    assert len(chats) * parsed.chat.n <= 128
    assert parsed.chat.max_tokens > 0 or parsed.echo
    assert parsed.chat.score_prompt == (parsed.echo and parsed.logprobs is not None)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=5), max_size=12), st.integers(0, 50))
def test_legacy_logprobs_offsets_count_each_token_s_characters(tokens, offset):
    entries = [{"token": t, "logprob": -1.0, "top_logprobs": [{"token": t, "logprob": -1.0}]}
               for t in tokens]
    lp = legacy_logprobs(entries, offset)
    assert lp["tokens"] == tokens and len(lp["text_offset"]) == len(tokens)
    for i, start in enumerate(lp["text_offset"]):
        assert start == offset + len("".join(tokens[:i]))
