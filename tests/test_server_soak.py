"""Soak of the server: many turns of several agent conversations over loopback, through every
cache path the pool takes; memory must level off and every request must be served.

Three conversations take turns (``bench/tasks/server_traffic.py``: appends, three of nine real
GitHub MCP tools offered in rotation, windowed deletions, tool results, a Responses API
continuation every fourth turn, a client leaving a stream every seventh) on a server with two
pooled sessions (so each turn of one may evict or reseed another's cache), a 128 MiB cache
budget, 16 stored responses, healing after each reply and a heap trim after each reply. After
a warm-up of 100 turns, memory is sampled every 10 turns, in three parts:

- the resident set as the OS sees it, less MLX's live arrays and its cache of freed buffers:
  freed buffers of many sizes fragment glibc's heaps, and the server gives their free pages
  back after replies (``trim_heap_s``; here 0, after every reply, so a sample does not depend
  on where it falls between two trims: at the default 10 s it swings by ~200 MiB). Without
  trims RSS crept here (``bench/server_memory.py``). The last third's median may exceed the
  first third's by at most 64 MiB.
- the same once the test has trimmed the heap itself (``malloc_trim(0)``): what the server
  holds outside MLX's buffers (the Python heap, the allocator's own). Stated bound, as the
  agent soak's (:mod:`test_soak`): it may grow by at most 64 MiB in all, and the least-squares
  slope must stay under 16 KiB per turn.
- MLX's live arrays (weights, tool blocks, the sessions' caches, a request's working set): they
  swing by ~150 MiB with which sessions are cached when the sample is taken, so a leak is
  looked for in their medians: the last third's may exceed the first third's by at most 64 MiB.

No request may fail, no heal may fail, and the pool and the store stay within their bounds.
``NEXUS_SERVER_SOAK_TURNS`` sets the length (default 600, at least 200).
"""

from __future__ import annotations

import gc
import os

import mlx.core as mx
import numpy as np
import pytest

openai = pytest.importorskip("openai")

from tasks.server_traffic import ServerTraffic, chat_tools  # noqa: E402
from test_server import client, http  # noqa: E402

from nexus_mlx._platform import heap  # noqa: E402
from nexus_mlx.server import serve  # noqa: E402

WARMUP = 100
EVERY = 10
MAX_GROWTH = 64 << 20
MAX_SLOPE = 16 << 10


def _held() -> tuple[int, int, int, int]:
    """(RSS less MLX's live arrays and cache, as the OS sees it; the same once the allocator's
    free pages are returned; MLX's live arrays; MLX's cache of freed buffers), in bytes."""
    psutil = pytest.importorskip("psutil")
    raw = int(psutil.Process().memory_info().rss)
    if heap.trim_heap() is None:
        pytest.skip("needs glibc's malloc_trim to tell held memory from free heap pages")
    trimmed = int(psutil.Process().memory_info().rss)
    active, cache = mx.get_active_memory(), mx.get_cache_memory()
    return raw - active - cache, trimmed - active - cache, active, cache


@pytest.mark.slow
def test_server_turns_do_not_grow_memory(default_model, github_tools_file):
    turns = max(200, int(os.environ.get("NEXUS_SERVER_SOAK_TURNS", "600")))
    samples: list[tuple[int, int, int, int]] = []  # (turn, RSS and trimmed RSS outside MLX's
    #                                                  buffers, MLX arrays)
    with serve(*default_model, model_name="default", host="127.0.0.1", port=0,
               max_sessions=2, cache_budget_mib=128, max_stored_responses=16,
               heal_after_reply=True, trim_heap_s=0.0) as server:
        traffic = ServerTraffic(client(server), chat_tools(github_tools_file, 9))
        for turn in range(turns):
            traffic.turn(turn)
            if turn + 1 >= WARMUP and (turn + 1) % EVERY == 0:
                gc.collect()
                raw, outside, active, cached = _held()
                samples.append((turn + 1, raw, outside, active))
                print(f"turn {turn + 1}: outside MLX {raw / 2**20:.1f} MiB ({outside / 2**20:.1f} "
                      f"trimmed), MLX arrays {active / 2**20:.1f}, MLX cache "
                      f"{cached / 2**20:.1f}", flush=True)
        status, health = http(server, "/health")
    assert status == 200 and health["failed"] == 0 and health["heal_failures"] == 0, health
    assert health["sessions"] <= 2 and health["stored_responses"] <= 16, health
    assert health["served"] >= turns - turns // 7 - 1, health
    x, raw, y, arrays = (np.array(column, dtype=np.float64)
                         for column in zip(*samples, strict=True))
    growth, slope = y[-1] - y[0], float(np.polyfit(x, y, 1)[0])
    third = max(1, len(arrays) // 3)

    def thirds_growth(values: np.ndarray) -> float:
        return float(np.median(values[-third:]) - np.median(values[:third]))

    raw_growth, arrays_growth = thirds_growth(raw), thirds_growth(arrays)
    report = (f"RSS outside MLX's buffers: median {raw_growth / 2**20:+.1f} MiB (range "
              f"{raw.min() / 2**20:.0f}-{raw.max() / 2**20:.0f}; {health['heap_trims']} heap "
              f"trims, {health['heap_trim_ms']:.0f} ms); trimmed "
              f"{y[0] / 2**20:.1f} MiB after {WARMUP} turns -> "
              f"{y[-1] / 2**20:.1f} MiB after {turns} (peak {y.max() / 2**20:.1f}); slope "
              f"{slope / 1024:.2f} KiB/turn; MLX arrays' median {arrays_growth / 2**20:+.1f} MiB "
              f"(range {arrays.min() / 2**20:.0f}-{arrays.max() / 2**20:.0f}); "
              f"{health['served']} served, {health['cancelled']} cancelled")
    print(report)
    assert raw_growth <= MAX_GROWTH, report
    assert growth <= MAX_GROWTH, report
    assert slope <= MAX_SLOPE, report
    assert arrays_growth <= MAX_GROWTH, report
