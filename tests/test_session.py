"""The live session against its oracle, a fresh prefill of the same ids: exact where the path is
exact (appends, policy ``exact``, repair at a 100% budget), within a small KL where it repairs on
a budget, and unchanged after every rejected or failed step."""

from __future__ import annotations

import importlib
import json

import jsonschema
import mlx.core as mx
import numpy as np
import pytest
from cache_oracle import live_snapshot, max_diff
from tiny_models import VOCAB, tiny_model

import nexus_mlx.agent.cache_editor as editor_module
import nexus_mlx.agent.session as session_module
import nexus_mlx.agent.session_decode as decode_module
from nexus_mlx.agent.session import DEFAULT_GUARD, Session
from nexus_mlx.agent.session_report import token_logprob
from nexus_mlx.errors import ArgumentError, ModelMismatchError
from nexus_mlx.metrics import next_token_kl
from nexus_mlx.models.forward import forward, make_cache

TOL = 1e-4
RNG = np.random.default_rng(7)
HISTORY = RNG.integers(0, VOCAB, 180)


def _fresh_logits(model, ids) -> np.ndarray:
    return np.array(forward(model, ids, make_cache(model), logits="last")[0, -1])


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def _edits():
    """(name, first request, second request) over the same long history."""
    h = HISTORY.tolist()
    return [
        ("append", h[:120], h),
        ("delete", h, h[:40] + h[70:]),
        ("insert", h, h[:40] + [1, 2, 3, 4, 5] + h[40:]),
        ("replace", h, h[:40] + [9, 9] + h[60:] + [3, 4]),
        ("truncate", h, h[:100]),
        ("shuffle", h, h[:20] + h[100:150] + h[20:100] + h[150:] + [7]),
        ("two edits", h, h[:20] + [3, 3] + h[20:90] + h[95:] + [4]),
    ]


@pytest.mark.parametrize("name,first,second", _edits(), ids=[e[0] for e in _edits()])
@pytest.mark.parametrize("policy,budget", [("exact", 5.0), ("repair", 100.0)])
def test_exact_paths_equal_a_fresh_prefill(model, monkeypatch, name, first, second, policy,
                                           budget):
    monkeypatch.setattr(session_module, "REENCODE_SHARE", float("inf"))  # repair even at 100%
    s = Session(model, None, policy=policy, budget=budget, allocator="dense_tokens", min_reuse=16)
    s.step_ids(first)
    report = s.step_ids(second)
    assert np.array_equal(s.tokens, second)
    assert np.array_equal(s.cache.positions[: s.cache.n_past], np.arange(len(second)))
    assert max_diff(s.next_token_logits(), _fresh_logits(model, second)) <= TOL
    if name == "append":
        assert (report.path, report.reused, report.computed) == ("append", 120, 60)
    elif name == "truncate":
        assert (report.path, report.reused, report.computed) == ("truncate", 99, 1)
    elif policy == "exact":
        assert report.path == "reencode" and report.spliced == 0
    else:
        assert report.path == "repair" and report.spliced > 0 and report.repaired == report.spliced
    assert report.reused + report.spliced + report.computed == len(second)
    assert s.stale_rows == 0 and report.stale == 0


@pytest.mark.parametrize("budget,path", [(5.0, "repair"), (70.0, "repair"), (75.0, "reencode"),
                                         (100.0, "reencode")])
