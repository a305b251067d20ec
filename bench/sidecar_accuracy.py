"""Benchmark: arguments over the compressed IR vs a full-schema re-prefill (paper 1, sidecar).

Contract: ``python bench/sidecar_accuracy.py [--quick] [--registry PATH] [--queries PATH]
[--model M] [--tag T]`` (``M``: any ``nexus_mlx.load`` spec, default SmolLM2; recorded as
``model``)
(default: the 117 GitHub MCP tools and ``bench/github_queries.jsonl``; Seal-Tools files work
too). Every query goes through the whole pipeline:

1. Route: the library ``Router`` over the whole registry: embedder with the query prefix
   ``"query: "``, SLB of ``words_params`` tool texts fused with BM25 over them
   (``--lexical-weight``, the library default), gate with ``tau`` calibrated on the fused score,
   the library's query-likelihood reranker fused with the retrieval score (its default weight),
   on escalated queries (the library's k).
2. Arguments: ``generate_tool_call`` on ``tool_call_prompt`` with the routed tool's IR
   signature (the name is forced; JSON constrained by the schema's grammar; greedy), with
   ``max_argument_tokens=64`` (``--max-argument-tokens``; the library's default is 160): greedy
   decoding of this 135M model can loop inside a string value, and every gold call here fits.
3. Latency to the first argument, two prompts for the routed tool, each prefilled into an empty
   cache (the sidecar sequence starts at position 0) and decoded under the same grammar until
   the first argument value is complete (a string/object/array value at its closing character,
   a number or literal at the delimiter after it; an empty argument object at its ``}``):
   ``ir``: ``tool_call_prompt`` (system message with the IR signature, the request);
   ``full``: the same system message with the tool's full JSON definition (name, description,
   input schema) in place of the signature. Before timing, the IR run's text must be a prefix of
   step 2's output. Arms alternate order query by query; each query is timed once per arm after
   one untimed warm-up pair.

JSON keys: ``routing_acc`` (Wilson CI), ``specified_arg_acc`` (on correctly routed queries, the
share of the arguments the query specifies, i.e. the gold ``arguments``, whose value equals gold:
numbers by value, strings exactly, lists and objects element-wise), ``e2e_arg_acc`` (the same
over all queries, a misrouted query's arguments counting as wrong), ``json_valid`` (share of
calls that are complete, schema-valid and placeholder-free), ``ir_tokens_median`` /
``ir_tokens_p99`` (IR signature tokens over the registry), ``first_arg_ms_ir`` /
``first_arg_ms_full`` (medians over queries, bootstrap CIs), ``speedup`` (ratio of the medians;
the median of per-query ratios too), ``token_saving`` (the paper's measure: 1 - IR signature
tokens / full JSON definition tokens of the routed tools, summed over queries: the text the IR
replaces), ``prompt_token_saving`` (the same over whole prompts, including the shared system
instruction, chat template and request, which both arms carry), plus lenient and per-query
variants, routing latencies and the targets. ``--quick`` (< 1 min): 3
queries, 24 argument tokens. Writes
``results/sidecar_accuracy[_<tag>].json`` (``results/quick/`` with ``--quick``), a PNG, and
prints the JSON as the last stdout line.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # 2 shared cores: one BLAS thread

from common import (  # nexus_mlx before mlx
    add_model_argument,
    add_tag_argument,
    arg_parser,
    emit,
    median_ci,
    model_record,
    paper_reference,
    ratio_ci,
    tagged_name,
)

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

import nexus_mlx
from nexus_mlx.tools.registry import load_tools
from nexus_mlx.tools.tool import Tool
from nexus_mlx.decode.json_constraint import JsonConstraint, compile_schema, ll_tokenizer
from nexus_mlx.decode.name_fsm import mask_logits, vocab_of
from nexus_mlx.decode.restraint import DEFAULT_OPTIONAL_MARGIN, restrained
from nexus_mlx.decode.tool_call import CALL_PREFIX, CALL_SUFFIX, NAME_GLUE, SYSTEM_PROMPT, generate_tool_call, tool_call_prompt
from nexus_mlx.models.forward import forward, make_cache
from nexus_mlx.models.tokenizer import chat_text
from nexus_mlx.routing.embedder import Embedder
from nexus_mlx.routing.gate import calibrate
from nexus_mlx.tools.ir import ir_length_stats, tool_signature
from nexus_mlx.routing.lexical import BM25Index
from nexus_mlx.routing.router import DEFAULT_K, DEFAULT_LEXICAL_WEIGHT, Router
from nexus_mlx.routing.slb import SemanticLookasideBuffer
from routing_eval import (
    DEFAULT_CACHE,
    EMBEDDER_ID,
    GITHUB_QUERIES,
    GITHUB_TOOLS,
    TEXTS,
    StoredLikelihoodReranker,
    embed_cached,
    load_queries,
    log,
    schema_line,
    wilson,
)

NAME = "sidecar_accuracy"
TEXT = "words_params"
PREFIX = "query: "
QUICK_QUERIES, QUICK_BUDGET = 3, 24
CLOSING_BUDGET = 96  # generate_tool_call's default closing_budget
TARGET_SPEEDUP = paper_reference()[NAME]["values"]["speedup"]  # the paper's own speedup
TARGET_SAVING = 0.75  # ours: a little under the paper's token saving


# ---------------------------------------------------------------------------------------------
# Prompts and the first-argument decode


def full_schema_prompt(tokenizer: Any, request: str, tool: Tool) -> list[int]:
    """``tool_call_prompt`` with the tool's full JSON definition in place of its signature."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT.format(signatures=schema_line(tool))},
                {"role": "user", "content": request}]
    return list(tokenizer.encode(chat_text(tokenizer, messages) + CALL_PREFIX,
                                 add_special_tokens=False))


