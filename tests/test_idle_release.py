"""The idle release: once per idle period, never sooner than ``idle_s`` after a request ended.

Real threads, real time: each release is checked against the activity before it (a slow machine
can only delay a release, never bring it forward), one idle period gets one release, requests in
flight hold it off, ``close()`` ends a waiting watcher without a release, and a failing release
is counted and logged, not raised."""

from __future__ import annotations

import threading
import time

import pytest

from nexus_mlx.server.idle import IdleRelease

IDLE_S = 0.3


class Recorder:
    def __init__(self, fail: bool = False) -> None:
        self.times: list[float] = []
        self.fail = fail

    def __call__(self) -> None:
        self.times.append(time.monotonic())
        if self.fail:
            raise RuntimeError("no")


def _until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_one_release_per_idle_period_never_sooner_than_idle_s():
    release = Recorder()
    idle = IdleRelease(IDLE_S, release, busy=lambda: False)
    activity = []
    for _ in range(3):  # requests ending 0.1 s apart: one idle period after the last
        activity.append(time.monotonic())
        idle.activity()
        time.sleep(0.1)
    _until(lambda: idle.releases == 1)
    time.sleep(2 * IDLE_S)
    assert idle.releases == 1, "an idle server is released once"
    activity.append(time.monotonic())
    idle.activity()
    _until(lambda: idle.releases == 2)
    for released in release.times:
        before = max(t for t in activity if t <= released)
        assert released - before >= IDLE_S - 0.01
    idle.close()


def test_requests_in_flight_hold_the_release_off():
    busy = threading.Event()
    busy.set()
    idle = IdleRelease(0.05, Recorder(), busy=busy.is_set)
    idle.activity()
    time.sleep(0.4)
    assert idle.releases == 0
    busy.clear()
    idle.activity()  # the request in flight ended
    _until(lambda: idle.releases == 1)
    idle.close()


def test_close_ends_a_waiting_watcher_without_a_release():
    idle = IdleRelease(30, Recorder(), busy=lambda: False)
    idle.activity()
    started = time.monotonic()
    idle.close()
    assert time.monotonic() - started < 2 and idle.releases == 0
    idle.activity()  # after close: nothing starts
    assert idle._watcher is None


def test_a_failing_release_is_counted_not_raised(caplog):
    idle = IdleRelease(0.05, Recorder(fail=True), busy=lambda: False)
    idle.activity()
    _until(lambda: idle.failures == 1)
    assert idle.stats() == {"idle_releases": 0, "idle_release_failures": 1}
    assert "idle period failed" in caplog.text
    idle.close()


@pytest.mark.parametrize("idle_s", [-1, float("inf"), float("nan"), "60", True, None])
def test_a_bad_idle_time_is_refused(idle_s):
    with pytest.raises(ValueError, match="idle_s"):
        IdleRelease(idle_s, Recorder(), busy=lambda: False)
