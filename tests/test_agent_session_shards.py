"""The session benchmark in shards: trajectory ranges, and merging shard results into one."""

import json

import pytest
from agent_session import ARMS, context_room, merge_shards, summarize, trajectory_range

from nexus_mlx.models.arch import model_plan

SETTINGS = {"model": "m", "n_trajectories": 4, "requests": 3, "tools_per_trajectory": [3],
            "idle_heal": True, "tool_blocks": True, "decode_tokens": 16, "call_tokens": 96,
            "questions": "offered tools", "budgets": [2.0, 5.0], "allocator": "sur", "seed": 0,
            "calls": "answered"}


def _record(trajectory: int, request: int, edit: str, depth: int) -> dict:
    arms = {arm: {"ttft_ms": 100.0 * (1 + i) + trajectory, "computed": 10, "kl": 0.0,
                  "agree16": arm != "repair-2" or trajectory % 2 == 0,
                  "calls_identical": None}
            for i, arm in enumerate(ARMS)}
    return {"trajectory": trajectory, "request": request, "edit": edit, "depth": depth,
            "arms": arms}


def _shard(trajectories: list[int], **changes) -> dict:
    records = [_record(t, r, e, 900 + 200 * t)
               for t in trajectories for r, e in enumerate(("first", "append", "delete"))]
    return {**SETTINGS, "model_info": {}, "records": records, "machine": {"date": "d"},
            **changes}


def test_merged_shards_equal_one_run_of_all_trajectories():
    merged = merge_shards([_shard([2, 3]), _shard([0, 1])])
    whole = _shard([0, 1, 2, 3])["records"]
    assert merged["records"] == whole  # trajectory order
    assert merged["summary"] == summarize([r for r in whole if r["request"] > 0], ARMS)
    assert merged["trajectories"] == [0, 1, 2, 3] and merged["depths"] == [900, 1500]
    assert [s["trajectories"] for s in merged["shards"]] == [[2, 3], [0, 1]]
    assert merged["summary"]["repair-2"]["delete"]["agree16"] == 0.5


def test_shards_of_other_settings_or_the_same_trajectory_are_refused():
    with pytest.raises(ValueError, match="differ in budgets, seed"):
        merge_shards([_shard([0]), _shard([1], budgets=[5.0], seed=1)])
    with pytest.raises(ValueError, match="trajectory 1 is in shards 0 and 1"):
        merge_shards([_shard([0, 1]), _shard([1, 2])])
    with pytest.raises(ValueError, match="nothing"):
        merge_shards([])


@pytest.mark.parametrize(("text", "span"), [("0:5", (0, 5)), ("5:", (5, 20)), (":3", (0, 3)),
                                            ("7", (7, 8))])
def test_trajectory_ranges(text, span):
    assert trajectory_range(text, 20) == span


@pytest.mark.parametrize("text", ["5:5", "0:21", "-1:3", "a:b"])
def test_bad_trajectory_ranges_stop_with_a_message(text):
    with pytest.raises(SystemExit, match="--trajectories"):
        trajectory_range(text, 20)


def test_divergence_is_the_first_differing_token():
    from agent_session import divergence

    assert divergence([1, 2, 3], [1, 2, 3]) is None
    assert divergence([1, 5, 3], [1, 2, 3]) == 1
    assert divergence([1, 2], [1, 2, 3]) == 2  # stopped early: it leaves the reference there


def _arm(margins, diverge, stale=10, agree16=True, calls=None, heal_ms=50.0, ttft=100.0):
    return {"margins": margins, "diverge": diverge, "stale": stale, "agree16": agree16,
            "calls_identical": calls, "heal_ms": heal_ms, "ttft_ms": ttft}


