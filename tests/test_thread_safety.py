"""The objects the README documents as shareable between threads, checked in fresh processes.

Each scenario (``thread_scenarios.py``) runs in its own interpreter, because the failure being
guarded against kills the process at exit: before :mod:`nexus_mlx._platform.mlx_thread`, four
threads sharing one ``Router`` got the right decisions and then died with SIGABRT
("terminate called without an active exception") in about half the runs (MLX 0.32 frees each
thread's streams and ``mx.compile`` cache after ``join()`` returns, racing the interpreter's
finalization), and sometimes hung in OpenBLAS. Every run must exit 0 with each thread's answers
equal to the single-thread ones. The in-process tests cover the MLX thread itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from nexus_mlx._platform.mlx_thread import MlxThread, blocking, mlx_thread, on_mlx_thread, run_steps

SCRIPT = Path(__file__).resolve().parent / "thread_scenarios.py"


def _run_scenario(name: str, runs: int, threads: int = 4, timeout: float = 420) -> None:
    for run in range(runs):
        try:
            done = subprocess.run([sys.executable, str(SCRIPT), name, "--threads", str(threads)],
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name} run {run}: hung for {timeout:.0f} s")
        if done.returncode == 77:
            pytest.skip(done.stderr.strip())
        tail = done.stderr[-1500:]
        assert done.returncode == 0, f"{name} run {run}: exit code {done.returncode}\n{tail}"
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert not result["errors"], result["errors"]
        assert len(result["threads"]) == threads
        for answers in result["threads"]:
            assert answers == result["single"], f"{name} run {run}: a thread answered otherwise"


def test_a_router_shared_by_four_threads(shared_data):
    _run_scenario("router", runs=2)


@pytest.mark.slow  # two fresh interpreters each loading the model, the embedder and a router
def test_an_agent_shared_by_four_threads(shared_data):
    _run_scenario("agent", runs=2)


def test_an_slb_and_a_registry_shared_by_four_threads(shared_data):
    _run_scenario("slb", runs=3)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["router", "agent"])
def test_soak_eight_threads(shared_data, name):
    _run_scenario(name, runs=6, threads=8, timeout=900)


# ---- the MLX thread --------------------------------------------------------------------------
def test_calls_run_on_one_thread_in_order_and_return_results():
    worker = MlxThread("nexus-mlx-test")
    seen: list[tuple[str, int]] = []

    def record(i: int) -> int:
        seen.append((threading.current_thread().name, i))
        return i * i

    callers = [threading.Thread(target=lambda i=i: record_result.append(worker.run(record, i)))
               for i in range(8)]
    record_result: list[int] = []
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert sorted(record_result) == [i * i for i in range(8)]
    assert {name for name, _ in seen} == {"nexus-mlx-test"}
    worker.stop()


def test_exceptions_reach_the_caller_and_nested_calls_run_inline():
    worker = MlxThread("nexus-mlx-test")

    def inner() -> bool:
        return worker.is_current()

    def outer() -> bool:
        return worker.run(inner)  # would deadlock if it queued behind itself

    assert worker.run(outer) is True
    with pytest.raises(ZeroDivisionError):
        worker.run(lambda: 1 / 0)
    assert worker.run(lambda: 7) == 7  # still serving after an exception
    worker.stop()


def test_submitted_calls_run_before_later_ones_and_report_through_their_future():
    worker = MlxThread("nexus-mlx-test")
    gate, order = threading.Event(), []
    blocker = worker.submit(gate.wait, 30)  # holds the worker until set
    queued = worker.submit(lambda: order.append("submitted") or 1)
    failing = worker.submit(lambda: 1 / 0)
    later = threading.Thread(target=lambda: worker.run(lambda: order.append("run")))
    later.start()
    assert not queued.done()  # nothing waited for it
    gate.set()
    later.join(30)
    assert blocker.result(30) is True and queued.result(30) == 1
    assert isinstance(failing.exception(30), ZeroDivisionError)
    assert order == ["submitted", "run"]
    inline = worker.run(lambda: worker.submit(lambda: 5))  # on the worker: done at once
    assert inline.done() and inline.result() == 5
    worker.stop()


def test_a_stopped_worker_restarts_unless_final():
    worker = MlxThread("nexus-mlx-test")
    first = worker.run(threading.current_thread)
    worker.stop()
    assert not first.is_alive()
    second = worker.run(threading.current_thread)
    assert second is not first and second.is_alive()
    worker.stop(final=True)
    with pytest.raises(RuntimeError, match="has stopped"):
        worker.run(lambda: None)


def test_the_decorator_uses_the_process_worker():
    @on_mlx_thread
    def where() -> str:
        return threading.current_thread().name

    assert where() == "nexus-mlx" and where.__name__ == "where"
    assert mlx_thread().run(where) == "nexus-mlx"


# ---- generators of steps: concurrent drivers take turns ---------------------------------------
def _steps(name: str, n: int, log: list[tuple[str, int]], fail_at: int | None = None):
    for i in range(n):
        if i == fail_at:
            raise KeyError(name)
        log.append((name, i))
        yield
    return f"{name} done on {threading.current_thread().name}"


def _wait_for_queue(worker: MlxThread, size: int) -> None:
    deadline = time.monotonic() + 30
    while worker._queue.qsize() < size and time.monotonic() < deadline:
        time.sleep(0.01)
    assert worker._queue.qsize() >= size


def test_drivers_take_turns_step_by_step_and_get_their_return_values():
    worker = MlxThread("nexus-mlx-test")
    gate, log, results = threading.Event(), [], {}
    worker.submit(gate.wait, 30)  # holds the worker until both drivers have queued
    drivers = [threading.Thread(target=lambda n=n, k=k: results.__setitem__(
        n, worker.drive(_steps(n, k, log)))) for n, k in (("long", 6), ("short", 2))]
    drivers[0].start()
    _wait_for_queue(worker, 1)
    drivers[1].start()
    _wait_for_queue(worker, 2)
    worker.submit(lambda: log.append(("call", 0)))  # a plain call queued behind both
    gate.set()
    for t in drivers:
        t.join(30)
    assert log[:5] == [("long", 0), ("short", 0), ("call", 0), ("long", 1), ("short", 1)]
    assert [e for e in log if e[0] == "long"] == [("long", i) for i in range(6)]
    assert results == {"long": "long done on nexus-mlx-test",
                       "short": "short done on nexus-mlx-test"}
    worker.stop()


def test_a_failing_driver_raises_in_its_caller_and_the_others_go_on():
    worker = MlxThread("nexus-mlx-test")
    gate, log, outcome = threading.Event(), [], {}
    worker.submit(gate.wait, 30)

    def drive(name: str, fail_at: int | None) -> None:
        try:
            outcome[name] = worker.drive(_steps(name, 4, log, fail_at))
        except KeyError as exc:
            outcome[name] = exc

    threads = [threading.Thread(target=drive, args=("bad", 2)),
               threading.Thread(target=drive, args=("good", None))]
    threads[0].start()
    _wait_for_queue(worker, 1)
    threads[1].start()
    _wait_for_queue(worker, 2)
    gate.set()
    for t in threads:
        t.join(30)
    assert isinstance(outcome["bad"], KeyError) and ("bad", 2) not in log
    assert outcome["good"] == "good done on nexus-mlx-test" and len(log) == 6
    assert worker.run(lambda: 3) == 3
    worker.stop()


def test_steps_run_inline_on_the_worker_and_when_it_stops_mid_way():
    worker = MlxThread("nexus-mlx-test")
    log: list[tuple[str, int]] = []
    assert worker.run(lambda: worker.drive(_steps("inline", 3, log))).endswith("nexus-mlx-test")
    assert run_steps(_steps("here", 2, log)) == f"here done on {threading.current_thread().name}"

    def stopping_steps():
        yield
        worker.stop()  # on the worker: the remaining steps cannot be queued again
        yield
        yield
        return "finished"

    assert worker.drive(stopping_steps()) == "finished"
    assert worker.run(lambda: 4) == 4  # a later call starts a new worker
    worker.stop()


def test_blocking_runs_a_generator_function_to_its_end_under_its_own_name():
    class Counter:
        def count_steps(self, n: int):
            """Count to ``n``."""
            for _ in range(n):
                yield
            return n

        count = blocking(count_steps, "count")

    assert Counter().count(3) == 3
    assert Counter.count.__name__ == "count" and Counter.count.__doc__ == "Count to ``n``."
    assert Counter.count.__qualname__.endswith("Counter.count")
