"""The ``nexus-mlx`` subcommands (``cli.py`` parses arguments and handles errors).

Contract: each ``cmd_<name>(args) -> int`` runs one subcommand and returns the exit status;
caller errors raise :class:`~nexus_mlx.errors.NexusError` subclasses with a readable message.
Long work shows a tqdm progress bar on stderr.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from tqdm import tqdm

from nexus_mlx.decode.generate import GenerationStats, chat
from nexus_mlx.errors import ArgumentError
from nexus_mlx.metrics import next_token_kl
from nexus_mlx.models.forward import forward, make_cache
from nexus_mlx.models.load import load
from nexus_mlx.tools.registry import ToolRegistry, load_tools

BENCH_HELPERS = (  # modules of bench/ that are not benchmarks
    "common", "plots", "repair_metrics", "splice_workload", "report", "report_format",
    "report_sections",
)


def _print_generation(answer: str, stats: GenerationStats) -> None:
    print(answer.strip())
    print(
        f"[{stats.prompt_tokens} prompt tokens, TTFT {stats.ttft_s * 1000:.0f} ms "
        f"({stats.prefill_tokens_per_s:.0f} tok/s prefill), "
        f"{stats.generated_tokens} tokens at {stats.decode_tokens_per_s:.1f} tok/s]"
    )


def load_registry(source: str) -> ToolRegistry:
    """Tools from a registry file (``.json`` / Seal-Tools ``.jsonl``) or, for anything else, a
    live MCP server command line (started, listed, shut down)."""
    path = Path(source).expanduser()
    if path.is_file() and path.suffix.lower() in (".json", ".jsonl"):
        return load_tools(path)
    from nexus_mlx.agent.mcp_server import ServerSpec, list_server_tools

    words = shlex.split(source)
    if not words:
        raise ArgumentError("--tools needs a registry file or an MCP server command")
    return list_server_tools(ServerSpec(words[0], tuple(words[1:])))


def _argmax(logits: mx.array) -> int:
    return int(np.argmax(np.array(logits)))


def _timed(fn: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


# ---- chat / demo -------------------------------------------------------------------------
def cmd_chat(args: argparse.Namespace) -> int:
    model, tokenizer = load(args.model)
    result = chat(model, tokenizer, args.prompt, max_tokens=args.max_tokens)
    _print_generation(result.text, result.stats)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from nexus_mlx.cli.demo import run_demo

    return run_demo(args.model, extra_tools=[Path(p) for p in args.extra_tools])


# ---- compile -----------------------------------------------------------------------------
def cmd_compile(args: argparse.Namespace) -> int:
    from nexus_mlx.blocks.compile import compile_directory

    registry = load_registry(args.tools)
    model, tokenizer = load(args.model)
    texts = {t.qualified_name: json.dumps({"name": t.qualified_name, "description": t.description,
                                           "inputSchema": t.input_schema}) for t in registry}
    report, seconds = _timed(lambda: compile_directory(
        model, tokenizer, texts, args.out, context=args.context, dtype=args.dtype,
        progress=lambda names: tqdm(names, desc="compiling", unit="tool", file=sys.stderr)))
    print(f"{len(report.written)} blocks written, {len(report.up_to_date)} up to date, in "
          f"{args.out} ({seconds:.1f} s)")
    return 0


# ---- route -------------------------------------------------------------------------------
def cmd_route(args: argparse.Namespace) -> int:
    from nexus_mlx.decode.tool_call import call_tool
    from nexus_mlx.routing.router import DEFAULT_K, build_router
    from nexus_mlx.tools.ir import tool_signature

    registry = load_registry(args.tools)
    model, tokenizer = load(args.model)
    router, embed_s = _timed(lambda: build_router(
        registry, model, tokenizer, k=DEFAULT_K if args.k is None else args.k))
    decision = router.route(args.query)
    print(f"registry: {len(registry)} tools embedded and calibrated in {embed_s:.2f} s")
    for name, score in decision.candidates:
        print(f"  {score:7.4f}  {name}")
    verdict = "escalated to the reranker" if decision.escalated else "auto-routed"
    print(f"margin {decision.margin:.4f} vs tau {decision.tau:.4f}: {verdict} -> {decision.chosen}")
    tool = registry.get(decision.chosen)
    print(f"IR: {tool_signature(tool)}")
    call = call_tool(model, tokenizer, args.query, [tool], max_argument_tokens=args.max_tokens)
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


def cmd_splice_demo(args: argparse.Namespace) -> int:
    from nexus_mlx.blocks.compile import compile_block
    from nexus_mlx.blocks.curve import Curve
    from nexus_mlx.blocks.splicing import splice

    model, tokenizer = load(args.model)
    block = compile_block(model, tokenizer, SPLICE_SCHEMA)
    query = tokenizer.encode(" User: please create a private repository named demo.")
    filler = tokenizer.encode("The assistant has been helping the user with a project. " * 200)
    print(f"block: {block.num_tokens} schema tokens compiled at anchor {block.m0}")
    print(f"{'n_past':>7} {'path':>9} {'R%':>6} {'prefill ms':>11} {'splice ms':>10} {'speedup':>8} "
          f"{'KL nats':>9} {'top-1':>6}")
    for n_past in args.depths:
        history = filler[:n_past]
        base = make_cache(model)
        if history:
            mx.eval(forward(model, history, base, logits="last"))
        ref_cache, cache = base.copy(), base.copy()

        def prefilled(c: Any = ref_cache) -> mx.array:
            out = forward(model, list(block.tokens) + query, c, logits="last")
            mx.eval(out)
            return out

        ref, t_ref = _timed(prefilled)

        def spliced(c: Any = cache) -> tuple[Any, mx.array]:
            result = splice(model, c, block, curve=Curve(K=args.K))
            out = forward(model, query, c, logits="last")
            mx.eval(out)
            return result, out

        (result, out), t_splice = _timed(spliced)
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

    model, tokenizer = load(args.model)
    p, e, s = (tokenizer.encode(t, add_special_tokens=False) for t in REPAIR_PARTS)
    question = tokenizer.encode(REPAIR_QUESTION, add_special_tokens=False)
    cache = make_cache(model)
    mx.eval(forward(model, p + e + s, cache, logits="last"))
    edit = Edit(len(p), len(p) + len(e))
    print(f"context {cache.n_past} tokens; deleting the correction, rows [{edit.p0}, {edit.p1})")

    def answer(c: Any) -> tuple[str, mx.array]:
        logits = forward(model, question, c.copy(), logits="last")[0, -1]
        return tokenizer.decode(forward_greedy(model, c, question, 3)), logits

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


def forward_greedy(model: Any, cache: Any, prompt: list[int], n: int) -> list[int]:
    """``n`` greedy tokens after ``prompt`` on a copy of ``cache``."""
    work = cache.copy()
    logits = forward(model, prompt, work, logits="last")
    out: list[int] = []
    for _ in range(n):
        token = _argmax(logits[0, -1])
        out.append(token)
        logits = forward(model, [token], work, logits="last")
    return out


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
    return subprocess.call([sys.executable, str(folder / "report.py"), args.results])
