"""Server memory over a long run: RSS with and without heap trims and idle releases, on agent
traffic.

Contract: ``python bench/server_memory.py [--model M] [--turns T] [--every E] [--trim-heap S]
[--idle-release S] [--tag T] [--quick]``. Two arms, each a fresh ``nexus-mlx serve`` subprocess
configured as the server soak's (policy repair, heal after each reply, 2 sessions, a 128 MiB
cache budget, 16 stored responses): ``off`` (``--trim-heap off --idle-release off``: the server
before either existed) and ``on`` (``--trim-heap S``, default 10 s, the server's default, and
``--idle-release S``, default 5 s here, 60 in the server, so the run need not idle a minute).
Each is driven by ``T`` turns (default 200) of the soak's traffic
(``bench/tasks/server_traffic.py``: three conversations, rotating tools, windowed deletions,
tool results, Responses continuations, abandoned streams) through the ``openai`` client on
loopback. Every ``E`` turns (default 10): the server's RSS (``/proc``), MLX's live arrays and its
buffer cache (``/health``) and the rest, RSS outside MLX's buffers (the Python heap, glibc's
heaps, everything not an MLX buffer). The arms run one after the other, each in its own process:
memory, unlike time, does not move with the machine's load, and neither arm inherits the other's
heap. After the last turn the server is left idle until the ``on`` arm's release has run (the
``off`` arm: as long as the release time, and 2 s more) and sampled once more (``idle``).

Per arm: RSS after the first sample and at the end, its peak (``VmHWM``), the medians of the
first and last thirds of the samples (RSS and outside MLX's buffers), the least-squares slope of
outside-MLX memory per turn, the served / cancelled / failed counts, heap trims and their time,
the idle sample and idle releases. ``on_over_off``: the ``on`` arm's last-third median RSS over
the ``off`` arm's; ``idle_on_over_off``: the same for the idle samples. Linux only
(``/proc``). JSON ``results/server_memory[_TAG].json`` = ``{"arms": {arm: {..., "samples":
[{"turn", "rss_mib", "mlx_active_mib", "mlx_cache_mib", "outside_mib"}], "idle": {...}}},
"on_over_off", "idle_on_over_off", "turns", "every", "trim_heap_s", "idle_release_s", "model",
...}``; PNG beside it. ``--quick``: 30 turns, a sample
every 5.
"""

from __future__ import annotations

from common import (
    add_model_argument,
    add_tag_argument,
    arg_parser,
    emit,
    model_record,
    shared_data,
    tagged_name,
)

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


def serve_command(model: str, port: int, options: list[str]) -> list[str]:
    return [sys.executable, "-m", "nexus_mlx.cli", "serve", "--model", model, "--host",
            "127.0.0.1", "--port", str(port), "--policy", "repair", "--heal-after-reply",
            "--max-sessions", "2", "--cache-budget", "128", "--max-stored-responses", "16",
            *options]


def sample(server: ServerProcess, turn: int) -> dict[str, float]:
    health = server.health()
    rss = (server.rss_kib() or 0) * 1024
    active, cache = health["mlx_active_bytes"], health["mlx_cache_bytes"]
    return {"turn": turn, "rss_mib": rss / MIB, "mlx_active_mib": active / MIB,
            "mlx_cache_mib": cache / MIB, "outside_mib": (rss - active - cache) / MIB}


def thirds(values: list[float]) -> tuple[float, float]:
    third = max(1, len(values) // 3)
    return float(np.median(values[:third])), float(np.median(values[-third:]))


def idle_sample(server: ServerProcess, idle_s: float, turn: int) -> dict[str, float]:
    """A sample once the server has idled past its release (or as long, when it has none)."""
    deadline = time.monotonic() + idle_s + 60
    time.sleep(idle_s + 2)
    while server.health().get("idle_releases", 1) < 1 and time.monotonic() < deadline:
        time.sleep(0.5)
    return sample(server, turn)


def run_arm(name: str, model: str, options: list[str], turns: int, every: int, idle_s: float,
            log_dir: Path) -> dict[str, Any]:
    port = free_port()
    server = ServerProcess(name, serve_command(model, port, options), port, model, log_dir)
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
        idle = idle_sample(server, idle_s, turns)
        print(f"{name} idle: RSS {idle['rss_mib']:.0f} MiB, MLX cache {idle['mlx_cache_mib']:.0f}",
              flush=True)
        health, peak = server.health(), (server.peak_rss_kib() or 0) / 1024
    rss = [s["rss_mib"] for s in samples]
    outside = [s["outside_mib"] for s in samples]
    slope = float(np.polyfit([s["turn"] for s in samples], outside, 1)[0]) if len(samples) > 1 \
        else None
    return {"options": " ".join(options), "rss_first_mib": rss[0], "rss_last_mib": rss[-1],
            "peak_rss_mib": peak, "rss_thirds_mib": thirds(rss),
            "outside_thirds_mib": thirds(outside), "outside_slope_kib_per_turn":
            None if slope is None else slope * 1024,
            **{k: health.get(k) for k in ("served", "cancelled", "failed", "heap_trims",
                                          "heap_trim_ms", "idle_releases")},
            "idle": idle,
            "seconds": time.perf_counter() - started, "samples": samples}


def plot(arms: dict[str, dict[str, Any]], name: str, quick: bool) -> None:
    import plots

    fig, (ax_rss, ax_out) = plots.figure(2)
    for arm, result in arms.items():
        turns = [s["turn"] for s in result["samples"]]
        ax_rss.plot(turns, [s["rss_mib"] for s in result["samples"]], marker=".", label=arm)
        ax_out.plot(turns, [s["outside_mib"] for s in result["samples"]], marker=".", label=arm)
        idle = result["idle"]
        ax_rss.scatter([idle["turn"] + 5], [idle["rss_mib"]], marker="x", s=60,
                       label=f"{arm}, idle")
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
    parser.add_argument("--trim-heap", default="10", help="the on arm's --trim-heap seconds")
    parser.add_argument("--idle-release", type=float, default=5.0,
                        help="the on arm's --idle-release seconds")
    add_tag_argument(parser)
    args = parser.parse_args()
    if not sys.platform.startswith("linux"):
        raise SystemExit("server_memory reads /proc: Linux only")
    name = tagged_name(NAME, args.tag)
    turns = args.turns or (30 if args.quick else 200)
    every = args.every or (5 if args.quick else 10)
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as logs:
        arms = {arm: run_arm(arm, args.model, options, turns, every, args.idle_release,
                             Path(logs))
                for arm, options in (
                    ("off", ["--trim-heap", "off", "--idle-release", "off"]),
                    ("on", ["--trim-heap", args.trim_heap, "--idle-release",
                            str(args.idle_release)]))}
    ratio = arms["on"]["rss_thirds_mib"][1] / arms["off"]["rss_thirds_mib"][1]
    idle_ratio = arms["on"]["idle"]["rss_mib"] / arms["off"]["idle"]["rss_mib"]
    plot(arms, name, args.quick)
    model, _ = load(args.model)  # after the arms: only to record what the servers loaded
    emit(name, {**model_record(args.model, model), "arms": arms, "on_over_off": ratio,
                "idle_on_over_off": idle_ratio, "turns": turns, "every": every,
                "trim_heap_s": float(args.trim_heap), "idle_release_s": args.idle_release,
                "loadavg": {"start": load_start, "end": os.getloadavg()}}, args.quick)


if __name__ == "__main__":
    main()