def test_a_repair_as_costly_as_a_reencode_reencodes(model, budget, path):
    """Deleting 10 rows before a 40-row suffix: a repair computes the new token and ceil(b%) of
    the 40 moved rows; from 75% that reaches REENCODE_SHARE of the re-encode's 41 rows."""
    h = HISTORY.tolist()[:130]
    s = Session(model, None, budget=budget, allocator="dense_tokens", min_reuse=16)
    s.step_ids(h)
    second = h[:80] + h[90:] + [7]
    report = s.step_ids(second)
    assert report.path == path, report.reason
    if path == "reencode":
        assert "re-encoded instead" in report.reason and s.stale_rows == 0
        assert max_diff(s.next_token_logits(), _fresh_logits(model, second)) <= TOL
    else:
        assert report.repaired == -(-budget * 40 // 100) and s.stale_rows > 0


def test_a_moved_span_is_reused_in_its_own_run(model):
    h = HISTORY.tolist()
    s = Session(model, None, budget=5.0, allocator="dense_tokens", min_reuse=16, guard=None)
    s.step_ids(h)
    report = s.step_ids(h[:20] + h[100:150] + h[20:100] + h[150:] + [7])
    assert report.path == "repair" and "3 runs" in report.reason
    assert (report.reused, report.spliced, report.computed) == (20, 160, 1)
    assert report.repaired == 8  # ceil(5% of 160) recomputed
    # every row from the first one not recomputed on differs from a fresh prefill
    assert report.stale == s.stale_rows and 159 <= report.stale <= 161
    assert np.array_equal(s.tokens[:70], h[:20] + h[100:150])


def test_later_steps_recompute_their_budget_of_stale_rows(model):
    h = HISTORY.tolist()
    s = Session(model, None, budget=20.0, allocator="dense_tokens", min_reuse=16)
    s.step_ids(h)
    s.step_ids(h[:40] + h[70:])
    assert s.stale_rows == 110  # the moved rows, from row 40 to the end
    report = s.step_ids(h[:40] + h[70:] + [1, 2, 3])
    assert report.path == "append" and report.computed == 3
    assert report.repaired == 22  # ceil(20% of 110), chosen for the new tokens
    assert report.stale == s.stale_rows >= 110  # the new rows sit on stale ones too
    exact = Session(model, None, policy="exact", min_reuse=16)
    exact.step_ids(h)
    exact.step_ids(h[:40] + h[70:])
    assert exact.stale_rows == 0 and exact.step_ids(h[:40] + h[70:] + [1]).repaired == 0


def test_the_guard_heals_every_stale_row_before_a_close_call(model):
    h = HISTORY.tolist()
    second = h[:40] + h[70:] + [7]

    def session(guard):
        s = Session(model, None, budget=5.0, allocator="dense_tokens", min_reuse=16, guard=guard)
        s.step_ids(h)
        return s, s.step_ids(second)

    off, _ = session(None)
    assert off.stale_rows > 100
    never, report = session(0.0)  # no margin is below 0: the guard never fires
    assert report.guarded == 0 and never.stale_rows == off.stale_rows and never.guard is None
    assert np.array_equal(np.array(never.next_token_logits()), np.array(off.next_token_logits()))
    always, report = session(1e9)  # every token is a close call: the step ends exact
    assert report.guarded == off.stale_rows and report.stale == always.stale_rows == 0
    assert "guard" in report.timings and report.timings["total"] >= report.timings["guard"]
    assert max_diff(always.next_token_logits(), _fresh_logits(model, second)) <= TOL
    off.guard = 1e9  # while decoding: the token after the close call is decided on exact rows
    assert max_diff(off.advance(5), _fresh_logits(model, second + [5])) <= TOL
    assert off.stale_rows == 0
    for bad in (-1.0, float("inf"), float("nan"), True, "1"):
        with pytest.raises(ArgumentError, match="guard"):
            Session(model, None, guard=bad)
    assert Session(model, None).guard == DEFAULT_GUARD  # on unless turned off


def test_rejected_requests_leave_the_session_unchanged(model):
    s = Session(model, None, allocator="dense_tokens")
    s.step_ids(HISTORY[:50])
    state = live_snapshot(s.cache)
    for bad in ([], [VOCAB], [-1], np.zeros(5000, np.int64)):
        with pytest.raises(ArgumentError):
            s.step_ids(bad)
        assert live_snapshot(s.cache) == state


def test_a_failure_inside_the_repair_restores_every_row(model, monkeypatch):
    h = HISTORY.tolist()
    s = Session(model, None, allocator="dense_tokens", min_reuse=16)
    s.step_ids(h)
    state = live_snapshot(s.cache)
    real = editor_module.forward
    calls = {"n": 0}

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # after the first chunk of the packed pass was written
            raise RuntimeError("injected failure")
        return real(*args, **kwargs)

    monkeypatch.setattr(editor_module, "forward", failing)
    monkeypatch.setattr(editor_module, "PREFILL_CHUNK", 2)  # the packed pass in several calls
    with pytest.raises(RuntimeError, match="injected"):
        s.step_ids(h[:40] + [1, 2, 3] + h[60:])
    assert live_snapshot(s.cache) == state
    monkeypatch.setattr(editor_module, "forward", real)
    s.step_ids(h + [1])  # still usable: an append
    assert max_diff(s.next_token_logits(), _fresh_logits(model, h + [1])) <= TOL


def test_bad_settings_are_rejected(model):
    for kwargs in ({"policy": "fast"}, {"allocator": "oracle"}, {"budget": True}, {"budget": 120},
                   {"min_reuse": 0}, {"min_reuse": True}, {"min_reuse": 8.5}):
        with pytest.raises(ArgumentError):
            Session(model, None, **kwargs)


# ------------------------------------------------------------------ the real default model

CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Here is a note about rivers. " * 20},
    {"role": "user", "content": "And one about mountains. " * 20},
    {"role": "user", "content": "What is the capital of France?"},
]


