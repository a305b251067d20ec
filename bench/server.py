"""Head to head over HTTP: ``mlx_lm.server`` against ``nexus-mlx serve`` on the same model files,
driven by the official ``openai`` client on loopback.

Contract: ``python bench/server.py [--model M] [--n N] [--requests R] [--tools T]
[--max-tokens K] [--sessions S] [--session-requests Q] [--cache-budget MIB] [--quick]``.

Set-up: ``nexus-mlx convert M`` writes the model as an mlx-lm directory; every server loads that
directory, each in its own subprocess on a free 127.0.0.1 port, stopped by its handle (SIGINT,
then SIGKILL after 20 s). ``mlx_lm.server`` runs unmodified, started through a one-line wrapper
that imports ``nexus_mlx`` first so that it gets the same OpenBLAS matmuls our server gets (on
Linux CPU; elsewhere the import changes nothing). Ours runs twice: ``--policy exact`` (edits
re-encoded: the output-identity check) and ``--policy repair --budget 5`` (the speed claim).

1. Replay: ``N`` trajectories of ``R`` requests (``bench/tasks/trajectories.py`` over the tool
   pool ``bench/agent_session.py`` builds: the live ``mcp-server-time`` / ``mcp-server-git`` tools
   with real results, plus GitHub MCP definitions), each request a streamed chat completion at
   temperature 0 with ``max_tokens`` K, sent to the three servers in rotating order. Requests
   are sent in their textual form (tools in the system message, calls and results as text: what
   our server renders itself for a template without tool support, as SmolLM2's is), so both
   servers render identical prompt tokens through the same chat template; ``prompt_tokens`` of
   the answers are compared to prove it. Per request and server: time to the first streamed
   content (TTFT), total time, the text, cached tokens (and ours' ``usage.nexus`` path).
   Agreement: the whole reply (at most K tokens) equal to mlx_lm.server's. Summaries by edit
   class (``append``, ``tools``, ``delete``, ``edit``; ``edits`` pools the last three); a
   trajectory's first request (cold for every server) is recorded but not summarised.
2. Constraints: ``tool_choice`` ``"required"``, a named function, and ``response_format``
   ``json_schema`` requests with native ``tools`` sent to mlx_lm.server and to ours (repair);
   both answers stored, with whether each honours the request (a call made; the named call
   made; the content valid under the schema, checked with ``jsonschema``).
3. Concurrency: a fresh server of ours (repair, ``--max-sessions S``, ``--cache-budget``) and
   ``S`` client threads, each replaying its own trajectory of ``Q`` streamed requests at once:
   errors, p50 / p99 of total latency and TTFT, the pool's peak cache bytes (``/health``, polled)
   against its budget, and the process's RSS (``/proc``: baseline after warm-up, peak) with the
   growth compared to the budget.

JSON (``results/server.json``): ``replay.summary[server][class]`` = ``{"ttft_ms_mean",
"ttft_ms_median", "ttft_ms_ci", "total_ms_mean", "ttft_speedup_vs_mlx_lm", "agree_with_mlx_lm",
"cached_tokens_mean", "n"}``, ``replay.records``, ``constraints``, ``concurrency``, ``targets``.
Linux (``/proc``) only for the memory figures; elsewhere they are None.
"""

from __future__ import annotations

from common import arg_parser, emit, median_ci  # first: loads nexus_mlx + fast BLAS

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import openai
from agent_session import github_tools, live_tools
from tasks.trajectories import EDIT_CLASSES, make_trajectories

from nexus_mlx.decode.call_format import normalized_messages, textual_messages

NAME = "server"
MLX_LM, EXACT, REPAIR = "mlx_lm.server", "nexus-exact", "nexus-repair"
SERVERS = (MLX_LM, EXACT, REPAIR)
MLX_LM_WRAPPER = ("import sys, nexus_mlx; from mlx_lm.server import main; "
                  "sys.argv[0] = 'mlx_lm.server'; main()")
START_TIMEOUT_S, STOP_TIMEOUT_S = 300.0, 20.0
WARMUP = [{"role": "user", "content": "Say hello."}]


