"""The ``nexus-mlx`` subcommands (``main.py`` parses arguments and handles errors).

Contract: each ``cmd_<name>(args) -> int`` runs one subcommand and returns the exit status. It
first checks every argument (:mod:`nexus_mlx.cli.checks`), then loads what it needs (registry,
model); caller errors raise :class:`~nexus_mlx.errors.NexusError` subclasses with a readable
message. Long work shows tqdm progress on stderr (:mod:`nexus_mlx.cli.progress`); stdout holds
only results. Timings printed by ``splice-demo`` are medians of ``--repeats`` runs after a
warm-up.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from tqdm import tqdm

from nexus_mlx.cli import checks
from nexus_mlx.cli.progress import Stages, tool_bar
from nexus_mlx.cli.signals import StopSignals
from nexus_mlx.decode.generate import GenerationStats, chat, greedy_continuation
from nexus_mlx.errors import ArgumentError
from nexus_mlx.metrics import next_token_kl
from nexus_mlx.models.arch import model_plan
from nexus_mlx.models.forward import forward, make_cache
from nexus_mlx.models.load import load
from nexus_mlx.tools.registry import ToolRegistry, load_tools

BENCH_HELPERS = (  # modules of bench/ that are not benchmarks
    "common", "plots", "repair_metrics", "splice_workload", "report", "report_format",
    "report_sections", "routing_eval",
)


def _print_generation(answer: str, stats: GenerationStats) -> None:
    print(answer.strip())
    print(
        f"[{stats.prompt_tokens} prompt tokens, TTFT {stats.ttft_s * 1000:.0f} ms "
        f"({stats.prefill_tokens_per_s:.0f} tok/s prefill), "
        f"{stats.generated_tokens} tokens at {stats.decode_tokens_per_s:.1f} tok/s"
        + (f", {stats.accepted_tokens} of {stats.drafted_tokens} drafted tokens kept]"
           if stats.drafted_tokens else "]")
    )


def load_registry(source: str | checks.ToolsSource) -> ToolRegistry:
    """Tools from a registry file (``.json`` / Seal-Tools ``.jsonl``) or a live MCP server
    command line (started, listed, shut down); see :func:`checks.tools_source`."""
    if isinstance(source, str):
        source = checks.tools_source(source)
    if source.file is not None:
        return load_tools(source.file)
    from nexus_mlx.agent.mcp_server import ServerSpec, list_server_tools

    return list_server_tools(ServerSpec(source.command[0], source.command[1:]))


def _argmax(logits: mx.array) -> int:
    return int(np.argmax(np.array(logits)))


def _timed(fn: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


# ---- chat / demo -------------------------------------------------------------------------
def cmd_chat(args: argparse.Namespace) -> int:
    checks.request_text(args.prompt, "the prompt")
    checks.positive_int(args.max_tokens, "--max-tokens")
    draft_tokens = checks.non_negative_int(args.draft_tokens, "--draft-tokens")
    model, tokenizer = load(args.model)
    result = chat(model, tokenizer, args.prompt, max_tokens=args.max_tokens,
                  draft_tokens=draft_tokens)
    _print_generation(result.text, result.stats)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from nexus_mlx.cli.demo import run_demo

    return run_demo(args.model, extra_tools=checks.registry_files(args.extra_tools))


# ---- compile -----------------------------------------------------------------------------
def cmd_compile(args: argparse.Namespace) -> int:
    from nexus_mlx.blocks.compile import compile_directory

    registry = load_registry(checks.tools_source(args.tools))
    out = checks.output_directory(args.out)
    model, tokenizer = load(args.model)
    texts = {t.qualified_name: json.dumps({"name": t.qualified_name, "description": t.description,
                                           "inputSchema": t.input_schema}) for t in registry}
    report, seconds = _timed(lambda: compile_directory(
        model, tokenizer, texts, out, context=args.context, dtype=args.dtype,
        progress=lambda names: tqdm(names, desc="compiling", unit="tool", file=sys.stderr)))
    print(f"{len(report.written)} blocks written, {len(report.up_to_date)} up to date, in "
          f"{args.out} ({seconds:.1f} s)")
    return 0


# ---- route -------------------------------------------------------------------------------
def cmd_route(args: argparse.Namespace) -> int:
    from nexus_mlx.decode.tool_call import call_tool
    from nexus_mlx.routing.router import DEFAULT_K, build_router
    from nexus_mlx.tools.ir import tool_signature

    query = checks.request_text(args.query, "the request")
    k = DEFAULT_K if args.k is None else checks.positive_int(args.k, "-k")
    checks.positive_int(args.max_tokens, "--max-tokens")
    registry = load_registry(checks.tools_source(args.tools))
    with Stages(5, "route") as stages:
        stages.start(f"loading model {args.model!r}")
        model, tokenizer = load(args.model)
        stages.start(f"embedding {len(registry)} tools (disk-cached) and calibrating the gate")
        router, embed_s = _timed(lambda: build_router(
            registry, model, tokenizer, k=k, progress=tool_bar("embedding tools")))
        decision = router.route(query, on_stage=stages.start)
        tool = registry.get(decision.chosen)
        stages.start(f"generating arguments for {decision.chosen}")
        call = call_tool(model, tokenizer, query, [tool], max_argument_tokens=args.max_tokens)
    source = {True: "read from the embedding cache", False: "embedded (cache miss)"}.get(
        router.embeddings_cached, "embedded")
    print(f"registry: {len(registry)} tools {source}, gate calibrated, in {embed_s:.2f} s")
    cal = router.calibration
    print("gate: " + (cal.describe() if cal is not None else
                      "registry too small to calibrate; every request auto-routes"))
    for name, score in decision.candidates:
        print(f"  {score:7.4f}  {name}")
    verdict = "escalated to the reranker" if decision.escalated else "auto-routed"
    print(f"margin {decision.margin:.4f} vs tau {decision.tau:.4f}: {verdict} -> {decision.chosen}")
    print(f"IR: {tool_signature(tool)}")
    state = "valid" if call.valid else f"invalid: {list(call.errors)}"
    print(f"arguments: {json.dumps(call.arguments)} ({state})")
    times = {**decision.timings, "arguments": call.timings.total_s}
    print("timings: " + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in times.items()))
    return 0


# ---- splice-demo / repair-demo -----------------------------------------------------------
SPLICE_SCHEMA = json.dumps({
    "name": "create_repository",
    "description": "Create a new GitHub repository in your account",
    "inputSchema": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string", "description": "Repository name"},
        "description": {"type": "string", "description": "Repository description"},
        "private": {"type": "boolean", "description": "Whether repo should be private"},
        "autoInit": {"type": "boolean", "description": "Initialize with README"}}},
})


SPLICE_FILLER = "The assistant has been helping the user with a project. "
SPLICE_QUERY = " User: please create a private repository named demo."


def history_tokens(tokenizer: Any, n_past: int) -> list[int]:
    """Exactly ``n_past`` tokens of filler conversation (the filler repeated as needed)."""
    if n_past <= 0:
        return []
    reps = max(1, n_past // max(1, len(tokenizer.encode(SPLICE_FILLER))) + 2)
    ids = list(tokenizer.encode(SPLICE_FILLER * reps))
    while len(ids) < n_past:
        reps *= 2
        ids = list(tokenizer.encode(SPLICE_FILLER * reps))
    return ids[:n_past]


def median_seconds(run: Callable[[Any], Any], setup: Callable[[], Any], repeats: int
                   ) -> tuple[Any, float]:
    """``run(setup())`` once to warm up, then ``repeats`` timed times (setup untimed): the last
    output and the median seconds."""
    out = run(setup())
    times = []
    for _ in range(repeats):
        arg = setup()
        start = time.perf_counter()
        out = run(arg)
        times.append(time.perf_counter() - start)
    return out, statistics.median(times)


def max_splice_depth(model: Any, tokenizer: Any) -> int | None:
    """The deepest history the model's positions leave room for, block and query after it."""
    limit = model_plan(model).max_position
    if limit is None:
        return None
    return limit - len(tokenizer.encode(SPLICE_SCHEMA)) - len(tokenizer.encode(SPLICE_QUERY))