def test_a_conversation_appends_then_repairs_a_deleted_message(default_model):
    model, tokenizer = default_model
    s = Session(model, tokenizer, debug=True)
    first = s.generate(CONVERSATION, max_tokens=12)
    assert "Paris" in first.text and first.finish_reason == "stop"
    follow = CONVERSATION + [{"role": "assistant", "content": first.text},
                             {"role": "user", "content": "And of Italy?"}]
    second = s.generate(follow, max_tokens=12)
    assert second.report.path == "append" and second.report.reused > first.report.prompt_tokens
    assert second.report.kl is not None and second.report.kl < 1e-6 and second.report.top1
    without_rivers = [follow[0], *follow[2:]]
    third = s.generate(without_rivers, max_tokens=12)
    r = third.report
    assert r.path == "repair" and r.spliced > 100 and 0 < r.repaired < r.spliced
    assert r.kl is not None and r.kl < 0.05 and r.top1
    assert "Rome" in third.text
    exact = Session(model, tokenizer, policy="exact")
    exact.step(follow)
    assert exact.step(without_rivers).path == "reencode"
    assert next_token_kl(exact.next_token_logits(), s.next_token_logits()) >= 0.0


def test_generate_guards_the_close_calls_of_the_constrained_row(default_model):
    """A processor that flattens the row makes every decoded token a close call the raw
    logits after the step are not: the first token heals the stale rows, and from there the
    session equals a fresh prefill of everything it holds."""
    model, tokenizer = default_model
    s = Session(model, tokenizer, guard=1e-6)
    s.generate(CONVERSATION, max_tokens=2)
    flat = [lambda ids, row: mx.zeros_like(row)]
    reply = s.generate([CONVERSATION[0], *CONVERSATION[2:]], max_tokens=3,
                       logits_processors=flat)
    assert reply.report.path == "repair" and reply.report.guarded == 0 and reply.report.stale
    assert reply.guarded == reply.report.stale and s.stale_rows == 0
    assert max_diff(s.next_token_logits(), _fresh_logits(model, s.tokens)) <= TOL


def test_templates_that_ignore_tools_get_them_as_text(default_model):
    model, tokenizer = default_model
    s = Session(model, tokenizer)
    tool = {"type": "function", "function": {"name": "f_tool", "description": "d",
                                             "parameters": {"type": "object", "properties": {}}}}
    text = tokenizer.decode(s.render(CONVERSATION, tools=[tool]))
    assert "<tools>" in text and '"name": "f_tool"' in text and "<tool_call>" in text
    assert "f_tool" not in tokenizer.decode(s.render(CONVERSATION))
    with pytest.raises(ArgumentError, match="at least one message"):
        s.step([])
    with pytest.raises(ArgumentError, match="role"):
        s.step([{"content": "no role"}])
    assert s.cache.n_past == 0
    mx.eval(s.cache.keys(0))


TIME_TOOL = {"type": "function", "function": {
    "name": "get_current_time", "description": "The current time in an IANA timezone",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}},
                   "required": ["timezone"]}}}
LOG_TOOL = {"type": "function", "function": {
    "name": "git_log", "description": "Recent commits of a git repository",
    "parameters": {"type": "object", "properties": {"max_count": {"type": "integer"}}}}}


