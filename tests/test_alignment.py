"""Edit plans between a cached sequence and a new one: the shapes, and that every plan
describes the new sequence exactly (hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nexus_mlx.agent.alignment import common_prefix, plan_edit
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
    assert (plan.block_old, plan.block_new, plan.block_length) == (6, 3, 60)
    assert (plan.deleted, plan.inserted, plan.delta, plan.tail_start) == (3, 0, -3, 63)


def test_edit_in_the_middle_inserts_before_the_block():
    old = [1, 2, 7] + RUN
    new = [1, 2, 8, 8, 8] + RUN
    plan = plan_edit(old, new)
    assert (plan.kind, plan.prefix, plan.inserted, plan.delta, plan.deleted) == ("reuse", 2, 3, 2, 1)


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
        i, j, n = plan.block_old, plan.block_new, plan.block_length
        assert n >= min_reuse and i >= p and j >= p
        assert np.array_equal(a[i:i + n], b[j:j + n])
        assert plan.deleted == a.size - p - n and plan.inserted == j - p
        assert plan.tail_start == j + n <= b.size