def first_value_done(text: str) -> bool:
    """Whether the argument object ``text`` (a prefix) holds its first complete member value."""
    depth, in_string, escaped, after_colon = 0, False, False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
                if depth == 1 and after_colon:
                    return True  # a string value closed
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth <= 1 and (after_colon or depth == 0):
                return True  # a container value closed, or the (empty) object itself
        elif ch == ":" and depth == 1:
            after_colon = True
        elif ch == "," and depth == 1 and after_colon:
            return True  # a number or literal ended
    return False


class FirstArgument:
    """Prefill a tool-call prompt into an empty cache, force the tool name, then decode under
    the tool's grammar (greedy, with the default restraint on optional members, as
    ``generate_tool_call`` does) until the first value is done.

    After ``budget`` sampled tokens it closes like ``generate_tool_call`` past its
    ``max_argument_tokens`` (``closing_token`` where that has a choice) and, like it, stops
    after ``CLOSING_BUDGET`` more; such runs are counted.
    """

    def __init__(self, model: Any, tokenizer: Any, budget: int) -> None:
        self.model, self.tokenizer, self.budget = model, tokenizer, budget
        self.vocab = vocab_of(tokenizer)
        self.ll_tok = ll_tokenizer(tokenizer)

    def __call__(self, prompt: Sequence[int], tool: Tool) -> tuple[float, str, bool]:
        """(milliseconds, argument text, whether the budget ran out) for one run."""
        start = time.perf_counter()
        cache = make_cache(self.model)
        name = self.tokenizer.encode(tool.qualified_name + NAME_GLUE, add_special_tokens=False)
        pending = [*prompt, *name]
        compiled = compile_schema(tool.input_schema, leading_space=True, after=CALL_SUFFIX)
        constraint = JsonConstraint(compiled, self.vocab, names=[tool.qualified_name],
                                    ll_tok=self.ll_tok)
        sampled = 0
        while not constraint.is_complete() and not first_value_done(constraint.text):
            if sampled >= self.budget + CLOSING_BUDGET:
                break  # generate_tool_call gives up here too (its output is "incomplete")
            forced = constraint.forced_tokens()
            if forced:
                accepted = constraint.accept_tokens(forced)
                pending += forced[:accepted]
                if accepted == len(forced):
                    continue
            closing = constraint.closing_token() if sampled >= self.budget else None
            if closing is None:
                logits = forward(self.model, pending, cache, logits="last")  # (1, 1, V)
                pending = []
                mask = mx.array(constraint.allowed_mask())
                choice = constraint.member_choice()
                token = int(mx.argmax(mask_logits(logits[:, -1, :], mask), axis=-1).item())
                if choice is not None:  # generate_tool_call's default restraint, the same rule
                    row = np.asarray(logits[0, -1].astype(mx.float32))  # (V,)
                    token = restrained(token, row, choice, DEFAULT_OPTIONAL_MARGIN)
            else:
                token = closing
            sampled += 1
            if not constraint.accept_token(token):
                raise AssertionError(f"masked decode chose a disallowed token {token}")
            pending.append(token)
        return (time.perf_counter() - start) * 1e3, constraint.text, sampled > self.budget


# ---------------------------------------------------------------------------------------------
# Argument scoring