def test_tool_turns_in_the_call_format_on_a_template_without_tools(default_model):

    model, tokenizer = default_model
    s = Session(model, tokenizer)
    assert not s.native_tools  # SmolLM2's template ignores tools: the textual rendering is used
    ask = [{"role": "user", "content": "What time is it in Tokyo?"}]
    reply = s.generate(ask, [TIME_TOOL, LOG_TOOL], tool_choice="required", max_tokens=40,
                       parallel_tool_calls=False)
    assert reply.finish_reason == "tool_calls" and len(reply.tool_calls) == 1
    call = reply.tool_calls[0]
    assert call.name in ("get_current_time", "git_log")
    schema = (TIME_TOOL if call.name == "get_current_time" else LOG_TOOL)["function"]["parameters"]
    jsonschema.validate(call.arguments, schema)
    named = s.generate(ask, [TIME_TOOL, LOG_TOOL], max_tokens=40, parallel_tool_calls=False,
                       tool_choice={"type": "function", "function": {"name": "git_log"}})
    assert [c.name for c in named.tool_calls] == ["git_log"]
    follow = ask + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "1", "type": "function", "function": {
                "name": "get_current_time", "arguments": '{"timezone": "Asia/Tokyo"}'}}]},
        {"role": "tool", "tool_call_id": "1", "content": '{"datetime": "2026-12-01T18:00:00+09:00"}'},
    ]
    answer = s.generate(follow, [TIME_TOOL, LOG_TOOL], tool_choice="none", max_tokens=16)
    assert answer.tool_calls == [] and answer.finish_reason in ("stop", "length")
    shaped = s.generate(ask, response_format={"type": "json_schema", "json_schema": {"schema": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        max_tokens=24)
    assert isinstance(json.loads(shaped.text)["city"], str) and shaped.finish_reason == "stop"


@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                 "function": {"name": "get_current_time"}}])
def test_forced_ids_are_fed_in_one_pass(default_model, monkeypatch, choice):
    """A call's opener, closer and the JSON the grammar fixes are fed together: fewer passes,
    the same call, and a cache equal to a fresh prefill of the reply's ids."""
    model, tokenizer = default_model
    ask = [{"role": "user", "content": "What time is it in Tokyo?"}]

    def reply(runs: bool):
        monkeypatch.setattr(decode_module, "FEED_FORCED_RUNS", runs)
        s = Session(model, tokenizer, draft_tokens=0)
        return s, s.generate(ask, [TIME_TOOL, LOG_TOOL], tool_choice=choice, max_tokens=48,
                             parallel_tool_calls=False)

    (s, fast), (_, slow) = reply(True), reply(False)
    assert fast.tool_calls == slow.tool_calls and fast.tool_calls
    assert fast.finish_reason == slow.finish_reason == "tool_calls"
    assert fast.drafts.passes < slow.drafts.passes - 8  # the opener, the name, the closer...
    assert slow.drafts.passes == len(slow.tokens) - 1  # one id per pass (no drafts)
    fresh = make_cache(model)
    want = forward(model, s.cache.tokens[: s.cache.n_past].tolist(), fresh, logits="last")
    assert max_diff(s.next_token_logits(), want[0, -1]) <= TOL
    for layer in (0, len(model.model.layers) - 1):
        assert max_diff(s.cache.keys(layer), fresh.keys(layer)) <= TOL


@pytest.mark.parametrize("max_tokens", [1, 2, 4, 7])
def test_a_reply_cut_inside_a_forced_run_caches_every_id_but_its_last(default_model,
                                                                      max_tokens):
    model, tokenizer = default_model
    s = Session(model, tokenizer, draft_tokens=0)
    ask = [{"role": "user", "content": "What time is it in Tokyo?"}]
    whole = s.generate(ask, [TIME_TOOL], tool_choice="required", max_tokens=48)
    cut = s.generate(ask, [TIME_TOOL], tool_choice="required", max_tokens=max_tokens)
    assert cut.finish_reason == "length" and cut.tokens == whole.tokens[:max_tokens]
    held = s.cache.tokens[: s.cache.n_past].tolist()
    assert held[len(held) - (max_tokens - 1):] == cut.tokens[:-1]
    fresh = make_cache(model)
    want = forward(model, held, fresh, logits="last")
    assert max_diff(s.next_token_logits(), want[0, -1]) <= TOL


