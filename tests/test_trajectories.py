"""The session benchmarks' trajectories: deterministic, every edit class, questions the tools serve."""

import json

import pytest
from agent_session import GITHUB_QUERIES, LIVE_QUESTIONS, tool_questions
from tasks.trajectories import EDIT_CLASSES, QUESTIONS, make_trajectories


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