def same_value(gold: Any, got: Any) -> bool:
    """JSON equality with numbers compared by value (``3 == 3.0``) and strings stripped."""
    if isinstance(gold, bool) or isinstance(got, bool):
        return isinstance(gold, bool) and isinstance(got, bool) and gold == got
    if isinstance(gold, int | float) and isinstance(got, int | float):
        return float(gold) == float(got)
    if isinstance(gold, str) and isinstance(got, str):
        return gold.strip() == got.strip()
    if isinstance(gold, list) and isinstance(got, list):
        return len(gold) == len(got) and all(same_value(a, b) for a, b in zip(gold, got,
                                                                            strict=True))
    if isinstance(gold, dict) and isinstance(got, dict):
        return gold.keys() == got.keys() and all(same_value(gold[k], got[k]) for k in gold)
    return bool(gold == got)


def canonical(value: Any) -> Any:
    """Lenient form: strings case-folded with spaces collapsed, numeric strings as numbers."""
    if isinstance(value, str):
        text = " ".join(value.split()).casefold()
        try:
            return float(text)
        except ValueError:
            return text
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, list):
        return [canonical(v) for v in value]
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in value.items()}
    return value


def score_arguments(gold: dict[str, Any], got: dict[str, Any]) -> tuple[int, int, int]:
    """(specified, exact matches, lenient matches) for one call."""
    exact = sum(k in got and same_value(v, got[k]) for k, v in gold.items())
    lenient = sum(k in got and canonical(v) == canonical(got[k]) for k, v in gold.items())
    return len(gold), exact, lenient


# ---------------------------------------------------------------------------------------------
# Figure