def cmd_splice_demo(args: argparse.Namespace) -> int:
    from nexus_mlx.blocks.compile import compile_block
    from nexus_mlx.blocks.curve import Curve
    from nexus_mlx.blocks.splicing import splice

    depths = checks.depths(args.depths)
    curve = Curve(K=args.K)
    repeats = checks.positive_int(args.repeats, "--repeats")
    model, tokenizer = load(args.model)
    deepest = max_splice_depth(model, tokenizer)
    too_deep = [d for d in depths if deepest is not None and d > deepest]
    if too_deep:
        raise ArgumentError(
            f"--depths {too_deep}: model {args.model!r} holds {model_plan(model).max_position} "
            f"positions, which leaves room for histories up to {deepest} tokens before the "
            "schema block and the query; ask for smaller depths")
    block = compile_block(model, tokenizer, SPLICE_SCHEMA)
    query = tokenizer.encode(SPLICE_QUERY)
    runs = f"{repeats} timed run{'s' if repeats > 1 else ''}"
    print(f"block: {block.num_tokens} schema tokens compiled at anchor {block.m0}; times are "
          f"medians of {runs} after 1 warm-up, each on a fresh copy of the history cache")
    print(f"{'n_past':>7} {'path':>9} {'R%':>6} {'prefill ms':>11} {'splice ms':>10} {'speedup':>8} "
          f"{'KL nats':>9} {'top-1':>6}")
    for asked in depths:
        base = make_cache(model)
        history = history_tokens(tokenizer, asked)
        if history:
            mx.eval(forward(model, history, base, logits="last"))
        n_past = base.n_past  # the depth actually measured
        assert n_past == asked, (n_past, asked)

        def fresh(base: Any = base) -> Any:
            c = base.copy()
            c.evaluate()
            return c

        def prefilled(c: Any) -> mx.array:
            out = forward(model, list(block.tokens) + query, c, logits="last")
            mx.eval(out)
            return out

        def spliced(c: Any) -> tuple[Any, mx.array]:
            result = splice(model, c, block, curve=curve)
            out = forward(model, query, c, logits="last")
            mx.eval(out)
            return result, out

        ref, t_ref = median_seconds(prefilled, fresh, repeats)
        (result, out), t_splice = median_seconds(spliced, fresh, repeats)
        agree = _argmax(ref[0, -1]) == _argmax(out[0, -1])
        print(f"{n_past:>7} {result.path:>9} {result.r_pct:>6.1f} {t_ref * 1e3:>11.0f} "
              f"{t_splice * 1e3:>10.0f} {t_ref / t_splice:>7.2f}x {next_token_kl(ref[0, -1], out[0, -1]):>9.4f} "
              f"{'yes' if agree else 'no':>6}")
    return 0


