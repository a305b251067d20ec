"""The benchmarks' bootstrap statistics (bench/common.py): what their intervals cover."""

from __future__ import annotations

import numpy as np
import pytest
from common import median_ci, paired_ratio_ci, ratio_ci, switched_trials


def drifting_pairs(rounds: int, ratio: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two arms timed back to back per round on a machine whose speed drifts 3x between rounds:
    arm a always costs ``ratio`` times arm b, up to 1% noise."""
    rng = np.random.default_rng(seed)
    machine = rng.uniform(1.0, 3.0, rounds)  # (rounds,)
    b = 100.0 * machine * rng.normal(1.0, 0.01, rounds)
    a = ratio * 100.0 * machine * rng.normal(1.0, 0.01, rounds)
    return a, b


def test_paired_ratio_sees_through_drift_that_blinds_independent_resampling() -> None:
    a, b = drifting_pairs(30, 1.05)
    ratio, lo, hi = paired_ratio_ci(a, b)
    assert lo <= 1.05 <= hi
    assert lo > 1.0  # the 5% difference is resolved
    _, ind_lo, ind_hi = ratio_ci(a, b)
    assert ind_lo < 1.0 < ind_hi  # resampling arms apart mixes the drift into the interval
    assert hi - lo < (ind_hi - ind_lo) / 5


def test_paired_ratio_is_the_median_of_per_round_ratios() -> None:
    a, b = [2.0, 9.0, 4.0], [1.0, 3.0, 4.0]
    ratio, lo, hi = paired_ratio_ci(a, b)
    assert ratio == 2.0
    assert 1.0 <= lo <= ratio <= hi <= 3.0


def test_equal_arms_give_one() -> None:
    a, _ = drifting_pairs(10, 1.0)
    assert paired_ratio_ci(a, a) == (1.0, 1.0, 1.0)


@pytest.mark.parametrize(("a", "b", "match"), [
    ([1.0, 2.0], [1.0], "equal counts"),
    ([1.0], [0.0], "b > 0"),
    ([-1.0], [1.0], "a >= 0"),
    ([], [], "non-empty"),
])
def test_paired_ratio_rejects_what_it_cannot_pair(a, b, match) -> None:
    with pytest.raises(ValueError, match=match):
        paired_ratio_ci(a, b)


def test_median_ci_brackets_the_median() -> None:
    values = np.random.default_rng(1).normal(10.0, 1.0, 50)
    median, lo, hi = median_ci(values)
    assert lo <= median <= hi
    assert median == pytest.approx(float(np.median(values)))


def test_switched_trials_alternate_the_order_and_leave_the_switch_on() -> None:
    states: list[bool] = []
    on, off, outputs = switched_trials(states.append, lambda: states[-1], trials=3)
    assert states == [True, False, False, True, True, False, True]  # last: left on
    assert [state for state, _ in outputs] == states[:-1]
    assert all(state == out for state, out in outputs)  # each run saw its own state
    assert len(on) == len(off) == 3 and all(t >= 0 for t in on + off)
