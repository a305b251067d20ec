"""The C heap trim (glibc's ``malloc_trim``) and its rate limit.

A heap left with ~128 MiB of touched, freed, non-top chunks (allocated with libc's own malloc,
one live block pinning the top) shrinks in RSS by most of that after ``trim_heap()``; where the
libc has no trim the call answers None. :class:`HeapTrimmer` lets one caller per interval
trim (a fake clock), counts trims and their time, and rejects a bad interval."""

from __future__ import annotations

import ctypes
import os
import sys
import threading

import pytest

from nexus_mlx._platform import heap
from nexus_mlx._platform.heap import HeapTrimmer, trim_heap

MIB = 1 << 20
glibc = pytest.mark.skipif(not sys.platform.startswith("linux") or heap._malloc_trim() is None,
                           reason="needs glibc's malloc_trim")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@glibc
def test_trimming_gives_freed_heap_pages_back():
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    block = 64 * 1024  # below glibc's mmap threshold: from the heap itself
    blocks = [libc.malloc(block) for _ in range(2048)]
    assert all(blocks)
    try:
        for b in blocks:
            ctypes.memset(b, 1, block)  # resident
        for b in blocks[:-1]:  # the last stays, so the freed space is not the heap's top
            libc.free(b)
        before = _rss()
        assert trim_heap() is True
        assert before - _rss() >= 64 * MIB
    finally:
        libc.free(blocks[-1])


def test_without_a_trim_in_the_libc_it_does_nothing(monkeypatch):
    monkeypatch.setattr(heap, "_malloc_trim", lambda: None)
    assert trim_heap() is None
    trimmer = HeapTrimmer(0)
    assert trimmer.claim() and trimmer.trim() is None
    assert trimmer.stats() == {"heap_trims": 0, "heap_trim_ms": 0.0}


def test_one_claim_per_interval():
    now = [100.0]
    trimmer = HeapTrimmer(10, clock=lambda: now[0])
    assert trimmer.claim()
    now[0] += 9.9
    assert not trimmer.claim()
    now[0] += 0.1
    assert trimmer.claim() and not trimmer.claim()


def test_racing_callers_get_one_claim():
    trimmer = HeapTrimmer(3600)
    start, answers = threading.Barrier(8), []

    def race() -> None:
        start.wait()
        answers.append(trimmer.claim())

    threads = [threading.Thread(target=race) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(answers) == [False] * 7 + [True]


@glibc
def test_trims_are_counted():
    trimmer = HeapTrimmer(0)
    for _ in range(3):
        assert trimmer.claim()
        assert trimmer.trim() in (True, False)
    stats = trimmer.stats()
    assert stats["heap_trims"] == 3 and stats["heap_trim_ms"] >= 0


@pytest.mark.parametrize("interval", [-1, float("nan"), "10", True, None])
def test_a_bad_interval_is_refused(interval):
    with pytest.raises(ValueError, match="interval_s"):
        HeapTrimmer(interval)
