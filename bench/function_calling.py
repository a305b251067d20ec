"""Benchmark: function calling end to end: route over the whole registry, generate the arguments,
score the call as a parsed structure.

Contract: ``python bench/function_calling.py [--registry R] [--queries Q] [--model M] [--n N]
[--skip K] [--prompt ir|native] [--reranker default|ql|choice] [--no-grounding] [--tag T]
[--quick]``. ``R`` is an
MCP-style tool file (``{"tools": [...]}`` or a plain list) or a Seal-Tools ``tool.jsonl``
(``nexus_mlx.tools.registry.load_tools``); default the 117 GitHub MCP tools. ``Q`` is a JSON-lines gold file (``{"id", "query", "tool", "arguments",
"acceptable"}``, ``bench/tasks/call_scoring.py``; default ``bench/github_queries.jsonl``) or a
Seal-Tools ``dev.jsonl``, converted at run time by ``bench/tasks/seal_queries.py`` (its
single-call rows). Every gold call is checked against its tool's schema first
(``call_scoring.schema_problems``); one that fails, or whose tool the registry lacks, is
skipped and listed. ``--n``: the first N queries (0: all) after the first ``--skip`` K (a
held-out slice: ``--skip 60 --n 60`` is the 60 queries after the default 60).

Each query is one :meth:`nexus_mlx.agent.orchestrator.Agent.turn`, the demo's path: the library
router (:func:`~nexus_mlx.routing.router.build_router` defaults: MiniLM embedder, INT8 SLB of the
registry, gate calibrated on it, ``default_reranker`` on model ``M`` for escalated queries, or
the one ``--reranker`` names) picks the tool, then ``generate_tool_call`` writes its arguments
over the tool's compressed-IR signature (``--prompt native``: its full definition in the
model's own tool prompt), the JSON constrained by the schema's grammar (greedy, at most
``--max-argument-tokens`` sampled argument tokens); optional arguments the request does not
support are dropped (``nexus_mlx.decode.grounding``; ``--no-grounding`` keeps them). One
untimed warm-up turn runs first; then every query is timed once (route, arguments, total: wall
clock per query).

Scoring (``call_scoring.score_call``): the call is right when the tool is the gold one, every
argument the gold names has an acceptable value (or is omitted where ``""`` is acceptable), it
carries no argument the gold does not name, and no required one is missing. Numbers compare by
value, booleans only with booleans, strings exactly after trimming (case-sensitive).

JSON keys (top level): ``n``, ``routing_accuracy``, ``call_accuracy`` (tool and every argument
right, over all queries), ``argument_accuracy`` (on correctly routed queries, the share of the
gold's argument slots, optional ones included, that are right), ``schema_valid`` (share of
calls that are complete and validate against the routed tool's schema), each with a Wilson
95% interval in ``<key>_ci`` (argument slots are counted as independent there, which they are
not quite); ``specified_argument_accuracy`` (routed queries, only the arguments the query
specifies, the gold ``arguments``), ``argument_accuracy_e2e`` (all queries, a misrouted
query's slots wrong), ``call_accuracy_routed``, ``json_valid`` (schema-valid and no
placeholder text: ``ToolCallResult.valid``), ``call_accuracy_fold_case`` (a diagnostic: strings
case-folded, inner whitespace collapsed), ``call_accuracy_ungrounded`` (the same calls with
the dropped arguments put back: what the run scores without grounding, from the same
generations; ``grounding_fixed`` / ``grounding_broke`` list the ids it changed),
``latency_ms`` (medians with bootstrap CIs of route / arguments / total), ``per_argument``
(accuracy by argument name over routed queries) and ``per_tool_argument``, ``failures`` (why
wrong calls are wrong), ``model`` / ``model_info`` (the model run), ``targets`` (issue 16's,
for the registry when it has them), ``per_query``. Writes
``results/function_calling[_<tag>].json`` (``results/quick/`` with ``--quick``), a PNG beside
it, and prints the JSON as the last stdout line. ``--quick`` (~2 min here): 4 queries, 48
argument tokens.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # 2 shared cores: one BLAS thread

from common import ( # nexus_mlx first
    add_model_argument,
    add_tag_argument,
    arg_parser,
    emit,
    median_ci,
    model_record,
    tagged_name,
)

import json
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np

import nexus_mlx
from nexus_mlx.agent.orchestrator import Agent
from nexus_mlx.decode.placeholders import schema_errors
from nexus_mlx.decode.tool_call import DEFAULT_OPTIONAL_MARGIN, PROMPT_STYLES
from nexus_mlx.routing.rerank import QueryLikelihoodReranker, ToolChoiceReranker
from nexus_mlx.routing.router import build_router
from nexus_mlx.tools.registry import ToolRegistry, load_tools
from routing_eval import GITHUB_QUERIES, GITHUB_TOOLS, log, wilson
from tasks.call_scoring import CallScore, GoldCall, read_gold, schema_problems, score_call
from tasks.seal_queries import seal_gold_calls

NAME = "function_calling"
QUICK_QUERIES, QUICK_BUDGET = 4, 48
DEFAULT_BUDGET = 96  # Agent's default max_argument_tokens
TARGETS: dict[str, dict[str, float]] = {  # issue 16's "done means", on the Qwen model
    "github-mcp": {"routing_accuracy": 0.85, "call_accuracy": 0.75,
                   "specified_argument_accuracy": 0.95, "schema_valid": 1.0},
    "seal-tools": {"routing_accuracy": 0.85, "call_accuracy": 0.70, "schema_valid": 1.0},
}


# ---------------------------------------------------------------------------------------------
# Gold calls


def load_gold(path: Path, registry: ToolRegistry) -> tuple[list[GoldCall], dict[str, str]]:
    """The gold calls of ``path`` that can be scored over ``registry``, and {id: why skipped}."""
    lines = [line for line in path.read_text("utf-8").splitlines() if line.strip()]
    if lines and "calling" in json.loads(lines[0]):  # a Seal-Tools dev file
        schemas = {t.qualified_name: t.input_schema for t in registry}
        calls, skipped = seal_gold_calls([json.loads(line) for line in lines], schemas)
    else:
        calls, skipped = read_gold(path), {}
    usable = []
    for call in calls:
        if call.tool not in registry:
            skipped[call.id] = f"tool {call.tool!r} not in the registry"
            continue
        problems = schema_problems(call, registry.get(call.tool).input_schema)
        if problems:
            skipped[call.id] = "; ".join(problems[:3])
            continue
        usable.append(call)
    return usable, skipped


# ---------------------------------------------------------------------------------------------
# Summary


def share(k: int, n: int) -> tuple[float, list[float]]:
    return (k / n if n else 0.0), wilson(k, n)


def why_wrong(row: dict[str, Any]) -> str:
    """The first reason a wrong call is wrong (for the failure breakdown)."""
    if not row["routed_ok"]:
        return "misrouted"
    if not row["complete"]:
        return "incomplete"
    if row["missing_required"]:
        return "missing_required"
    if row["unknown"]:
        return "unknown_argument"
    return "wrong_value"


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(rows)
    routed = [r for r in rows if r["routed_ok"]]
    slots = [ok for r in routed for ok in r["argument_right"].values()]
    specified = [r["argument_right"][k] for r in routed for k in r["specified"]]
    all_slots = sum(len(r["argument_right"]) for r in rows)
    by_name: dict[str, list[bool]] = defaultdict(list)
    by_tool_arg: dict[str, list[bool]] = defaultdict(list)
    for r in routed:
        for name, ok in r["argument_right"].items():
            by_name[name].append(ok)
            by_tool_arg[f"{r['gold']}.{name}"].append(ok)
    out: dict[str, Any] = {"n": n}
    for key, k, total in (
        ("routing_accuracy", len(routed), n),
        ("call_accuracy", sum(r["call_right"] for r in rows), n),
        ("argument_accuracy", sum(slots), len(slots)),
        ("schema_valid", sum(r["schema_valid"] for r in rows), n),
        ("specified_argument_accuracy", sum(specified), len(specified)),
        ("argument_accuracy_e2e", sum(slots), all_slots),
        ("call_accuracy_routed", sum(r["call_right"] for r in routed), len(routed)),
        ("json_valid", sum(r["valid"] for r in rows), n),
        ("call_accuracy_fold_case", sum(r["call_right_fold_case"] for r in rows), n),
        ("call_accuracy_ungrounded", sum(r["call_right_ungrounded"] for r in rows), n),
    ):
        out[key], out[f"{key}_ci"] = share(k, total)
        out[f"{key}_count"] = [k, total]
    latency = {}
    for part in ("route", "arguments", "total"):
        med, lo, hi = median_ci([r["ms"][part] for r in rows])
        latency[part] = {"median": med, "ci": [lo, hi]}
    out["latency_ms"] = latency
    out["escalated"] = sum(r["escalated"] for r in rows) / n
    out["per_argument"] = {k: {"n": len(v), "right": sum(v), "accuracy": sum(v) / len(v)}
                           for k, v in sorted(by_name.items())}
    out["per_tool_argument"] = {k: {"n": len(v), "right": sum(v)}
                                for k, v in sorted(by_tool_arg.items())}
    out["grounding_fixed"] = [r["id"] for r in rows
                              if r["call_right"] and not r["call_right_ungrounded"]]
    out["grounding_broke"] = [r["id"] for r in rows
                              if r["call_right_ungrounded"] and not r["call_right"]]
    out["failures"] = dict(Counter(why_wrong(r) for r in rows if not r["call_right"]))
    return out


# ---------------------------------------------------------------------------------------------
# Figure


def draw_figure(result: dict[str, Any], rows: list[dict[str, Any]], name: str,
                quick: bool) -> None:
    import plots

    fig, (ax, ax2) = plots.figure(2)
    keys = ["routing_accuracy", "call_accuracy", "argument_accuracy",
            "specified_argument_accuracy", "schema_valid"]
    labels = ["routing", "call", "arguments\n(routed)", "specified\nargs (routed)", "schema\nvalid"]
    values = [result[k] for k in keys]
    ax.bar(range(len(keys)), values, yerr=plots.error_bars(values, [result[f"{k}_ci"]
                                                                    for k in keys]), capsize=3)
    for i, k in enumerate(keys):
        target = result["targets"].get(k)
        if target is not None:
            ax.plot([i - 0.4, i + 0.4], [target, target], "r--", lw=1)
        ax.annotate(f"{values[i]:.2f}", (i, values[i] + 0.02), ha="center", fontsize=8)
    ax.set_xticks(range(len(keys)), labels, fontsize=8)
    ax.set_ylim(0, 1.1)
    ax.set_title(f"{result['registry_name']} ({result['n_tools']} tools), n={result['n']}, "
                 f"{result['model_info']['spec']} (red: issue 16 targets)", fontsize=9)
    route = np.array([r["ms"]["route"] for r in rows])
    args = np.array([r["ms"]["arguments"] for r in rows])
    order = np.argsort(route + args)
    ax2.bar(range(len(rows)), route[order], label="route")
    ax2.bar(range(len(rows)), args[order], bottom=route[order], label="arguments")
    ax2.set_xlabel("query (sorted by total)")
    ax2.set_ylabel("ms")
    ax2.set_title(f"latency per query, median total {result['latency_ms']['total']['median']:.0f}"
                  " ms", fontsize=9)
    ax2.legend(fontsize=8)
    plots.save(fig, name, quick)


# ---------------------------------------------------------------------------------------------
# Main


def main() -> dict[str, Any]:
    parser = arg_parser("function calling: routing + arguments, scored as parsed calls")
    add_model_argument(parser)
    parser.add_argument("--registry", type=Path, default=GITHUB_TOOLS)
    parser.add_argument("--queries", type=Path, default=GITHUB_QUERIES)
    parser.add_argument("--n", type=int, default=0, help="first n queries (0: all)")
    parser.add_argument("--skip", type=int, default=0, help="skip the first k queries")
    add_tag_argument(parser)
    parser.add_argument("--max-argument-tokens", type=int, default=DEFAULT_BUDGET)
    parser.add_argument("--optional-margin", type=float, default=DEFAULT_OPTIONAL_MARGIN,
                        help="nats an argument past the required ones must win by "
                             "(generate_tool_call's optional_margin; 0: off)")
    parser.add_argument("--prompt", choices=PROMPT_STYLES, default="ir",
                        help="argument prompt: the compressed-IR signature (ir) or the model's "
                             "own tool prompt with the full schema (native)")
    parser.add_argument("--no-grounding", action="store_true",
                        help="keep optional arguments the request does not support")
    parser.add_argument("--reranker", choices=("default", "ql", "choice"), default="default",
                        help="the router's reranker: the library default for the model "
                             "(default_reranker), query likelihood, or tool choice")
    args = parser.parse_args()
    wall = time.perf_counter()
    registry = load_tools(args.registry)
    gold, skipped = load_gold(args.queries, registry)
    gold = gold[args.skip:][: QUICK_QUERIES if args.quick else (args.n or None)]
    if not gold:
        raise SystemExit(f"no scorable gold calls in {args.queries} ({len(skipped)} skipped)")
    budget = min(args.max_argument_tokens, QUICK_BUDGET) if args.quick else \
        args.max_argument_tokens
    log(f"{len(registry)} tools, {len(gold)} queries ({len(skipped)} skipped), model "
        f"{args.model}")

    model, tokenizer = nexus_mlx.load(args.model)
    start = time.perf_counter()
    reranker = {"default": None, "ql": QueryLikelihoodReranker,
                "choice": ToolChoiceReranker}[args.reranker]
    router = build_router(registry, model, tokenizer,
                          reranker=reranker(model, tokenizer) if reranker else None)
    setup_s = time.perf_counter() - start
    agent = Agent(model, tokenizer, registry, router, max_argument_tokens=budget,
                  optional_margin=args.optional_margin, prompt_style=args.prompt,
                  ground_optional=not args.no_grounding)
    agent.turn([{"role": "user", "content": gold[0].query}])  # warm-up (untimed)

    rows: list[dict[str, Any]] = []
    for call in gold:
        start = time.perf_counter()
        turn = agent.turn([{"role": "user", "content": call.query}])
        total_ms = (time.perf_counter() - start) * 1e3
        result, decision = turn.call, turn.route
        routed_tool = registry.get(result.name)
        gold_schema = registry.get(call.tool).input_schema
        required = gold_schema.get("required") or ()
        score: CallScore = score_call(call, result.name, result.arguments, required)
        lenient = score_call(call, result.name, result.arguments, required, fold_case=True)
        raw = score_call(call, result.name, {**result.arguments, **result.dropped}, required)
        schema_ok = result.complete and not schema_errors(result.arguments,
                                                          routed_tool.input_schema)
        rows.append({
            "id": call.id, "query": call.query, "gold": call.tool, "routed": decision.chosen,
            "routed_ok": score.tool_right, "escalated": decision.escalated,
            "candidates": [name for name, _ in decision.candidates[:3]],
            "arguments": result.arguments, "gold_arguments": call.arguments,
            "specified": sorted(call.arguments), "argument_right": score.arguments,
            "unknown": list(score.unknown), "missing_required": list(score.missing_required),
            "call_right": score.call_right, "call_right_fold_case": lenient.call_right,
            "dropped": result.dropped, "call_right_ungrounded": raw.call_right,
            "complete": result.complete,
            "schema_valid": bool(schema_ok), "valid": result.valid,
            "errors": list(result.errors), "mode": result.mode,
            "ms": {"route": turn.timings["route"] * 1e3,
                   "arguments": turn.timings["arguments"] * 1e3, "total": total_ms},
            "prompt_tokens": turn.prompt_tokens,
        })
        r = rows[-1]
        log(f"{call.id} {call.tool} -> {decision.chosen} {json.dumps(result.arguments)[:100]} "
            f"{'RIGHT' if score.call_right else 'wrong'} ({total_ms:.0f} ms)"
            + ("" if score.call_right else f" {why_wrong(r)}"))

    summary = summarize(rows)
    registry_name = args.registry.parent.name
    targets = TARGETS.get(registry_name, {})
    payload: dict[str, Any] = {
        **{k: summary[k] for k in ("routing_accuracy", "call_accuracy", "argument_accuracy",
                                   "schema_valid", "n")},
        **model_record(args.model, model),
        "registry_name": registry_name, "registry": str(args.registry),
        "queries": str(args.queries), "n_tools": len(registry),
        "skipped": {"count": len(skipped),
                    "reasons": dict(Counter(skipped.values()).most_common(20)),
                    "ids": list(skipped)[:50]},
        **{k: v for k, v in summary.items() if k not in ("n",)},
        "targets": {**targets, "met": {k: summary[k] >= v for k, v in targets.items()}},
        "config": {
            "pipeline": "Agent.turn: build_router (MiniLM + INT8 SLB + BM25 + calibrated gate "
                        "+ the reranker on the model) -> tool_call_prompt (style below) -> "
                        "generate_tool_call (greedy, schema grammar)",
            "prompt": args.prompt,
            "max_argument_tokens": budget, "optional_margin": args.optional_margin,
            "ground_optional": not args.no_grounding, "skip": args.skip,
            "k": router.k, "tau": router.gate.tau,
            "calibration": router.calibration.describe() if router.calibration else None,
            "reranker": type(router.reranker).__name__,
            "timing": "wall clock per query after one untimed warm-up turn",
            "scoring": "call_scoring.score_call: AST-style; numbers by value, strings exact "
                       "after trimming (case-sensitive), booleans apart from numbers",
            "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS")},
        "per_query": rows,
        "setup_s": setup_s,
        "seconds": time.perf_counter() - wall,
        "loadavg": list(os.getloadavg()),
    }
    name = tagged_name(NAME, args.tag)
    draw_figure(payload, rows, name, args.quick)
    return emit(name, payload, args.quick)


if __name__ == "__main__":
    main()
