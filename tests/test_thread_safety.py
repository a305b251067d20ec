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
from pathlib import Path

import pytest

from nexus_mlx._platform.mlx_thread import MlxThread, mlx_thread, on_mlx_thread

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