REPAIR_PARTS = (
    "Meeting notes. The project review will take place in room B12 on Thursday.",
    " Correction: the review has moved to room C7.",
    " Other notes: the budget was approved, the team welcomed two new engineers, and the "
    "launch date stays in March. Remember to bring the printed slides to the review.",
)
REPAIR_QUESTION = " Question: in which room is the project review? Answer: The review is in room"


def cmd_repair_demo(args: argparse.Namespace) -> int:
    from nexus_mlx.refresh import Edit, repair, reprefill, shift
    from nexus_mlx.refresh.allocators import get_allocator

    checks.percentage(args.budget, "--budget")
    get_allocator(args.allocator)  # an unknown name fails here, listing the known ones
    model, tokenizer = load(args.model)
    p, e, s = (tokenizer.encode(t, add_special_tokens=False) for t in REPAIR_PARTS)
    question = tokenizer.encode(REPAIR_QUESTION, add_special_tokens=False)
    cache = make_cache(model)
    mx.eval(forward(model, p + e + s, cache, logits="last"))
    edit = Edit(len(p), len(p) + len(e))
    print(f"context {cache.n_past} tokens; deleting the correction, rows [{edit.p0}, {edit.p1})")

    def answer(c: Any) -> tuple[str, mx.array]:
        logits = forward(model, question, c.copy(), logits="last")[0, -1]
        return tokenizer.decode(greedy_continuation(model, question, c.copy(), 3)), logits

    arms: dict[str, Any] = {}
    arms["reprefill"], t_ref = _timed(lambda: reprefill(model, cache, edit))
    arms["shift"], t_shift = _timed(lambda: shift(cache, edit))
    result, t_sur = _timed(lambda: repair(model, cache, edit, question, budget=args.budget,
                                          allocator=args.allocator, tokenizer=tokenizer))
    arms[f"{args.allocator} {args.budget:g}%"] = result.cache
    ref_text, ref_logits = answer(arms["reprefill"])
    times = {"reprefill": t_ref, "shift": t_shift, f"{args.allocator} {args.budget:g}%": t_sur}
    for name, c in arms.items():
        text, logits = answer(c)
        print(f"{name:>16}: '{text.strip()}'  KL to re-prefill {next_token_kl(ref_logits, logits):.4f} nats, "
              f"{times[name] * 1e3:.0f} ms")
    print(f"{args.allocator} recomputed {result.budget_tokens} of {result.suffix_length} suffix "
          f"tokens in {len(result.intervals)} intervals")
    return 0