def _nudge(tokenizer, start: str = "<tool_call>"):
    """A logits processor that leads the reply to begin with ``start`` (by default a call's
    opener); the model decides the rest."""
    lead = tokenizer.encode(start, add_special_tokens=False)

    def nudge(ids: mx.array, logits: mx.array) -> mx.array:
        if ids.size >= len(lead):
            return logits
        return logits + 100.0 * (mx.arange(logits.shape[-1]) == lead[ids.size])
    return nudge


def test_stop_strings_end_prose_but_never_cut_a_call(default_model):
    """Under "auto" a stop string written inside a call (the newline after the opener, the
    braces of its JSON) does not end the turn; in prose it does."""
    model, tokenizer = default_model
    s = Session(model, tokenizer)
    ask = [{"role": "user", "content": "What time is it in Tokyo?"}]
    reply = s.generate(ask, [TIME_TOOL], max_tokens=40, parallel_tool_calls=False,
                       stop=["\n", "}"], logits_processors=[_nudge(tokenizer)])
    assert reply.finish_reason == "tool_calls" and [c.name for c in reply.tool_calls] == [
        "get_current_time"], reply.text
    jsonschema.validate(reply.tool_calls[0].arguments, TIME_TOOL["function"]["parameters"])
    prose = s.generate(ask, [TIME_TOOL], max_tokens=24, stop=[" time"],
                       logits_processors=[_nudge(tokenizer, "The current time")])
    assert (prose.finish_reason, prose.text, prose.tool_calls) == ("stop_string", "The current",
                                                                  [])


def test_logprobs_are_the_model_s_own_next_token_distribution(default_model):
    """Oracle: one fresh forward over the prompt and the reply gives, at each reply position,
    the log-softmax the session recorded (free text: no constraint, no processors)."""
    model, tokenizer = default_model
    s = Session(model, tokenizer)
    ask = [{"role": "user", "content": "Name three colours."}]
    streamed = []
    reply = s.generate(ask, max_tokens=8, logprobs=3, on_logprob=streamed.append)
    assert reply.logprobs == streamed and len(reply.logprobs) == len(reply.tokens) - (
        reply.finish_reason == "stop")
    prompt = s.render(ask)
    logits = np.array(forward(model, [*prompt, *reply.tokens], make_cache(model)))[0]
    for i, scored in enumerate(reply.logprobs):
        row = logits[len(prompt) - 1 + i].astype(np.float64)
        want = row - np.log(np.exp(row - row.max()).sum()) - row.max()
        assert scored.id == reply.tokens[i] and abs(scored.logprob - want[scored.id]) < 1e-3
        assert [t for t, _ in scored.top] == list(np.argsort(-want, kind="stable")[:3])
        assert scored.top[0][0] == scored.id  # greedy: the chosen id is the likeliest
    with pytest.raises(ArgumentError, match="logprobs"):
        s.generate(ask, max_tokens=2, logprobs=21)


def test_a_logprob_is_taken_in_float32_and_is_always_finite():
    rng = np.random.default_rng(3)
    logits = (rng.normal(size=64) * 20).astype(np.float32)
    want = logits.astype(np.float64) - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
    for dtype in (mx.float32, mx.bfloat16, mx.float16):
        row = mx.array(logits).astype(dtype)
        exact = np.array(row.astype(mx.float32), dtype=np.float64)
        exact = exact - np.log(np.exp(exact - exact.max()).sum()) - exact.max()
        scored = token_logprob(row, 5, 3, vocab_size=64)
        assert abs(scored.logprob - exact[5]) < 1e-4  # no rounding past the logits' own
        assert [i for i, _ in scored.top] == list(np.argsort(-exact, kind="stable")[:3])
    assert abs(token_logprob(mx.array(logits), 5, 0, 64).logprob - want[5]) < 1e-4
    masked = mx.array(np.full(8, -np.inf, np.float32)).at[2].add(mx.inf)  # nothing finite
    assert token_logprob(masked, 3, 2, 8).logprob == -9999.0
    assert token_logprob(mx.array(logits), 5, 3, vocab_size=4).top[0][0] < 4  # padded head


