"""Server memory over a long run: RSS with and without trimming the C heap, on agent traffic.

Contract: ``python bench/server_memory.py [--model M] [--turns T] [--every E] [--trim-heap S]
[--tag T] [--quick]``. Two arms, each a fresh ``nexus-mlx serve`` subprocess configured as the
server soak's (policy repair, heal after each reply, 2 sessions, a 128 MiB cache budget, 16
stored responses): ``off`` (``--trim-heap off``) and ``trim`` (``--trim-heap S``, default 10 s,
the server's default). Each is driven by ``T`` turns (default 200) of the soak's traffic
(``bench/tasks/server_traffic.py``: three conversations, rotating tools, windowed deletions,
tool results, Responses continuations, abandoned streams) through the ``openai`` client on
loopback. Every ``E`` turns (default 10): the server's RSS (``/proc``), MLX's live arrays and its
buffer cache (``/health``) and the rest, RSS outside MLX's buffers (the Python heap, glibc's
heaps, everything not an MLX buffer). The arms run one after the other, each in its own process:
memory, unlike time, does not move with the machine's load, and neither arm inherits the other's
heap.

Per arm: RSS after the first sample and at the end, its peak (``VmHWM``), the medians of the
first and last thirds of the samples (RSS and outside MLX's buffers), the least-squares slope of
outside-MLX memory per turn, the served / cancelled / failed counts, heap trims and their time.
``trim_over_off``: the ``trim`` arm's last-third median RSS over the ``off`` arm's. Linux only
(``/proc``). JSON ``results/server_memory[_TAG].json`` = ``{"arms": {arm: {..., "samples":
[{"turn", "rss_mib", "mlx_active_mib", "mlx_cache_mib", "outside_mib"}]}}, "trim_over_off",
"turns", "every", "trim_heap_s", "model", ...}``; PNG beside it. ``--quick``: 30 turns, a sample
every 5.
"""

from __future__ import annotations

from common import add_model_argument, arg_parser, emit, model_record, shared_data

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from server import ServerProcess, free_port
from tasks.server_traffic import ServerTraffic, chat_tools

from nexus_mlx import load

NAME = "server_memory"
MIB = 1 << 20
TOOLS = 9  # the soak's nine GitHub MCP tools


def serve_command(model: str, port: int, trim_heap: str) -> list[str]:
    return [sys.executable, "-m", "nexus_mlx.cli", "serve", "--model", model, "--host",
            "127.0.0.1", "--port", str(port), "--policy", "repair", "--heal-after-reply",
            "--max-sessions", "2", "--cache-budget", "128", "--max-stored-responses", "16",
            "--trim-heap", trim_heap]


def sample(server: ServerProcess, turn: int) -> dict[str, float]:
    health = server.health()
    rss = (server.rss_kib() or 0) * 1024
    active, cache = health["mlx_active_bytes"], health["mlx_cache_bytes"]
    return {"turn": turn, "rss_mib": rss / MIB, "mlx_active_mib": active / MIB,
            "mlx_cache_mib": cache / MIB, "outside_mib": (rss - active - cache) / MIB}


def thirds(values: list[float]) -> tuple[float, float]:
    third = max(1, len(values) // 3)
    return float(np.median(values[:third])), float(np.median(values[-third:]))


def run_arm(name: str, model: str, trim_heap: str, turns: int, every: int,
            log_dir: Path) -> dict[str, Any]:
    port = free_port()
    server = ServerProcess(name, serve_command(model, port, trim_heap), port, model, log_dir)
    started = time.perf_counter()
    with server:
        traffic = ServerTraffic(server.client(), chat_tools(
            shared_data("github-mcp", "tools.json"), TOOLS), model=model)
        samples = []
        for turn in range(turns):
            traffic.turn(turn)
            if (turn + 1) % every == 0:
                samples.append(sample(server, turn + 1))
                print(f"{name} turn {turn + 1}: RSS {samples[-1]['rss_mib']:.0f} MiB, outside "
                      f"MLX {samples[-1]['outside_mib']:.0f}", flush=True)
        health, peak = server.health(), (server.peak_rss_kib() or 0) / 1024
    rss = [s["rss_mib"] for s in samples]
    outside = [s["outside_mib"] for s in samples]
    slope = float(np.polyfit([s["turn"] for s in samples], outside, 1)[0]) if len(samples) > 1 \
        else None
    return {"trim_heap": trim_heap, "rss_first_mib": rss[0], "rss_last_mib": rss[-1],
            "peak_rss_mib": peak, "rss_thirds_mib": thirds(rss),
            "outside_thirds_mib": thirds(outside), "outside_slope_kib_per_turn":
            None if slope is None else slope * 1024,
            **{k: health.get(k) for k in ("served", "cancelled", "failed", "heap_trims",
                                          "heap_trim_ms")},
            "seconds": time.perf_counter() - started, "samples": samples}


def plot(arms: dict[str, dict[str, Any]], name: str, quick: bool) -> None:
    import plots

    fig, (ax_rss, ax_out) = plots.figure(2)
    for arm, result in arms.items():
        turns = [s["turn"] for s in result["samples"]]
        ax_rss.plot(turns, [s["rss_mib"] for s in result["samples"]], marker=".", label=arm)
        ax_out.plot(turns, [s["outside_mib"] for s in result["samples"]], marker=".", label=arm)
    ax_rss.set_title("server RSS")
    ax_out.set_title("RSS outside MLX's buffers")
    for ax in (ax_rss, ax_out):
        ax.set_xlabel("turn")
        ax.set_ylabel("MiB")
        ax.legend()
    plots.save(fig, name, quick)


def main() -> None:
    parser = arg_parser(__doc__.splitlines()[0])
    add_model_argument(parser)
    parser.add_argument("--turns", type=int, default=None, help="turns per arm (default 200)")
    parser.add_argument("--every", type=int, default=None, help="turns between samples (10)")
    parser.add_argument("--trim-heap", default="10", help="the trim arm's --trim-heap seconds")
    parser.add_argument("--tag", default="", help="write results/server_memory_TAG.json")
    args = parser.parse_args()
    if not sys.platform.startswith("linux"):
        raise SystemExit("server_memory reads /proc: Linux only")
    name = NAME + (f"_{args.tag}" if args.tag else "")
    turns = args.turns or (30 if args.quick else 200)
    every = args.every or (5 if args.quick else 10)
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as logs:
        arms = {arm: run_arm(arm, args.model, trim, turns, every, Path(logs))
                for arm, trim in (("off", "off"), ("trim", args.trim_heap))}
    ratio = arms["trim"]["rss_thirds_mib"][1] / arms["off"]["rss_thirds_mib"][1]
    plot(arms, name, args.quick)
    model, _ = load(args.model)  # after the arms: only to record what the servers loaded
    emit(name, {**model_record(args.model, model), "arms": arms, "trim_over_off": ratio, "turns": turns,
                "every": every, "trim_heap_s": float(args.trim_heap),
                "loadavg": {"start": load_start, "end": os.getloadavg()}}, args.quick)


if __name__ == "__main__":
    main()