# ---- serve -------------------------------------------------------------------------------
def cmd_serve(args: argparse.Namespace) -> int:
    from nexus_mlx.server import Server, bind_socket
    from nexus_mlx.server.session_store import check_free

    host, port = checks.host(args.host), checks.port(args.port)
    checks.percentage(args.budget, "--budget")
    cache_mib = checks.non_negative_int(args.cache_budget, "--cache-budget")
    max_sessions = checks.positive_int(args.max_sessions, "--max-sessions")
    max_tokens = checks.positive_int(args.max_tokens, "--max-tokens")
    guard = checks.nats(args.guard, "--guard")
    draft_tokens = checks.non_negative_int(args.draft_tokens, "--draft-tokens")
    stored = checks.non_negative_int(args.max_stored_responses, "--max-stored-responses")
    trim_heap_s = checks.seconds_or_off(args.trim_heap, "--trim-heap")
    idle_release_s = checks.seconds_or_off(args.idle_release, "--idle-release")
    session_dir = (check_free(checks.output_directory(args.session_dir, "--session-dir"))
                   if args.session_dir is not None else None)  # held by another: before loading
    sock = bind_socket(host, port)  # a busy port fails before the model loads
    try:
        model, tokenizer = load(args.model)
        server = Server(model, tokenizer, model_name=args.model, host=host, sock=sock,
                        policy=args.policy, budget=args.budget, cache_budget_mib=cache_mib,
                        max_sessions=max_sessions, max_tokens=max_tokens,
                        heal_after_reply=args.heal_after_reply, guard=guard,
                        draft_tokens=draft_tokens, max_stored_responses=stored,
                        trim_heap_s=trim_heap_s, idle_release_s=idle_release_s,
                        session_dir=session_dir, interleave=not args.no_interleave)
    except BaseException:
        sock.close()
        raise
    if session_dir is not None:
        done = server.engine.restored
        _say_store(f"restored {done.sessions} session(s)", done, f"{server.responses_restored} "
                   f"stored response(s), from {session_dir}", "file(s) refused")
    signalled = False
    try:
        with StopSignals() as stop:  # before the URL is printed: no signal can slip past
            server.start()
            print(f"serving model {args.model!r} at {server.base_url} (OpenAI-compatible; "
                  "Ctrl-C stops)", flush=True)
            signalled = stop.wait(lambda: server.running) is not None
    except KeyboardInterrupt:  # Ctrl-C before the handlers were installed
        signalled = True
    finally:
        if signalled:
            print("nexus-mlx: stopping the server", file=sys.stderr, flush=True)
        server.stop()
        if session_dir is not None:
            saved = server.engine.saved
            _say_store(f"saved {saved.sessions} session(s) ({saved.written} written now)", saved,
                       f"to {session_dir}", "could not be written")
    return 0


def _say_store(what: str, report: Any, where: str, refused: str) -> None:
    """One line on stderr about sessions restored or saved (``report``: a StoreReport)."""
    print(f"{what}, {report.rows} cached tokens, {where}"
          + (f"; {len(report.refused)} {refused} (see the log)" if report.refused else ""),
          file=sys.stderr, flush=True)


# ---- convert -----------------------------------------------------------------------------
CONVERT_DTYPES: dict[str, Any] = {"auto": "auto", "keep": None, "float32": mx.float32,
                                  "float16": mx.float16, "bfloat16": mx.bfloat16}


def cmd_convert(args: argparse.Namespace) -> int:
    from nexus_mlx.models.convert import check_output_dir, convert_model

    shard_mib = checks.positive_int(args.max_shard_size, "--max-shard-size")
    check_output_dir(args.out, args.force)  # before the model loads
    with Stages(1, "convert") as stages:
        stages.start(f"loading {args.model}, writing and checking {args.out}")
        result = convert_model(args.model, args.out, dtype=CONVERT_DTYPES[args.dtype],
                               force=args.force, max_shard_bytes=shard_mib << 20)
    quantized = f", {result.quantized_layers} quantized layers" if result.quantized_layers else ""
    print(f"wrote {result.path} ({result.nbytes / (1 << 20):.1f} MiB of weights in "
          f"{', '.join(result.dtypes)}{quantized}; files: {', '.join(result.files)})")
    print(f"load it with mlx_lm.load({str(result.path)!r}) or serve it with "
          f"mlx_lm.server --model {result.path}")
    return 0


# ---- bench / report ----------------------------------------------------------------------
def bench_dir() -> Path:
    """The source checkout's ``bench/`` folder: beside the package (an editable install) or in
    the working directory. Benchmarks and the report ship with the source, not the wheel."""
    for root in (Path(__file__).resolve().parents[2], Path.cwd()):
        if (root / "bench" / "common.py").is_file():
            return root / "bench"
    raise ArgumentError(
        "benchmarks and the report live in the source checkout's bench/ folder, which this "
        "installation does not have: clone the repository and run nexus-mlx from its root"
    )


def available_benchmarks(folder: Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.py")
                  if p.stem not in BENCH_HELPERS and not p.stem.startswith("_"))


def cmd_bench(args: argparse.Namespace) -> int:
    folder = bench_dir()
    names = available_benchmarks(folder)
    if args.name not in names:
        raise ArgumentError(f"unknown benchmark {args.name!r}; available: {', '.join(names)}")
    command = [sys.executable, str(folder / f"{args.name}.py")] + (["--quick"] if args.quick else [])
    return subprocess.call(command, cwd=folder.parent)


def cmd_report(args: argparse.Namespace) -> int:
    folder = bench_dir()
    results = checks.results_directory(args.results, suggestion=folder.parent / "results")
    return subprocess.call([sys.executable, str(folder / "report.py"), str(results)])