def test_auto_with_a_response_format_answers_in_the_format_or_calls(default_model):
    model, tokenizer = default_model
    s = Session(model, tokenizer)
    ask = [{"role": "user", "content": "Which city is Tokyo's time for? Answer as JSON."}]
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": schema}}
    shaped = s.generate(ask, [TIME_TOOL], response_format=fmt, max_tokens=24,
                        logits_processors=[_nudge(tokenizer, '{"city')])
    called = s.generate(ask, [TIME_TOOL], response_format=fmt, max_tokens=60,  # its own choice
                        parallel_tool_calls=False)
    assert shaped.tool_calls == [] and shaped.finish_reason == "stop", shaped.text
    jsonschema.validate(json.loads(shaped.content), schema)
    assert [c.name for c in called.tool_calls] == ["get_current_time"], called.text
    assert called.finish_reason == "tool_calls" and called.content == ""


def test_generated_calls_drop_optional_arguments_the_conversation_does_not_support(
        default_model):
    """Unrestrained, SmolLM2 invents a git_log max_count (1000): grounded, the call drops it and
    the reply keeps the text the model wrote; a count the user asked for stays."""
    model, tokenizer = default_model
    named = {"type": "function", "function": {"name": "git_log"}}

    def call(request: str, ground: bool):
        reply = Session(model, tokenizer).generate(
            [{"role": "user", "content": request}], [TIME_TOOL, LOG_TOOL], tool_choice=named,
            max_tokens=40, optional_margin=0, ground_optional=ground)
        return reply, reply.tool_calls[0]

    raw_reply, raw = call("Show the recent commits", False)
    reply, grounded = call("Show the recent commits", True)
    assert reply.text == raw_reply.text and raw.dropped == {}
    assert "max_count" in raw.arguments and grounded.dropped == raw.arguments  # invented
    assert grounded.arguments == {}
    _, kept = call("Show the last 1000 commits", True)  # the model writes the count it was given
    assert kept.arguments == {"max_count": 1000} and kept.dropped == {}


def test_a_saved_session_continues_exactly_and_refuses_other_models(model, tmp_path):
    from nexus_mlx.agent.session_file import load_session, save_session
    from nexus_mlx.errors import FormatError, ModelMismatchError

    h = HISTORY.tolist()
    s = Session(model, None, allocator="dense_tokens", budget=10.0, min_reuse=16)
    s.step_ids(h[:160])
    s.step_ids(h[:20] + h[30:150])  # a repair leaves stale rows: they are saved with the rows
    assert s.stale_rows > 0
    path = save_session(s, tmp_path / "s.safetensors")
    assert [p.name for p in tmp_path.iterdir()] == ["s.safetensors"]  # no partial file left
    back = load_session(model, None, path)
    assert (back.budget, back.allocator) == (10.0, "dense_tokens")
    assert live_snapshot(back.cache) == live_snapshot(s.cache)
    assert back.stale_rows == s.stale_rows
    assert max_diff(back.next_token_logits(), s.next_token_logits()) == 0.0
    follow = h[:20] + h[30:150] + [1, 2]
    assert back.step_ids(follow).path == s.step_ids(follow).path == "append"
    assert max_diff(back.next_token_logits(), s.next_token_logits()) <= TOL
    assert back.stale_rows == s.stale_rows
    with pytest.raises(ModelMismatchError, match="model"):
        load_session(tiny_model("llama-untied"), None, path)
    (tmp_path / "bad.safetensors").write_bytes(path.read_bytes()[:200])
    with pytest.raises(FormatError):
        load_session(model, None, tmp_path / "bad.safetensors")
    with pytest.raises(FormatError):
        load_session(model, None, tmp_path / "missing.safetensors")
    named = save_session(s, tmp_path / "chat.session")  # any name: read back as safetensors
    assert named.name == "chat.session"
    assert live_snapshot(load_session(model, None, named).cache) == live_snapshot(s.cache)


def test_healing_every_stale_row_equals_a_fresh_prefill(model):
    h = HISTORY.tolist()
    s = Session(model, None, budget=5.0, allocator="dense_tokens", min_reuse=16)
    s.step_ids(h)
    second = h[:30] + [4, 4] + h[60:120] + h[20:30] + h[130:]
    report = s.step_ids(second)
    assert report.path == "repair" and s.stale_rows > 20
    stale = s.stale_rows
    assert s.heal(max_rows=5) == 5 and s.stale_rows == stale - 5
    assert s.heal() == stale - 5 and s.stale_rows == 0 and s.heal() == 0
    fresh = make_cache(model)
    want = forward(model, second, fresh, logits="last")[0, -1]
    for layer in range(2):
        assert max_diff(s.cache.keys(layer), fresh.keys(layer)) <= TOL
        assert max_diff(s.cache.values(layer), fresh.values(layer)) <= TOL
    assert max_diff(s.next_token_logits(), want) <= TOL
    with pytest.raises(ArgumentError):
        s.heal(max_rows=-1)