def draw_figure(result: dict[str, Any], per_query: list[dict[str, Any]], name: str,
                quick: bool) -> None:
    import plots

    fig, (ax, ax2) = plots.figure(2)
    ir = np.array([r["first_arg_ms_ir"] for r in per_query])
    full = np.array([r["first_arg_ms_full"] for r in per_query])
    ax.scatter(full, ir, s=12)
    lo, hi = min(ir.min(), full.min()) * 0.8, max(ir.max(), full.max()) * 1.2
    ax.plot([lo, hi], [lo, hi], "k:", label="equal")
    ax.plot([lo, hi], [lo / TARGET_SPEEDUP, hi / TARGET_SPEEDUP], "r--",
            label=f"{TARGET_SPEEDUP}x sooner (target)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("first argument, full-schema prompt (ms)")
    ax.set_ylabel("first argument, IR prompt (ms)")
    ax.set_title(f"speedup {result['speedup']:.2f}x, token saving {result['token_saving']:.0%}")
    ax.legend(fontsize=7)
    keys = ["routing_acc", "specified_arg_acc", "e2e_arg_acc", "json_valid"]
    values = [result[k] for k in keys]
    ax2.bar(range(len(keys)), values)
    ax2.set_xticks(range(len(keys)), ["routing", "specified args\n(routed)", "args e2e",
                                      "JSON valid"], fontsize=8)
    ax2.set_ylim(0, 1.05)
    for i, v in enumerate(values):
        ax2.annotate(f"{v:.2f}", (i, v + 0.01), ha="center", fontsize=8)
    ax2.set_title(f"{result['registry_name']}: n={result['n_queries']}")
    plots.save(fig, name, quick)


# ---------------------------------------------------------------------------------------------
# Main


def main() -> dict[str, Any]:
    parser = arg_parser("arguments over the compressed IR vs full-schema re-prefill")
    parser.add_argument("--registry", type=Path, default=GITHUB_TOOLS)
    parser.add_argument("--queries", type=Path, default=GITHUB_QUERIES)
    parser.add_argument("--n", type=int, default=0, help="first n queries (0: all)")
    parser.add_argument("--k", type=int, default=DEFAULT_K)
    parser.add_argument("--lexical-weight", type=float, default=DEFAULT_LEXICAL_WEIGHT,
                        help="the router's BM25 fusion weight (library default; 0: cosine only)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    add_tag_argument(parser)
    add_model_argument(parser)
    parser.add_argument("--max-argument-tokens", type=int, default=64,
                        help="sampled argument tokens before closing (library default 160)")
    args = parser.parse_args()
    wall = time.perf_counter()
    registry = load_tools(args.registry)
    queries, skipped = load_queries(args.queries, registry)
    queries = queries[: QUICK_QUERIES if args.quick else (args.n or None)]
    log(f"{len(registry)} tools, {len(queries)} queries")

    embedder = Embedder.load(query_prefix=PREFIX)
    tools = list(registry)
    texts = [TEXTS[TEXT](t) for t in tools]
    vectors = embed_cached(embedder, texts, "document", args.cache)
    slb = SemanticLookasideBuffer(vectors.shape[1], f"{EMBEDDER_ID}/{TEXT}",
                                  tools_digest=registry.digest())
    slb.add(registry.names(), vectors)
    lexical = BM25Index(texts) if args.lexical_weight > 0 else None
    cal = calibrate(slb, lexical=lexical, lexical_weight=args.lexical_weight, query_texts=texts)
    model, tokenizer = nexus_mlx.load(args.model)
    reranker = StoredLikelihoodReranker(model, tokenizer, store=args.cache / "ql-scores.json")
    router = Router(registry, embedder, slb, cal.gate(), reranker, k=args.k,
                    lexical_weight=args.lexical_weight, lexical=lexical)
    budget = min(args.max_argument_tokens, QUICK_BUDGET) if args.quick else \
        args.max_argument_tokens
    first_argument = FirstArgument(model, tokenizer, budget)

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    ir_stats = ir_length_stats(tools, encode)
    schema_tokens = np.array([len(encode(schema_line(t))) for t in tools])
    ir_tokens = np.array([len(encode(tool_signature(t))) for t in tools])

    per_query: list[dict[str, Any]] = []
    warm = False
    for qi, query in enumerate(queries):
        decision = router.route(query.text)
        tool = registry.get(decision.chosen)
        ir_prompt = tool_call_prompt(tokenizer, query.text, [tool])
        full_prompt = full_schema_prompt(tokenizer, query.text, tool)
        result = generate_tool_call(model, tokenizer, None, ir_prompt, [tool],
                                    max_argument_tokens=budget)
        # correctness first: the timed decode reproduces the start of the call
        _, first_text, _ = first_argument(ir_prompt, tool)
        head = CALL_PREFIX + tool.qualified_name + NAME_GLUE
        if not result.text.startswith(head + first_text):
            raise SystemExit(f"query {qi}: first-argument decode {first_text!r} is not a prefix "
                             f"of the generated call {result.text!r}")
        if not warm:
            first_argument(full_prompt, tool)
            warm = True
        arms = ("ir", "full") if qi % 2 == 0 else ("full", "ir")
        ms: dict[str, float] = {}
        budget_hit: dict[str, bool] = {}
        for arm in arms:
            ms[arm], _, budget_hit[arm] = first_argument(
                ir_prompt if arm == "ir" else full_prompt, tool)
        routed = decision.chosen == query.tool
        specified, exact, lenient = score_arguments(query.arguments, result.arguments)
        per_query.append({
            "q": qi, "gold": query.tool, "routed": decision.chosen, "routed_ok": routed,
            "escalated": decision.escalated, "arguments": result.arguments,
            "gold_arguments": query.arguments, "specified": specified, "exact": exact,
            "lenient": lenient, "valid": result.valid, "errors": list(result.errors),
            "mode": result.mode, "first_arg_text": first_text,
            "first_arg_ms_ir": ms["ir"], "first_arg_ms_full": ms["full"],
            "first_arg_budget_hit": budget_hit,
            "prompt_tokens_ir": len(ir_prompt), "prompt_tokens_full": len(full_prompt),
            "tool_tokens_ir": len(encode(tool_signature(tool))),
            "tool_tokens_full": len(encode(schema_line(tool))),
            "route_ms": {k: v * 1e3 for k, v in decision.timings.items()},
            "generate_ms": result.timings.total_s * 1e3,
        })
        log(f"q{qi} {query.tool} -> {decision.chosen} args {exact}/{specified} valid "
            f"{result.valid} first-arg ir {ms['ir']:.0f} ms full {ms['full']:.0f} ms "
            f"({len(ir_prompt)} vs {len(full_prompt)} tokens)")

    reranker.flush()
    n = len(per_query)
    routed = [r for r in per_query if r["routed_ok"]]
    spec_routed = sum(r["specified"] for r in routed)
    spec_all = sum(r["specified"] for r in per_query)
    with_args = [r for r in per_query if r["specified"]]
    ir_ms = [r["first_arg_ms_ir"] for r in per_query]
    full_ms = [r["first_arg_ms_full"] for r in per_query]
    ratios = [f / i for f, i in zip(full_ms, ir_ms, strict=True)]
    routing_ok = sum(r["routed_ok"] for r in per_query)
    tokens_ir = sum(r["prompt_tokens_ir"] for r in per_query)
    tokens_full = sum(r["prompt_tokens_full"] for r in per_query)
    speedup = ratio_ci(full_ms, ir_ms)
    tool_saving = 1.0 - (sum(r["tool_tokens_ir"] for r in per_query)
                         / sum(r["tool_tokens_full"] for r in per_query))
    ir_med, full_med = median_ci(ir_ms), median_ci(full_ms)
    payload: dict[str, Any] = {
        **model_record(args.model, model),
        "registry_name": args.registry.parent.name,
        "registry": str(args.registry), "queries": str(args.queries),
        "n_queries": n, "skipped_queries": skipped,
        "routing_acc": routing_ok / n,
        "routing_ci": wilson(routing_ok, n),
        "specified_arg_acc": sum(r["exact"] for r in routed) / max(spec_routed, 1),
        "e2e_arg_acc": sum(r["exact"] for r in routed) / max(spec_all, 1),
        "json_valid": sum(r["valid"] for r in per_query) / n,
        "ir_tokens_median": ir_stats.median,
        "ir_tokens_p99": ir_stats.p99,
        "first_arg_ms_ir": ir_med[0],
        "first_arg_ms_full": full_med[0],
        "speedup": speedup[0],
        "token_saving": tool_saving,
        "prompt_token_saving": 1.0 - tokens_ir / tokens_full,
        "details": {
            "specified_args_routed": spec_routed, "specified_args_all": spec_all,
            "specified_arg_acc_lenient": sum(r["lenient"] for r in routed) / max(spec_routed, 1),
            "e2e_arg_acc_lenient": sum(r["lenient"] for r in routed) / max(spec_all, 1),
            "specified_all_right_routed": (
                sum(r["exact"] == r["specified"] for r in routed if r["specified"])
                / max(sum(1 for r in routed if r["specified"]), 1)),
            "e2e_call_exact": (sum(r["routed_ok"] and r["exact"] == r["specified"]
                                   for r in with_args) / max(len(with_args), 1)),
            "json_valid_count": sum(r["valid"] for r in per_query),
            "first_arg_ms_ir_ci": list(ir_med[1:]), "first_arg_ms_full_ci": list(full_med[1:]),
            "speedup_ci": list(speedup[1:]),
            "speedup_median_of_ratios": float(np.median(ratios)),
            "speedup_median_of_ratios_ci": list(median_ci(ratios)[1:]),
            "prompt_token_saving_median_per_query": float(np.median(
                [1 - r["prompt_tokens_ir"] / r["prompt_tokens_full"] for r in per_query])),
            "prompt_tokens_ir_median": float(np.median([r["prompt_tokens_ir"] for r in per_query])),
            "prompt_tokens_full_median": float(np.median(
                [r["prompt_tokens_full"] for r in per_query])),
            "schema_tokens_median": float(np.median(schema_tokens)),
            "schema_token_saving_registry": float(1 - ir_tokens.sum() / schema_tokens.sum()),
            "ir_stats": {"median": ir_stats.median, "p99": ir_stats.p99, "mean": ir_stats.mean,
                         "max": ir_stats.max, "unit": ir_stats.unit},
            "escalated": sum(r["escalated"] for r in per_query) / n,
            "tau": cal.tau,
            "route_ms_median": {k: float(np.median([r["route_ms"].get(k, 0.0) for r in per_query
                                                   if k in r["route_ms"]] or [0.0]))
                                for k in ("embed", "scan", "rerank")},
            "generate_ms_median": float(np.median([r["generate_ms"] for r in per_query])),
            "first_arg_budget_hit": {arm: sum(r["first_arg_budget_hit"][arm] for r in per_query)
                                     for arm in ("ir", "full")},
        },
        "targets": {"speedup": TARGET_SPEEDUP, "token_saving": TARGET_SAVING, "json_valid": 1.0,
                    "met": {"speedup": speedup[0] >= TARGET_SPEEDUP,
                            "token_saving": tool_saving >= TARGET_SAVING}},
        "config": {"text": TEXT, "query_prefix": PREFIX, "k": args.k, "reranker": "ql",
                   "lexical_weight": args.lexical_weight,
                   "calibration": "calibrate(slb): tools as queries", "decoding": "greedy",
                   "ir": "tool_signature, default IROptions (no descriptions)",
                   "max_argument_tokens": budget,
                   "full": "system prompt with the tool's JSON (name, description, schema)",
                   "timing": "empty cache, prefill + constrained decode to first value; one "
                             "timed run per arm per query, arms alternating, one warm-up",
                   "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS")},
        "per_query": per_query,
        "seconds": time.perf_counter() - wall,
        "loadavg": list(os.getloadavg()),
    }
    name = tagged_name(NAME, args.tag)
    payload["targets"]["met"]["json_valid"] = payload["json_valid"] == 1.0
    draw_figure(payload, per_query, name, args.quick)
    return emit(name, payload, args.quick)


if __name__ == "__main__":
    main()
