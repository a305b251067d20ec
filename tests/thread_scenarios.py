"""Threaded scenarios for ``test_thread_safety.py``, each run in a fresh interpreter.

``python tests/thread_scenarios.py NAME [--threads N]`` builds one shared object, computes the
single-thread answers on the main thread, then lets ``N`` threads (default 4) answer the same
requests at once (each in its own rotated order) and end together, joins them, prints one JSON
line ``{"single": [...], "threads": [[...], ...], ...}`` and exits at once: the moment a process
that used MLX from several threads used to abort in (MLX 0.32's per-thread state is torn down
after ``join()`` returns). Exit code 77: the default model is not installed.
``--without-mlx-thread`` undoes the fix (``Router.route`` and ``Agent.turn`` evaluate on the
calling threads again) to show the failure it prevents.

NAME: ``router`` (``build_router`` over 12 GitHub MCP tools, the gate forced to escalate so the
reranker's prompt cache is shared too), ``agent`` (``Agent.turn`` on such a router with its calibrated gate, 8 argument tokens), ``slb``
(native INT8 scans of one buffer, plus reads of one registry).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nexus_mlx  # noqa: F401  (must precede mlx imports)
from nexus_mlx.errors import ModelNotFoundError

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
QUERIES = ("list the open pull requests of this repository", "add a comment to issue 3")
N_TOOLS = 12


def _registry() -> Any:
    from nexus_mlx.tools.registry import ToolRegistry, load_tools

    return ToolRegistry(list(load_tools(DATA / "github-mcp" / "tools.json"))[:N_TOOLS])


def _router(force_rerank: bool) -> Any:
    from nexus_mlx.routing.gate import MarginGate
    from nexus_mlx.routing.router import build_router

    try:
        model, tokenizer = nexus_mlx.load("default")
    except ModelNotFoundError as exc:
        print(f"default model not installed: {exc}", file=sys.stderr)
        sys.exit(77)
    router = build_router(_registry(), model, tokenizer, k=3, embedding_cache=False)
    if force_rerank:
        router.gate = MarginGate(2.0)  # cosine margins are < 2: every request is reranked
    return router, model, tokenizer


def router_scenario() -> tuple[list[str], Callable[[str], Any]]:
    router, _, _ = _router(force_rerank=True)

    def answer(query: str) -> Any:
        d = router.route(query)
        return [d.chosen, d.escalated, [n for n, _ in d.candidates],
                [n for n, _ in d.reranked or []]]

    return list(QUERIES), answer


def agent_scenario() -> tuple[list[str], Callable[[str], Any]]:
    from nexus_mlx.agent.orchestrator import Agent

    router, model, tokenizer = _router(force_rerank=False)
    agent = Agent(model, tokenizer, router.registry, router, max_argument_tokens=8)

    def answer(query: str) -> Any:
        turn = agent.turn([{"role": "user", "content": query}])
        return [turn.route.chosen, turn.call.name, turn.call.text]

    return list(QUERIES), answer


def slb_scenario() -> tuple[list[str], Callable[[str], Any]]:
    import numpy as np

    from nexus_mlx.routing.slb import SemanticLookasideBuffer
    from nexus_mlx.tools.registry import load_tools

    registry = load_tools(DATA / "github-mcp" / "tools.json")
    rng = np.random.default_rng(0)
    slb = SemanticLookasideBuffer(384, "random")
    slb.add(registry.names(), rng.standard_normal((len(registry), 384)).astype(np.float32))
    queries = rng.standard_normal((64, 384)).astype(np.float32)

    def answer(key: str) -> Any:
        q = queries[int(key)]
        idx, scores = slb.scan(q, 5)
        name = registry.names()[int(idx[0])]
        tool = registry.get(name)
        return [idx.tolist(), scores.tolist(), tool.canonical[:80], registry.digest()]

    return [str(i) for i in range(len(queries))], answer


SCENARIOS = {"router": router_scenario, "agent": agent_scenario, "slb": slb_scenario}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("name", choices=sorted(SCENARIOS))
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--without-mlx-thread", action="store_true",
                        help="undo the fix (evaluate on the calling threads) to show the failure")
    args = parser.parse_args()
    if args.without_mlx_thread:
        from nexus_mlx.agent.orchestrator import Agent
        from nexus_mlx.routing.router import Router

        for cls, method in ((Router, "route"), (Agent, "turn"), (Agent, "run")):
            setattr(cls, method, getattr(cls, method).__wrapped__)
    start = time.perf_counter()
    keys, answer = SCENARIOS[args.name]()
    seconds = {"setup": time.perf_counter() - start}
    single = [answer(k) for k in keys]
    seconds["single"] = time.perf_counter() - start - seconds["setup"]
    results: list[list[Any] | None] = [None] * args.threads
    errors: list[str] = []
    finish = threading.Barrier(args.threads)

    def work(i: int) -> None:
        try:
            order = keys[i % len(keys):] + keys[: i % len(keys)]
            got = {k: answer(k) for k in order}
            results[i] = [got[k] for k in keys]
        except Exception as exc:  # reported in the JSON line, so the test shows it
            errors.append(f"thread {i}: {type(exc).__name__}: {exc}")
        finish.wait()  # all threads end together, just before the process exits

    threads = [threading.Thread(target=work, args=(i,)) for i in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds["threads"] = time.perf_counter() - start - seconds["setup"] - seconds["single"]
    print(json.dumps({"single": single, "threads": results, "errors": errors,
                      "seconds": {k: round(v, 1) for k, v in seconds.items()}}), flush=True)


if __name__ == "__main__":
    main()