def test_tokens_decoded_over_stale_rows_are_stale_and_healed(model):
    h = HISTORY.tolist()
    s = Session(model, None, budget=5.0, allocator="dense_tokens", min_reuse=16)
    s.step_ids(h)
    s.step_ids(h[:30] + h[60:])  # a deletion repaired on 5%: stale rows remain
    stale = s.stale_rows
    reply = [int(t) for t in RNG.integers(0, VOCAB, 6)]
    for token in reply:
        s.advance(token)
    assert s.stale_rows == stale + len(reply)  # each attended to stale rows
    assert s.heal() == stale + len(reply) and s.stale_rows == 0
    fresh = make_cache(model)
    want = forward(model, h[:30] + h[60:] + reply, fresh, logits="last")[0, -1]
    for layer in range(2):
        assert max_diff(s.cache.keys(layer), fresh.keys(layer)) <= TOL
        assert max_diff(s.cache.values(layer), fresh.values(layer)) <= TOL
    assert max_diff(s.next_token_logits(), want) <= TOL
    exact = Session(model, None, policy="exact", min_reuse=16)
    exact.step_ids(h)
    exact.advance(reply[0])
    assert exact.stale_rows == 0  # nothing stale beneath: the decoded row is exact


def test_a_failed_decode_step_leaves_the_session_as_it_was(model, monkeypatch):
    s = Session(model, None, allocator="dense_tokens")
    s.step_ids(HISTORY[:50])
    state, logits = live_snapshot(s.cache), np.array(s.next_token_logits())

    # the module, not the function the package exports under its name; next_rows' pass
    generate_module = importlib.import_module("nexus_mlx.decode.generate")
    real = generate_module.forward_tail

    def broken(*args, **kwargs):  # fails after writing its rows
        real(*args, **kwargs)
        raise RuntimeError("injected")

    monkeypatch.setattr(generate_module, "forward_tail", broken)
    with pytest.raises(RuntimeError, match="injected"):
        s.advance(3)
    with pytest.raises(RuntimeError, match="injected"):
        s.editor.advance_many([3, 4, 5], 3)
    assert live_snapshot(s.cache) == state
    assert np.array_equal(np.array(s.next_token_logits()), logits)


@pytest.mark.parametrize("tamper,match", [
    (lambda a, m: m["settings"].update(turbo=True), "unknown keys"),
    (lambda a, m: m["settings"].update(budget=-5), "settings is invalid"),
    (lambda a, m: a.update(next_logits=a["next_logits"][:-1]), "next_logits"),
    (lambda a, m: m.update(annotations=[1]), "annotations"),
])
def test_a_tampered_session_file_is_refused_naming_the_field(model, tmp_path, tamper, match):
    from nexus_mlx.agent.session_file import load_session, save_session
    from nexus_mlx.errors import FormatError

    s = Session(model, None, allocator="dense_tokens", min_reuse=16)
    s.step_ids(HISTORY[:60])
    path = save_session(s, tmp_path / "s.safetensors")
    arrays, metadata = mx.load(str(path), return_metadata=True)
    meta = json.loads(metadata["nexus"])
    tamper(arrays, meta)
    mx.save_safetensors(str(path), arrays, metadata={"nexus": json.dumps(meta)})
    with pytest.raises(FormatError, match=match):
        load_session(model, None, path)


def test_annotations_are_kept_beside_a_saved_session_and_must_be_json(model, tmp_path):
    from nexus_mlx.agent.session_file import read_session, save_session

    s = Session(model, None)
    s.step_ids(HISTORY[:20])
    path = save_session(s, tmp_path / "s.safetensors", {"prompt": 17, "label": "a"})
    saved = read_session(model, None, path)
    assert saved.annotations == {"prompt": 17, "label": "a"}
    assert list(saved.session.tokens) == list(HISTORY[:20])
    assert read_session(model, None, save_session(s, tmp_path / "t")).annotations == {}
    with pytest.raises(TypeError):
        save_session(s, tmp_path / "u", {"prompt": object()})
    assert not (tmp_path / "u").exists()