def test_the_guard_replay_fixes_only_replies_it_fires_on_in_time():
    from guard_sweep import replay

    late = _arm([3.0, 2.0, 0.2, 0.1], diverge=1, agree16=False, calls=False)
    assert replay(late, 0.5)["fire"] == 2 and not replay(late, 0.5)["agree16"]  # after it left
    assert replay(late, 2.5) == {"fire": 1, "agree16": True, "call": True, "added_ms": 50.0,
                                 "step_ms": 0.0}  # at the divergence: the reference's reply
    assert replay(late, 5.0)["step_ms"] == 50.0  # at the first token: counts in TTFT
    clean = _arm([0.1, 3.0], diverge=None, stale=0)
    assert replay(clean, 1.0)["fire"] is None  # no stale rows: nothing to heal
    with pytest.raises(ValueError, match="margins"):
        replay({"stale": 1, "diverge": None}, 1.0)


def test_the_guard_sweep_scores_deep_requests_against_the_prefix_cache():
    from guard_sweep import sweep_cell

    def record(edit, depth, arm):
        return {"edit": edit, "depth": depth, "arms": {"prefix": {"ttft_ms": 600.0},
                                                       "repair-5": arm}}

    records = [record("tools", 2000, _arm([0.3, 4.0], diverge=0, agree16=False, calls=False)),
               record("tools", 2000, _arm([4.0, 4.0], diverge=None, calls=True)),
               record("append", 2000, _arm([0.1], diverge=None, stale=0))]
    off, on = sweep_cell(records, "repair-5", 0.1), sweep_cell(records, "repair-5", 0.5)
    assert off["deep"]["agree16"] == 0.5 and off["deep"]["fired"] == 0.0
    assert on["deep"]["agree16"] == 1.0 and on["deep"]["calls_count"] == 2
    assert on["deep"]["fired"] == 0.5 and on["all"]["n"] == 3
    assert off["speedup_incl_guard"]["tools"] == 6.0 and on["speedup_incl_guard"]["tools"] == 4.8
    assert on["speedup_ttft"]["tools"] == 4.8  # it fired at the first token: a TTFT cost
    late = sweep_cell([record("tools", 2000, _arm([4.0, 0.3], diverge=1, agree16=False))],
                      "repair-5", 0.5)
    assert late["speedup_ttft"]["tools"] == 6.0 and late["speedup_incl_guard"]["tools"] == 4.0


def test_the_guard_check_pairs_only_requests_that_ran_the_arm(tmp_path):
    from guard_sweep import check

    unguarded = [{"trajectory": 0, "request": r, "arms": {
        "repair-2": _arm([0.5, 4.0], diverge=None), "repair-5": _arm([0.5, 4.0], diverge=None)}}
        for r in (1, 2)]
    guarded = {"guard": 1.0, "records": [  # a shard that ran repair-5 only
        {"trajectory": 0, "request": 1, "arms": {"repair-5": {"guarded": 12, "agree16": True}}},
        {"trajectory": 0, "request": 2, "arms": {"repair-5": {"guarded": 0, "agree16": True}}}]}
    path = tmp_path / "guarded.json"
    path.write_text(json.dumps(guarded))
    five, two = check(unguarded, [str(path)], "repair-5"), check(unguarded, [str(path)], "repair-2")
    assert (five["requests"], five["fired_both"], five["fired_only_replay"]) == (2, 1, 1)
    assert five["agree16_run"] == five["agree16_replay"] == 2
    assert two["requests"] == 0


def test_merged_shards_keep_every_cut_trajectory():
    cut = {"trajectory": 2, "request": 7, "depth": 8194}
    merged = merge_shards([_shard([2, 3], cut=[cut]), _shard([0, 1])])  # an older shard: no cut
    assert merged["cut"] == [cut]


def test_context_room_leaves_the_reply_its_positions(tiny):
    model = tiny
    limit = model_plan(model).max_position
    assert limit is not None
    assert context_room(model, decode=24, call_tokens=96) == limit - 96
    assert context_room(model, decode=200, call_tokens=96) == limit - 200
