"""Soak: 1,000 agent turns on the default model with a small registry; memory must level off.

After a warm-up of 100 turns (the reranker's prompt cache, MLX's buffer cache, the grammar
cache and the tokenizer's caches fill up), the resident set size is sampled every 10 turns.
Stated bound: over the remaining 900 turns RSS may grow by at most 64 MiB in total, and the
least-squares slope of the samples must stay under 16 KiB per turn (a leak of one 2 KiB
object per turn would take 1,000 turns to show up as 2 MiB; a leaked KV cache of the 135M model
is ~1 MiB per turn and fails both). ``NEXUS_SOAK_TURNS`` shortens the run (at least 200).
Measured on the 2-core Linux CPU: 2,124.0 MiB after 100 turns and after 1,000 (slope 0.03
KiB/turn), 29 minutes in all.
"""

from __future__ import annotations

import gc
import json
import os

import numpy as np
import pytest

from nexus_mlx.agent.orchestrator import Agent
from nexus_mlx.routing.router import build_router
from nexus_mlx.tools.registry import ToolRegistry, load_tools

WARMUP = 100
EVERY = 10
MAX_GROWTH = 64 << 20
MAX_SLOPE = 16 << 10
REQUESTS = (
    "create a new repository named demo",
    "list the open pull requests of octocat/hello-world",
    "add a comment saying thanks to issue 3",
    "get the README of octocat/hello-world",
    "create a branch called dev",
    "search the code for TODO",
    "merge pull request 7",
)


def _rss() -> int:
    psutil = pytest.importorskip("psutil")
    return int(psutil.Process().memory_info().rss)


@pytest.mark.slow
def test_agent_turns_do_not_grow_memory(default_model, github_tools_file):
    turns = max(200, int(os.environ.get("NEXUS_SOAK_TURNS", "1000")))
    model, tokenizer = default_model
    registry = ToolRegistry(list(load_tools(github_tools_file))[:12])
    router = build_router(registry, model, tokenizer, k=4, embedding_cache=False)
    agent = Agent(model, tokenizer, registry, router, max_argument_tokens=16)
    history: list[dict[str, str]] = []
    samples: list[tuple[int, int]] = []
    first_calls: dict[str, str] = {}
    for turn in range(turns):
        request = REQUESTS[turn % len(REQUESTS)]
        history = [*history[-4:], {"role": "user", "content": request}]
        result = agent.turn(history)
        key = json.dumps(history)  # the same conversation must give the same call every time
        assert first_calls.setdefault(key, result.call.text) == result.call.text
        history.append({"role": "assistant", "content": result.call.text})
        if turn + 1 >= WARMUP and (turn + 1) % EVERY == 0:
            gc.collect()
            samples.append((turn + 1, _rss()))
            if (turn + 1) % 100 == 0:
                print(f"turn {turn + 1}: RSS {samples[-1][1] / 2**20:.1f} MiB", flush=True)
    x = np.array([t for t, _ in samples], dtype=np.float64)
    y = np.array([r for _, r in samples], dtype=np.float64)
    growth = y[-1] - y[0]
    slope = float(np.polyfit(x, y, 1)[0])
    report = (f"RSS {y[0] / 2**20:.1f} MiB after {WARMUP} turns -> {y[-1] / 2**20:.1f} MiB after "
              f"{turns} (peak {y.max() / 2**20:.1f}); slope {slope / 1024:.2f} KiB/turn")
    print(report)
    assert growth <= MAX_GROWTH, report
    assert slope <= MAX_SLOPE, report