# ---------------------------------------------------------------------------- server processes

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _proc_kib(pid: int, field: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


class ServerProcess:
    """One HTTP server in a subprocess: started, waited for, measured, stopped by its handle."""

    def __init__(self, name: str, command: list[str], port: int, model_name: str,
                 log_dir: Path) -> None:
        self.name, self.command, self.port, self.model_name = name, command, port, model_name
        self.url = f"http://127.0.0.1:{port}"
        self.log = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ServerProcess:
        """Launch the process (without waiting: several servers start side by side)."""
        if self.proc is None:
            with self.log.open("wb") as log:
                self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT)
        return self

    def __enter__(self) -> ServerProcess:
        self.start()
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: "
                                   f"{self.log.read_text(errors='replace')[-2000:]}")
            try:
                if self.health().get("status") == "ok":
                    return self
            except (OSError, ValueError):
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer /health within {START_TIMEOUT_S:.0f} s")

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def health(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + "/health", timeout=5) as response:
            body: dict[str, Any] = json.loads(response.read())
            return body

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="not-needed", max_retries=0,
                             timeout=600)

    def rss_kib(self) -> int | None:
        return None if self.proc is None else _proc_kib(self.proc.pid, "VmRSS")

    def peak_rss_kib(self) -> int | None:
        return None if self.proc is None else _proc_kib(self.proc.pid, "VmHWM")

    def stop(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def mlx_lm_server(model_dir: Path, max_tokens: int, log_dir: Path) -> ServerProcess:
    port = free_port()
    command = [sys.executable, "-c", MLX_LM_WRAPPER, "--model", str(model_dir), "--host",
               "127.0.0.1", "--port", str(port), "--max-tokens", str(max_tokens),
               "--log-level", "WARNING"]
    return ServerProcess(MLX_LM, command, port, "default_model", log_dir)


def nexus_server(name: str, model_dir: Path, policy: str, sessions: int, cache_mib: int,
                 log_dir: Path) -> ServerProcess:
    port = free_port()
    command = [sys.executable, "-m", "nexus_mlx.cli", "serve", "--model", str(model_dir),
               "--host", "127.0.0.1", "--port", str(port), "--policy", policy, "--budget", "5",
               "--max-sessions", str(sessions), "--cache-budget", str(cache_mib)]
    return ServerProcess(name, command, port, str(model_dir), log_dir)


# ---------------------------------------------------------------------------- one request

def streamed(server: ServerProcess, client: openai.OpenAI, messages: list[dict[str, Any]],
             max_tokens: int) -> dict[str, Any]:
    """One streamed greedy completion: TTFT, total time, text, usage."""
    start = time.perf_counter()
    first: float | None = None
    pieces: list[str] = []
    usage: Any = None
    finish = None
    stream = client.chat.completions.create(
        model=server.model_name, messages=messages, stream=True, temperature=0,  # type: ignore
        max_tokens=max_tokens, stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                first = time.perf_counter() if first is None else first
                pieces.append(choice.delta.content)
            finish = choice.finish_reason or finish
    end = time.perf_counter()
    extra = (usage.model_extra or {}) if usage is not None else {}
    details = getattr(usage, "prompt_tokens_details", None)
    nexus = extra.get("nexus")
    return {"ttft_ms": ((first or end) - start) * 1e3, "total_ms": (end - start) * 1e3,
            "text": "".join(pieces), "finish_reason": finish,
            "prompt_tokens": getattr(usage, "prompt_tokens", None),
            "completion_tokens": getattr(usage, "completion_tokens", None),
            "cached_tokens": getattr(details, "cached_tokens", None),
            "path": nexus.get("path") if isinstance(nexus, dict) else None,
            "nexus": nexus if isinstance(nexus, dict) else None}


def plain_messages(request: Any) -> list[dict[str, Any]]:
    """The request in textual form (no ``tools`` field; see the module docstring)."""
    return textual_messages(normalized_messages(request.messages), request.tools)


# ---------------------------------------------------------------------------- 1. replay

def replay(servers: dict[str, ServerProcess], trajectories: list[Any], max_tokens: int
           ) -> list[dict[str, Any]]:
    clients = {name: s.client() for name, s in servers.items()}
    records = []
    for trajectory in trajectories:
        for r, request in enumerate(trajectory.requests):
            messages = plain_messages(request)
            order = SERVERS[r % len(SERVERS):] + SERVERS[:r % len(SERVERS)]
            runs = {name: streamed(servers[name], clients[name], messages, max_tokens)
                    for name in order}
            ref = runs[MLX_LM]
            for run in runs.values():
                run["agree_with_mlx_lm"] = run["text"] == ref["text"]
            prompts = {run["prompt_tokens"] for run in runs.values()}
            records.append({"trajectory": trajectory.index, "request": r, "edit": request.edit,
                            "detail": request.detail, "prompt_identical": len(prompts) == 1,
                            "prompt_tokens": ref["prompt_tokens"], "servers": runs})
            print(f"traj {trajectory.index} req {r} {request.edit:>6} prompt "
                  f"{ref['prompt_tokens']}: " + "  ".join(
                      f"{n} {runs[n]['ttft_ms']:.0f}/{runs[n]['total_ms']:.0f}ms"
                      f"{'' if runs[n]['agree_with_mlx_lm'] else ' (differs)'}"
                      for n in SERVERS), flush=True)
    return records


def summarize(records: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    rows = [r for r in records if r["edit"] != "first"]
    groups = {c: [r for r in rows if r["edit"] == c] for c in EDIT_CLASSES}
    groups["edits"] = [r for r in rows if r["edit"] != "append"]
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name in SERVERS:
        out[name] = {}
        for group, members in groups.items():
            if not members:
                continue
            ttft = [r["servers"][name]["ttft_ms"] for r in members]
            base = float(np.mean([r["servers"][MLX_LM]["ttft_ms"] for r in members]))
            median, lo, hi = median_ci(ttft)
            cached = [r["servers"][name]["cached_tokens"] or 0 for r in members]
            out[name][group] = {
                "ttft_ms_mean": float(np.mean(ttft)), "ttft_ms_median": median,
                "ttft_ms_ci": [lo, hi],
                "total_ms_mean": float(np.mean([r["servers"][name]["total_ms"] for r in members])),
                "ttft_speedup_vs_mlx_lm": base / float(np.mean(ttft)),
                "agree_with_mlx_lm": float(np.mean([r["servers"][name]["agree_with_mlx_lm"]
                                                    for r in members])),
                "cached_tokens_mean": float(np.mean(cached)), "n": len(members)}
    return out


# ---------------------------------------------------------------------------- 2. constraints

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TIME = {"type": "object", "properties": {"timezone": {"type": "string"}},
        "required": ["timezone"]}
TOOLS = [{"type": "function", "function": {"name": "get_time", "description":
                                           "Current time in a timezone", "parameters": TIME}},
         {"type": "function", "function": {"name": "get_weather", "description":
                                           "Current weather in a city", "parameters": WEATHER}}]
ANSWER_SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 32},
    "population_millions": {"type": "integer", "minimum": 0, "maximum": 100}},
    "required": ["city", "population_millions"], "additionalProperties": False}
