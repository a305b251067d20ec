"""Benchmark: what the compressed IR's format hints cost in tokens and buy in argument accuracy.

Contract: ``python bench/ir_hints.py [--quick] [--model M] [--n N] [--tag T]`` (``M``: any
``nexus_mlx.load`` spec, default SmolLM2; the committed result is ``--model qwen2.5-coder-0.5b``,
its tokenizer counts the tokens and it writes the arguments) measures, for
each IR variant (``none``: no hints, ``max_hint_chars=0``, the IR before hints; ``hints-32`` /
``hints-48`` (the default) / ``hints-64``; ``desc-120``: every description cut to 120
characters):

- IR length in tokens of the model's tokenizer (median, p99, mean, max) over every tool of the
  117 GitHub MCP tools, the 4,076 Seal-Tools tools and the 14 tools of the live
  ``mcp-server-time`` and ``mcp-server-git`` servers (listed through the MCP SDK);
- argument accuracy on ``bench/time_git_queries.jsonl`` (the first ``--n``; gold calls with
  acceptable values, scored by ``tasks.call_scoring.score_call``): each query's gold tool alone
  is offered (the name is forced), the arguments are generated greedily under the schema
  grammar (``decode.tool_call.call_tool``), so the only difference between variants is the
  signature line. Reported: call accuracy, per-argument accuracy over the arguments the query
  specifies, Wilson 95% CIs, and each call.

``--quick``: token statistics only on the first 300 Seal-Tools tools, and 3 queries with the
``none`` and ``hints-48`` variants. JSON ``{"config", "model", "tokens": {registry: {variant:
stats}}, "accuracy": {variant: {...}}, "calls", "timing_s"}`` in ``results/ir_hints[_<tag>].json``
(``results/quick/`` with ``--quick``), a PNG beside it, and the JSON as the last stdout line.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # 2 shared cores: one BLAS thread

from common import ( # noqa: I001
    ROOT,
    add_model_argument,
    add_tag_argument,
    arg_parser,
    emit,
    model_record,
    tagged_name,
)

import subprocess
import tempfile
import time
from dataclasses import asdict
from typing import Any

import nexus_mlx
from nexus_mlx.agent.mcp_server import installed_server, list_server_tools
from nexus_mlx.decode.tool_call import call_tool
from nexus_mlx.tools.ir import IROptions, ir_length_stats
from nexus_mlx.tools.registry import ToolRegistry, load_tools
from routing_eval import GITHUB_TOOLS, SEAL_TOOLS, log, wilson
from tasks.call_scoring import read_gold, score_call

NAME = "ir_hints"
QUERIES = ROOT / "bench" / "time_git_queries.jsonl"
VARIANTS: dict[str, IROptions] = {
    "none": IROptions(max_hint_chars=0),
    "hints-32": IROptions(max_hint_chars=32),
    "hints-48": IROptions(max_hint_chars=48),
    "hints-64": IROptions(max_hint_chars=64),
    "desc-120": IROptions(max_desc_chars=120),
}
QUICK_VARIANTS = ("none", "hints-48")
ACCURACY_VARIANTS = ("none", "hints-48", "desc-120")
QUICK_SEAL, QUICK_QUERIES = 300, 3
MAX_ARGUMENT_TOKENS = 64


def time_git_registry() -> ToolRegistry:
    """The tools the live time and git MCP servers list (a scratch repository for git)."""
    with tempfile.TemporaryDirectory(prefix="nexus-ir-hints-") as repo:
        subprocess.run(["git", "init", "-q", repo], check=True)
        tools = list(list_server_tools(installed_server("mcp-server-time", "mcp_server_time")))
        tools += list(list_server_tools(installed_server(
            "mcp-server-git", "mcp_server_git", "--repository", repo)))
    return ToolRegistry(tools)


def token_table(registries: dict[str, ToolRegistry], tokenizer: Any,
                variants: list[str]) -> dict[str, dict[str, Any]]:
    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    return {name: {v: asdict(ir_length_stats(reg, encode, VARIANTS[v])) for v in variants}
            for name, reg in registries.items()}


def accuracy(model: Any, tokenizer: Any, registry: ToolRegistry, n: int,
             variants: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    gold = read_gold(QUERIES)[:n]
    calls: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    for variant in variants:
        right = args_right = args_total = 0
        for call in gold:
            tool = registry.get(call.tool)
            t0 = time.perf_counter()
            result = call_tool(model, tokenizer, call.query, [tool], ir_options=VARIANTS[variant],
                               max_argument_tokens=MAX_ARGUMENT_TOKENS)
            score = score_call(call, result.name, result.arguments,
                               tool.input_schema.get("required", []))
            specified = [a for a in call.arguments if a in score.arguments]
            hits = sum(score.arguments[a] for a in specified)
            right += score.call_right
            args_right += hits
            args_total += len(specified)
            calls.append({"variant": variant, "id": call.id, "arguments": result.arguments,
                          "correct": score.call_right, "specified_right": hits,
                          "specified": len(specified), "valid": result.valid,
                          "seconds": time.perf_counter() - t0})
            log(f"{variant} {call.id}: {'ok ' if score.call_right else 'BAD'} {result.arguments}")
        summary[variant] = {"n": len(gold), "call_accuracy": right / len(gold),
                            "call_ci": wilson(right, len(gold)),
                            "argument_accuracy": args_right / max(args_total, 1),
                            "argument_ci": wilson(args_right, args_total),
                            "arguments": args_total}
    return summary, calls


def draw_figure(result: dict[str, Any], name: str, quick: bool) -> None:
    import plots

    fig, (ax, ax2) = plots.figure(2)
    for registry, stats in result["tokens"].items():
        names = list(stats)
        ax.plot(range(len(names)), [stats[v]["median"] for v in names], "o-", label=registry)
        ax.set_xticks(range(len(names)), names, fontsize=7)
    ax.set_ylabel("IR tokens per tool (median)")
    ax.legend(fontsize=7)
    acc = result["accuracy"]
    names = list(acc)
    ax2.bar(range(len(names)), [acc[v]["argument_accuracy"] for v in names])
    ax2.set_xticks(range(len(names)), names, fontsize=7)
    ax2.set_ylim(0, 1.02)
    ax2.set_ylabel(f"argument accuracy (time/git, n={acc[names[0]]['n']} calls)")
    plots.save(fig, name, quick)


def main() -> dict[str, Any]:
    parser = arg_parser("compressed-IR format hints: token cost and argument accuracy")
    parser.add_argument("--n", type=int, default=100, help="time/git queries (file order)")
    add_tag_argument(parser)
    add_model_argument(parser)
    args = parser.parse_args()
    wall = time.perf_counter()
    timing: dict[str, float] = {}
    t0 = time.perf_counter()
    live = time_git_registry()
    seal = load_tools(SEAL_TOOLS)
    if args.quick:
        seal = ToolRegistry(list(seal)[:QUICK_SEAL])
    registries = {"github-mcp": load_tools(GITHUB_TOOLS), "seal-tools": seal, "time+git": live}
    model, tokenizer = nexus_mlx.load(args.model)
    timing["load_s"] = time.perf_counter() - t0
    variants = list(QUICK_VARIANTS if args.quick else VARIANTS)
    t0 = time.perf_counter()
    tokens = token_table(registries, tokenizer, variants)
    timing["tokens_s"] = time.perf_counter() - t0
    for registry, stats in tokens.items():
        log(f"{registry}: " + ", ".join(f"{v} {s['median']:.0f}" for v, s in stats.items()))
    t0 = time.perf_counter()
    n = min(args.n, QUICK_QUERIES) if args.quick else args.n
    acc_variants = [v for v in ACCURACY_VARIANTS if v in variants]
    summary, calls = accuracy(model, tokenizer, live, n, acc_variants)
    timing["accuracy_s"] = time.perf_counter() - t0
    timing["total_s"] = time.perf_counter() - wall
    name = tagged_name(NAME, args.tag)
    result = {
        "config": {"queries": str(QUERIES), "variants": {v: asdict(VARIANTS[v]) for v in variants},
                   "offered": "the gold tool alone (name forced); greedy; schema grammar",
                   "max_argument_tokens": MAX_ARGUMENT_TOKENS,
                   "token_unit": "tokens of the model's tokenizer, IR line only"},
        **model_record(args.model, model),
        "tokens": tokens,
        "accuracy": summary,
        "calls": calls,
        "timing_s": timing,
        "loadavg": list(os.getloadavg()),
    }
    draw_figure(result, name, args.quick)
    return emit(name, result, args.quick)


if __name__ == "__main__":
    main()