def test_a_session_seeded_from_a_bare_cache_continues_as_a_fresh_prefill(model):
    """``copy_prefix`` from a cache of exact rows (a prompt scorer's): the next step computes
    only what follows the copied rows and its logits equal a fresh prefill's."""
    donor = make_cache(model)
    forward(model, HISTORY[:120], donor, logits="last")
    s = Session(model, None)
    s.copy_prefix(donor, 100)
    assert s.cache.n_past == 100 and s.stale_rows == 0 and donor.n_past == 120
    report = s.step_ids(HISTORY[:150])
    assert (report.path, report.reused, report.computed) == ("append", 100, 50)
    got = np.array(s.next_token_logits())
    assert np.abs(got - _fresh_logits(model, HISTORY[:150])).max() < TOL


def test_copy_prefix_refuses_another_model_s_cache_or_rows_it_lacks(model):
    s = Session(model, None)
    s.step_ids(HISTORY[:40])
    state = live_snapshot(s.cache)
    other = make_cache(tiny_model("qwen2"))
    forward(tiny_model("qwen2"), HISTORY[:20], other, logits="last")
    with pytest.raises(ModelMismatchError):
        s.copy_prefix(other, 10)
    donor = make_cache(model)
    forward(model, HISTORY[:20], donor, logits="last")
    for rows in (-1, 21, True, 2.0):
        with pytest.raises(ArgumentError, match="rows must be an integer in"):
            s.copy_prefix(donor, rows)
    assert live_snapshot(s.cache) == state


# ---- a long append in turns ---------------------------------------------------------------------
def _turns(gen) -> tuple[int, object]:
    """(yields, return value) of a generator of turns run to its end."""
    count = 0
    while True:
        try:
            next(gen)
        except StopIteration as end:
            return count, end.value
        count += 1


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 64 rows in the packed pass and in the turns (both read the same constant)."""
    monkeypatch.setattr(editor_module, "PREFILL_CHUNK", 64)
    monkeypatch.setattr(decode_module, "PREFILL_CHUNK", 64)


def test_a_long_append_takes_a_turn_per_chunk_and_computes_the_same_rows(model, small_chunks):
    ids = np.random.default_rng(11).integers(0, VOCAB, 300)
    whole, turned = (Session(model, None, allocator="dense_tokens") for _ in range(2))
    for s in (whole, turned):
        s.step_ids(ids[:40])
    expected = whole.step_ids(ids)
    yields, report = _turns(decode_module.step_in_turns(turned, ids, None))
    assert yields == 4  # turns end at rows 104, 168, 232 and 296; the step computes the rest
    assert live_snapshot(turned.cache) == live_snapshot(whole.cache)  # the same forward calls
    assert np.array_equal(np.array(turned.next_token_logits()),
                          np.array(whole.next_token_logits()))
    assert (report.path, report.reused, report.computed, report.deleted) == \
        (expected.path, expected.reused, expected.computed, expected.deleted) == \
        ("append", 40, 260, 0)
    assert "prefilled in 5 turns" in report.reason


def test_no_turns_where_rows_are_stale_or_the_request_is_refused(model, small_chunks):
    h = HISTORY.tolist()
    s = Session(model, None, budget=5.0, allocator="dense_tokens", min_reuse=16)
    s.step_ids(h)
    s.step_ids(h[:40] + h[70:])  # a deletion repaired on a budget: stale rows remain
    assert s.stale_rows > 0
    longer = h[:40] + h[70:] + np.random.default_rng(3).integers(0, VOCAB, 200).tolist()
    yields, report = _turns(decode_module.step_in_turns(s, longer, None))
    assert yields == 0 and report.path == "append" and report.computed == 200
    state = live_snapshot(s.cache)
    for bad in (longer + [VOCAB], np.zeros(5000, np.int64)):  # checked before any turn
        with pytest.raises(ArgumentError):
            next(decode_module.step_in_turns(s, bad, None))
        assert live_snapshot(s.cache) == state