CONSTRAINTS: list[tuple[str, dict[str, Any]]] = [
    ("tool_choice_required", {
        "messages": [{"role": "user", "content": "What time is it in Tokyo?"}],
        "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}),
    ("tool_choice_named", {
        "messages": [{"role": "user", "content": "What time is it in Tokyo?"}],
        "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": False}),
    ("response_format_json_schema", {
        "messages": [{"role": "user", "content": "Which is the largest city of Japan, and how "
                      "many people live there?"}],
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "city_answer", "schema": ANSWER_SCHEMA, "strict": True}}}),
]


def _honoured(kind: str, message: dict[str, Any]) -> tuple[bool, str]:
    calls = message.get("tool_calls") or []
    if kind == "tool_choice_required":
        ok = bool(calls) and all(c["function"]["name"] in ("get_time", "get_weather")
                                 for c in calls)
        return ok, f"{len(calls)} tool call(s)" if calls else "no tool call"
    if kind == "tool_choice_named":
        names = [c["function"]["name"] for c in calls]
        return bool(names) and set(names) == {"get_weather"}, \
            f"called {names}" if names else "no tool call"
    try:
        value = json.loads(message.get("content") or "")
        jsonschema.validate(value, ANSWER_SCHEMA)
    except (ValueError, jsonschema.ValidationError) as exc:
        return False, f"content not valid under the schema: {str(exc).splitlines()[0][:160]}"
    return True, "content valid under the schema"


