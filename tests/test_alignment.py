"""Edit plans between a cached sequence and a new one: the shapes, and that every plan
describes the new sequence exactly (hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nexus_mlx.agent.alignment import Run, common_prefix, plan_edit
from nexus_mlx.errors import ArgumentError

RUN = list(range(100, 160))  # 60 distinct ids: a run worth reusing


def test_append_and_identical():
    plan = plan_edit([1, 2, 3], [1, 2, 3, 4, 5])
    assert (plan.kind, plan.prefix, plan.tail_start) == ("append", 3, 3)
    same = plan_edit([1, 2, 3], [1, 2, 3])
    assert (same.kind, same.prefix, same.deleted) == ("append", 3, 0)


def test_deletion_in_the_middle_reuses_the_suffix():
    old = [1, 2, 3, 7, 8, 9] + RUN
    new = [1, 2, 3] + RUN + [5, 6]
    plan = plan_edit(old, new)
    assert plan.kind == "reuse" and plan.prefix == 3
    assert plan.runs == (Run(6, 3, 60),)
    assert (plan.deleted, plan.inserted, plan.runs[0].delta, plan.tail_start) == (3, 0, -3, 63)


def test_edit_in_the_middle_inserts_before_the_block():
    old = [1, 2, 7] + RUN
    new = [1, 2, 8, 8, 8] + RUN
    plan = plan_edit(old, new)
    assert (plan.kind, plan.prefix, plan.inserted, plan.deleted) == ("reuse", 2, 3, 1)
    assert plan.runs == (Run(3, 5, 60),)


def test_short_matches_are_reencoded():
    plan = plan_edit([1, 2, 3, 4, 5, 6], [1, 9, 3, 4, 5, 6], min_reuse=8)
    assert (plan.kind, plan.prefix, plan.tail_start) == ("reencode", 1, 1)


def test_bad_arguments():
    with pytest.raises(ArgumentError, match="min_reuse"):
        plan_edit([1], [1], min_reuse=True)
    with pytest.raises(ArgumentError, match="negative"):
        plan_edit([1, -1], [1])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 6), max_size=60), st.lists(st.integers(0, 6), max_size=60),
       st.integers(1, 8))
def test_every_plan_rebuilds_the_new_sequence(old, new, min_reuse):
    a, b = np.array(old, np.int64), np.array(new, np.int64)
    plan = plan_edit(a, b, min_reuse)
    p = plan.prefix
    assert p == common_prefix(a, b) and np.array_equal(a[:p], b[:p])
    if plan.kind == "append":
        assert p == a.size
        return
    assert plan.tail_start >= p
    if plan.kind == "reuse":
        sources = plan.sources()
        assert sources.size == plan.tail_start <= b.size
        copied = sources[sources >= 0]
        assert np.unique(copied).size == copied.size  # an old row is reused once at most
        for run in plan.runs:
            assert run.length >= min_reuse and run.old >= p and run.new >= p
            assert np.array_equal(a[run.old:run.old + run.length], b[run.new:run.new + run.length])
        news = [run.new for run in plan.runs]
        assert news == sorted(news)
        assert plan.deleted == a.size - p - plan.reused
        assert plan.inserted == int((sources[p:] == -1).sum())


def test_a_shuffled_list_reuses_every_moved_span():
    head, tools, rest = [1, 2], [list(range(200 + 100 * t, 260 + 100 * t)) for t in range(3)], RUN
    old = head + tools[0] + tools[1] + tools[2] + rest
    new = head + tools[2] + tools[0] + tools[1] + rest + [7]
    plan = plan_edit(old, new, min_reuse=16)
    assert plan.kind == "reuse" and plan.prefix == 2 and plan.inserted == 0 and plan.deleted == 0
    assert plan.runs[0] == Run(122, 2, 60)  # tools[2] moved to the front
    assert plan.runs[1] == Run(2, 62, 120)  # tools[0] + tools[1] moved back together with it
    assert plan.runs[2] == Run(182, 182, 60)  # the conversation did not move
    assert plan.tail_start == len(new) - 1


def test_two_edits_in_one_request():
    old = [1] + RUN + [5, 5, 5] + list(range(300, 360)) + [9]
    new = [1, 4, 4] + RUN + list(range(300, 360)) + [8, 8]
    plan = plan_edit(old, new, min_reuse=16)
    assert plan.runs == (Run(1, 3, 60), Run(64, 63, 60))
    assert (plan.inserted, plan.deleted, plan.tail_start) == (2, 4, 123)
