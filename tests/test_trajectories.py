"""The session benchmarks' trajectories: deterministic, every edit class, questions the tools serve."""

import json

import pytest
from agent_session import (
    GITHUB_QUERIES,
    LIVE_CALLS,
    LIVE_QUESTIONS,
    question_answers,
    tool_questions,
)
from tasks.trajectories import EDIT_CLASSES, QUESTIONS, make_trajectories, stand_in_result


def _tool(name: str) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": f"the {name} tool",
        "parameters": {"type": "object", "properties": {"repo": {"type": "string"},
                                                        "n": {"type": "integer"}},
                       "required": ["repo", "n"]}}}


POOL = [_tool(f"tool_{i}") for i in range(8)]
RESULTS = {"tool_0": ["zero's result"], "tool_1": ["one's result"]}
ASKS = {"tool_0": ["Ask tool zero"], "tool_3": ["Ask tool three", "Ask tool three again"]}


def _users(request) -> list[str]:
    return [m["content"] for m in request.messages if m["role"] == "user"]


def test_same_seed_same_trajectories_and_every_edit_class_appears():
    one = make_trajectories(POOL, RESULTS, 3, 8, seed=4, tools_per_trajectory=[3, 5])
    two = make_trajectories(POOL, RESULTS, 3, 8, seed=4, tools_per_trajectory=[3, 5])
    assert [[r.messages for r in t.requests] for t in one] == \
           [[r.messages for r in t.requests] for t in two]
    for trajectory in one:
        assert [r.edit for r in trajectory.requests][0] == "first"
        assert set(EDIT_CLASSES) <= {r.edit for r in trajectory.requests}
    assert [len(t.requests[0].tools) for t in one] == [3, 5, 3]


def test_without_questions_every_turn_asks_a_general_question():
    for trajectory in make_trajectories(POOL, RESULTS, 2, 6, seed=1):
        assert all(_users(r)[-1] in QUESTIONS for r in trajectory.requests)


def test_with_questions_each_turn_asks_for_an_offered_tool_that_has_some():
    trajectories = make_trajectories(POOL, RESULTS, 6, 6, seed=2, tools_per_trajectory=4,
                                     questions=ASKS)
    asked = 0
    for trajectory in trajectories:
        for request in trajectory.requests:
            offered = {t["function"]["name"] for t in request.tools}
            last = _users(request)[-1]
            servable = [q for name in offered & set(ASKS) for q in ASKS[name]]
            if request.edit == "first":
                assert servable, "the first tool list offers a tool it asks about"
            if servable:
                assert last in servable
                asked += 1
            else:
                assert last in QUESTIONS
    assert asked > 0


@pytest.mark.parametrize("bad", [dict(n=0), dict(requests=1), dict(tools_per_trajectory=0)])
def test_bad_sizes_are_refused(bad):
    args = {"n": 2, "requests": 4, "tools_per_trajectory": 3, **bad}
    with pytest.raises(ValueError, match="need n >= 1"):
        make_trajectories(POOL, RESULTS, args["n"], args["requests"],
                          tools_per_trajectory=args["tools_per_trajectory"])


def test_the_session_benchmark_asks_the_github_queries_and_live_requests(tmp_path):
    asks = tool_questions(tmp_path / "repo")
    rows = [json.loads(line) for line in GITHUB_QUERIES.read_text().splitlines() if line.strip()]
    assert all(row["query"] in asks[row["tool"]] for row in rows)
    assert set(LIVE_QUESTIONS) <= set(asks)
    assert any(str(tmp_path / "repo") in q for q in asks["git.git_log"])


ANSWERS = {"Ask tool zero": ("tool_0", {"repo": "a/b", "n": 1}, "zero's real result"),
           "Ask tool three": ("tool_3", {"repo": "c/d", "n": 3}, None),
           "Ask tool three again": ("tool_3", {"repo": "e/f", "n": 4}, None)}


def _appended(previous, request):
    """The call and result an append added after ``previous``'s last user turn."""
    call, result = request.messages[len(previous.messages):][:2]
    function = call["tool_calls"][0]["function"]
    return function["name"], json.loads(function["arguments"]), result["content"]


def test_with_answers_an_append_is_the_call_the_last_request_asked_for():
    answered = other = 0
    for trajectory in make_trajectories(POOL, RESULTS, 6, 6, seed=2, tools_per_trajectory=4,
                                        questions=ASKS, answers=ANSWERS):
        for previous, request in zip(trajectory.requests[:-1], trajectory.requests[1:],
                                     strict=True):
            if request.edit != "append":
                continue
            name, arguments, content = _appended(previous, request)
            asked = ANSWERS.get(_users(previous)[-1])
            offered = {t["function"]["name"] for t in previous.tools}
            if asked and asked[0] in offered:
                assert (name, arguments) == asked[:2]
                assert content == (asked[2] or stand_in_result(name, arguments))
                answered += 1
            else:  # a general question: a random offered tool, made-up arguments
                assert name in offered
                other += 1
    assert answered > 0


def test_with_answers_every_later_request_answers_the_last_turn_before_its_edit():
    for trajectory in make_trajectories(POOL, RESULTS, 4, 8, seed=3, tools_per_trajectory=4,
                                        questions=ASKS, answers=ANSWERS):
        removed = 0
        for k, request in enumerate(trajectory.requests[1:], start=1):
            assert request.detail.startswith("called ")
            removed += "removed call" in request.detail
            calls = [m for m in request.messages if m["role"] == "assistant"]
            assert len(calls) == k - removed  # one answer per request, less those deleted
            assert request.messages[-1]["role"] == "user"


def test_the_session_benchmark_answers_each_request_with_its_call(tmp_path):
    repo = tmp_path / "repo"
    live_results = {name: [f"{name} result {i}" for i in range(len(calls))]
                    for name, calls in LIVE_CALLS.items()}
    answers = question_answers(repo, live_results)
    asks = tool_questions(repo)
    assert {q for qs in asks.values() for q in qs} == set(answers)
    name, arguments, result = answers["What time is it in Tokyo right now?"]
    assert (name, arguments, result) == ("time.get_current_time", {"timezone": "Asia/Tokyo"},
                                         "time.get_current_time result 0")
    log = next(q for q in asks["git.git_log"])
    assert answers[log][1] == {"repo_path": str(repo), "max_count": 3}
    assert answers["Star the pallets/flask repository for me"] == (
        "star_repository", {"owner": "pallets", "repo": "flask"}, None)