def constraints(servers: dict[str, ServerProcess], max_tokens: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind, body in CONSTRAINTS:
        out[kind] = {"request": body, "answers": {}}
        for name in (MLX_LM, REPAIR):
            server = servers[name]
            start = time.perf_counter()
            try:
                reply = server.client().chat.completions.create(
                    model=server.model_name, temperature=0, max_tokens=max_tokens, **body)
                message = reply.choices[0].message.model_dump(exclude_none=True)
                finish = reply.choices[0].finish_reason
                honoured, detail = _honoured(kind, message)
            except openai.APIError as exc:
                message, finish, honoured, detail = {}, None, False, f"error: {exc}"
            out[kind]["answers"][name] = {
                "message": message, "finish_reason": finish, "honoured": honoured,
                "detail": detail, "total_ms": (time.perf_counter() - start) * 1e3}
        print(f"{kind}: " + "  ".join(f"{n} honoured={a['honoured']} ({a['detail']})"
                                      for n, a in out[kind]["answers"].items()), flush=True)
    return out


# ---------------------------------------------------------------------------- 3. concurrency

def concurrency(server: ServerProcess, trajectories: list[Any], max_tokens: int,
                budget_bytes: int) -> dict[str, Any]:
    streamed(server, server.client(), WARMUP, max_tokens)  # warm-up
    baseline = server.rss_kib()
    results: list[dict[str, Any]] = []
    errors: list[str] = []
    lock = threading.Lock()
    done = threading.Event()
    peak = {"rss_kib": baseline or 0, "cache_bytes": 0}

    def monitor() -> None:
        while not done.is_set():
            rss = server.rss_kib()
            if rss is not None:
                peak["rss_kib"] = max(peak["rss_kib"], rss)
            try:
                peak["cache_bytes"] = max(peak["cache_bytes"], int(server.health()["cache_bytes"]))
            except (OSError, ValueError, KeyError):
                pass
            done.wait(0.2)

    def session(trajectory: Any) -> None:
        client = server.client()
        for r, request in enumerate(trajectory.requests):
            try:
                run = streamed(server, client, plain_messages(request), max_tokens)
                with lock:
                    results.append({"session": trajectory.index, "request": r, **run})
            except Exception as exc:  # any failure is an error of the run, counted
                with lock:
                    errors.append(f"session {trajectory.index} request {r}: "
                                  f"{type(exc).__name__}: {exc}")

    watcher = threading.Thread(target=monitor, daemon=True)
    watcher.start()
    start = time.perf_counter()
    threads = [threading.Thread(target=session, args=(t,)) for t in trajectories]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    done.set()
    watcher.join()
    stats = server.health()
    latency = [r["total_ms"] for r in results]
    ttft = [r["ttft_ms"] for r in results]
    hwm = server.peak_rss_kib()
    growth = None if baseline is None else (peak["rss_kib"] - baseline) << 10
    return {
        "sessions": len(trajectories), "requests_per_session": len(trajectories[0].requests),
        "requests": len(results) + len(errors), "errors": len(errors), "error_messages": errors,
        "wall_s": wall, "requests_per_s": len(results) / wall if wall else None,
        "latency_ms_p50": float(np.percentile(latency, 50)) if latency else None,
        "latency_ms_p99": float(np.percentile(latency, 99)) if latency else None,
        "ttft_ms_p50": float(np.percentile(ttft, 50)) if ttft else None,
        "ttft_ms_p99": float(np.percentile(ttft, 99)) if ttft else None,
        "cache_budget_bytes": budget_bytes, "peak_cache_bytes": peak["cache_bytes"],
        "cache_within_budget": peak["cache_bytes"] <= budget_bytes,
        "evicted": stats.get("evicted"), "pool_sessions": stats.get("sessions"),
        "rss_baseline_bytes": None if baseline is None else baseline << 10,
        "rss_peak_bytes": None if hwm is None else max(hwm, peak["rss_kib"]) << 10,
        "rss_growth_bytes": growth,
        "rss_growth_within_budget": None if growth is None else growth <= budget_bytes,
        "results": results,
    }


# ---------------------------------------------------------------------------- figure, main

def draw(summary: dict[str, Any], conc: dict[str, Any], quick: bool) -> None:
    import plots

    classes = [c for c in (*EDIT_CLASSES, "edits") if c in summary[MLX_LM]]
    fig, (ax_t, ax_a, ax_c) = plots.figure(3, width=5.2)
    width = 0.8 / len(SERVERS)
    for i, name in enumerate(SERVERS):
        xs = np.arange(len(classes)) + i * width
        means = [summary[name][c]["ttft_ms_mean"] for c in classes]
        ax_t.bar(xs, means, width, label=name)
        ax_a.bar(xs, [summary[name][c]["agree_with_mlx_lm"] for c in classes], width, label=name)
    for ax in (ax_t, ax_a):
        ax.set_xticks(np.arange(len(classes)) + 0.4 - width / 2, classes)
    ax_t.set_ylabel("mean time to first streamed token (ms)")
    ax_t.set_title("TTFT over HTTP by edit class")
    ax_t.legend()
    ax_a.set_ylabel("reply identical to mlx_lm.server's")
    ax_a.set_ylim(0, 1.05)
    ax_a.set_title("Output agreement (temperature 0)")
    latency = sorted(r["total_ms"] / 1e3 for r in conc["results"])
    if latency:
        ax_c.plot(latency, np.arange(1, len(latency) + 1) / len(latency))
    ax_c.set_xlabel("request latency (s)")
    ax_c.set_ylabel("fraction of requests")
    ax_c.set_title(f"{conc['sessions']} concurrent sessions x {conc['requests_per_session']} "
                   f"({conc['errors']} errors)")
    plots.save(fig, NAME, quick)


def convert(model: str, out: Path) -> Path:
    done = subprocess.run([sys.executable, "-m", "nexus_mlx.cli", "convert", model, "--out",
                           str(out)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"nexus-mlx convert failed: {done.stderr.strip()}")
    return out


def main() -> None:
    parser = arg_parser(__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--model", default="default")
    parser.add_argument("--n", type=int, default=8, help="replayed trajectories")
    parser.add_argument("--requests", type=int, default=8, help="requests per trajectory")
    parser.add_argument("--tools", type=int, default=6, help="tools offered per trajectory")
    parser.add_argument("--max-tokens", type=int, default=16, help="reply tokens at most")
    parser.add_argument("--sessions", type=int, default=16, help="concurrent sessions")
    parser.add_argument("--session-requests", type=int, default=10,
                        help="requests per concurrent session")
    parser.add_argument("--cache-budget", type=int, default=1024, metavar="MIB",
                        help="our servers' pool budget for all sessions' caches")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.quick:
        args.n, args.requests, args.tools = 1, 6, 3
        args.sessions, args.session_requests = 4, 2
    started, load_before = time.perf_counter(), os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="nexus-bench-server-") as tmp:
        root = Path(tmp)
        live, results = live_tools(root)
        pool = live + github_tools(12 if args.quick else None)
        trajectories = make_trajectories(pool, results, args.n, args.requests, args.seed,
                                         args.tools)
        model_dir = convert(args.model, root / "model")
        logs = root / "logs"
        logs.mkdir()
        sessions = max(8, args.sessions)
        servers = {MLX_LM: mlx_lm_server(model_dir, args.max_tokens, logs),
                   EXACT: nexus_server(EXACT, model_dir, "exact", sessions, args.cache_budget, logs),
                   REPAIR: nexus_server(REPAIR, model_dir, "repair", sessions, args.cache_budget,
                                        logs)}
        fresh = nexus_server("nexus-concurrency", model_dir, "repair", args.sessions,
                             args.cache_budget, logs)
        everyone = (*servers.values(), fresh)
        commands = {s.name: s.command for s in everyone}
        try:
            for server in everyone:
                server.start()  # side by side; each is waited for when it is first used
            with servers[MLX_LM], servers[EXACT], servers[REPAIR]:
                for server in servers.values():  # warm-up: first-call costs out of the timings
                    streamed(server, server.client(), WARMUP, args.max_tokens)
                records = replay(servers, trajectories, args.max_tokens)
                checks = constraints(servers, max(args.max_tokens, 64))
            mixes = make_trajectories(pool, results, args.sessions, args.session_requests,
                                      args.seed + 1, args.tools)
            with fresh:
                conc = concurrency(fresh, mixes, args.max_tokens, args.cache_budget << 20)
        finally:
            for server in everyone:
                server.stop()
        config = json.loads((model_dir / "config.json").read_text())
    summary = summarize(records)
    targets = {
        "edits_ttft_speedup_repair": summary[REPAIR].get("edits", {}).get("ttft_speedup_vs_mlx_lm"),
        "append_ttft_speedup_repair": summary[REPAIR].get("append", {}).get(
            "ttft_speedup_vs_mlx_lm"),
        "exact_identical_rate": float(np.mean([r["servers"][EXACT]["agree_with_mlx_lm"]
                                               for r in records])),
        "prompts_identical_rate": float(np.mean([r["prompt_identical"] for r in records])),
        "constraints_honoured": {k: {n: a["honoured"] for n, a in v["answers"].items()}
                                 for k, v in checks.items()},
        "concurrency_errors": conc["errors"],
    }
    targets["edits_ge_3x"] = (targets["edits_ttft_speedup_repair"] or 0) >= 3.0
    targets["append_ge_1x"] = (targets["append_ttft_speedup_repair"] or 0) >= 1.0
    emit(NAME, {"model": args.model, "model_type": config.get("model_type"),
                "n_trajectories": args.n, "requests": args.requests, "tools": args.tools,
                "max_tokens": args.max_tokens, "server_commands": commands,
                "request_form": "textual (tools in the system message, calls and results as "
                                "text), identical for both servers",
                "replay": {"summary": summary, "records": records}, "constraints": checks,
                "concurrency": conc, "targets": targets, "cpu_count": os.cpu_count(),
                "load_average": {"start": list(load_before), "end": list(os.getloadavg())},
                "wall_s": time.perf_counter() - started}, args.quick)
    draw(summary, conc, args.quick)


if __name__ == "__main__":
    main()
