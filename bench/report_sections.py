"""One renderer per benchmark section of the report, and the papers' own numbers.

Contract: each ``_name(d)`` turns one result JSON (the contract in ``bench/<name>.py``) into
markdown lines of measured values next to the papers' values, which come from their one copy,
``bench/paper_reference.json`` (read once at import through ``common.paper_reference``;
:data:`PAPER` holds each section's citation line). Missing keys render as ``n/a``; renderers
never raise on partial JSON. It reads no result files and does not order sections (:mod:`report`
does).
"""

from __future__ import annotations

from typing import Any

from common import paper_reference
from report_format import (
    NA,
    as_float,
    cell,
    fmt,
    fmt_ci,
    fmt_pct,
    get,
    mapping,
    number,
    order_key,
    records,
    scalar_rows,
    sort_by,
    sorted_keys,
    table,
)

# The papers' numbers, from their one copy (bench/paper_reference.json): the citation line of
# each benchmark's section, and the values its "paper" cells show.
REFERENCE = paper_reference()
PAPER: dict[str, str] = {name: entry["summary"] for name, entry in REFERENCE.items()}


def _paper(name: str) -> dict[str, Any]:
    """The paper values of benchmark ``name`` (``values`` in ``bench/paper_reference.json``)."""
    values: dict[str, Any] = REFERENCE[name]["values"]
    return values


def _num(value: Any, spec: str) -> str:
    """A paper value in a fixed format (``g``: as written, ``19`` not ``19.0``)."""
    return format(float(value), spec)


def _span(values: Any, spec: str) -> str:
    """A paper range ``[lo, hi]`` as ``lo-hi``."""
    lo, hi = values
    return f"{_num(lo, spec)}-{_num(hi, spec)}"


# ---- sections: paper 1 --------------------------------------------------------------------------
def _oracle(value: Any) -> str:
    """The concatenate-all cell: ``overflow``, ``k/n right``, or n/a."""
    if isinstance(value, dict) and number(value.get("n")):
        n = int(value["n"])
        right = round((number(value.get("accuracy")) or 0.0) * n)
        return f"{right}/{n} right ({fmt(value.get('prompt_tokens_median'), '.0f')} tokens)"
    return fmt(value)


def routing_section(d: dict[str, Any]) -> list[str]:
    ref = _paper("routing_accuracy")
    rows = []
    for c in sort_by(records(d.get("cells")), "N"):
        n = number(c.get("N"))
        overflows = n is not None and n >= ref["concat_all_overflows_from_tools"]
        paper = (_num(ref["accuracy"], "g") if n == ref["tools"]
                 else "concat-all overflows" if overflows else "")
        rows.append([fmt(c.get("N")), fmt(c.get("accuracy")), fmt_ci(c.get("ci")),
                     fmt(c.get("top1_recall")), fmt(c.get("top3_recall")),
                     fmt(c.get("fire_rate")), _oracle(c.get("oracle")), paper])
    return table(["N tools", "accuracy", "95% CI", "top-1 recall", "top-3 recall", "fire rate",
                  "oracle", "paper"], rows)


def fusion_section(d: dict[str, Any]) -> list[str]:
    chosen = mapping(d, "chosen")
    slb = mapping(d, "slb_only")
    head = [f"Held-out Seal-Tools dev-difficult queries (n = {fmt(d.get('n_queries'))}, any gold "
            f"call counts), whole 4,076-tool pool; gate tau {fmt(d.get('tau'), '.4f')}, "
            f"{fmt(d.get('n_escalated'))} escalated. Chosen: k = {fmt(chosen.get('k'))}, "
            f"retrieval weight {fmt(chosen.get('weight'), 'g')}. SLB top-1 alone: "
            f"{fmt(slb.get('accuracy_escalated'))} on escalated queries, "
            f"{fmt(slb.get('accuracy_all'))} on all.", ""]
    rows = [[fmt(c.get("k")), fmt(c.get("weight"), "g"), fmt(c.get("accuracy_escalated")),
             fmt_ci(c.get("ci_escalated")), fmt(c.get("accuracy_all")),
             fmt(c.get("accuracy_end_to_end"))]
            for c in sort_by(records(d.get("grid")), "k", "weight")]
    return head + table(["k", "retrieval weight", "escalated accuracy", "95% CI",
                         "all reranked", "end to end (gate)"], rows)


def gating_section(d: dict[str, Any]) -> list[str]:
    lines = table(["metric", "measured", "paper"],
                  [["mean Spearman (proxy vs true drift)", fmt(d.get("mean_spearman")),
                    _num(_paper("gating_nogo")["spearman"], "g")]])
    rows = [[fmt(r.get("n_past")), fmt(r.get("context")), fmt(r.get("spearman")),
             fmt_ci(r.get("spearman_ci")), fmt(r.get("depth_spearman")), fmt(r.get("heads")),
             fmt(r.get("drift_median"), ".4f"), fmt(r.get("drift_max"), ".4f")]
            for r in sort_by(records(d.get("rows")), "n_past", "context")]
    return lines + table(["n_past", "context", "Spearman", "95% CI", "depth Spearman", "heads",
                          "drift median", "drift max"], rows)


def _ttft_paper(k: Any, n_past: Any) -> str:
    ref = _paper("deep_splice_ttft")
    k, n = number(k), number(n_past)
    if k == 4 and n is not None:
        k4 = ref["K=4"]
        if n >= 1024:
            return _span(k4[">=1024"], ".2f")
        return _num(k4[str(int(n))], ".2f") if str(int(n)) in k4 else ""
    if k == 16 and n is not None:  # the flat curve's best speedup is at the shallowest depth
        flat = ref["K=16"]["range"]
        return _num(flat[1], ".2f") if n == 256 else f"{_span(flat, '.2f')} (range)"
    return ""


def _curve(c: dict[str, Any]) -> str:
    """The recompute curve of a TTFT cell: ``4`` / ``16`` for R(n)'s K, else its name (``sur``)."""
    k = number(c.get("K"))
    if k is not None:
        return fmt(int(k)) if k == int(k) else fmt(k, "g")
    return fmt(c.get("curve"))


def ttft_section(d: dict[str, Any]) -> list[str]:
    rows = [[fmt(c.get("n_past")), _curve(c), fmt(c.get("R_pct"), ".1f"),
             fmt(c.get("recomputed")), fmt(c.get("path")), fmt(c.get("prefill_ms"), ".1f"),
             fmt(c.get("splice_ms"), ".1f"), fmt(c.get("speedup"), ".2f"),
             fmt_ci(c.get("speedup_ci"), ".2f"), fmt(c.get("limit_speedup"), ".2f"),
             fmt(c.get("top1_ok")), fmt(c.get("kl"), ".3g"),
             _ttft_paper(c.get("K"), c.get("n_past"))]
            for c in sort_by(records(d.get("cells")), "K", "n_past")]
    head = [f"Block: {fmt(d.get('tool'))}, {fmt(d.get('block_tokens'))} tokens; query "
            f"{fmt(d.get('query_tokens'))} tokens; {fmt(d.get('trials'))} trials. Limit: prefill "
            "over the request alone with the schema's exact KV in place, the speedup no splice "
            "can beat (measured in the same run; empty in runs before it was).", ""]
    return head + table(["n_past", "curve (K)", "R %", "recomputed", "path", "prefill ms", "splice ms",
                         "speedup", "95% CI", "limit", "top-1 ok", "KL (nats)", "paper speedup"],
                        rows)


SIDECAR_METRICS = (  # (result key, label, format, paper value key or "")
    ("routing_acc", "routing accuracy", ".3f", ""),
    ("specified_arg_acc", "specified-argument accuracy", ".3f", ""),
    ("e2e_arg_acc", "end-to-end argument accuracy", ".3f", ""),
    ("json_valid", "valid JSON", ".3f", ""),
    ("ir_tokens_median", "IR tokens, median", ".1f", "ir_tokens_median"),
    ("ir_tokens_p99", "IR tokens, p99", ".1f", "ir_tokens_p99"),
    ("first_arg_ms_ir", "first argument, IR (ms)", ".1f", ""),
    ("first_arg_ms_full", "first argument, full schema (ms)", ".1f", ""),
    ("speedup", "first-argument speedup", ".2f", "speedup"),
)


def sidecar_section(d: dict[str, Any]) -> list[str]:
    ref = _paper("sidecar_accuracy")
    rows = [[label, fmt(d.get(key), spec), _num(ref[paper], "g") if paper else ""]
            for key, label, spec, paper in SIDECAR_METRICS]
    rows.append(["token saving (tool text: IR vs JSON definition)",
                 fmt_pct(d.get("token_saving")), f"~{float(ref['token_saving']):.0%}"])
    if "prompt_token_saving" in d:
        rows.append(["token saving (whole prompt)", fmt_pct(d.get("prompt_token_saving")), ""])
    return table(["metric", "measured", "paper"], rows)


def dkl_section(d: dict[str, Any]) -> list[str]:
    ref = _paper("dkl_sweep")
    paper = f"{_span(ref['kl_range'], 'g')}, top-1 {_num(ref['top1'], '.1f')}"
    rows = [[fmt(r.get("offset")), fmt(r.get("path")), fmt(r.get("kl_median"), ".4f"),
             fmt_ci(r.get("kl_ci"), ".4f"), fmt(r.get("kl_max"), ".4f"), fmt(r.get("top1")),
             paper]
            for r in sort_by(records(d.get("rows")), "offset")]
    kls = [x for r in records(d.get("rows")) if (x := number(r.get("kl_median"))) is not None
           and number(r.get("offset")) != 0]
    span = f"{min(kls):.4f}-{max(kls):.4f}" if kls else NA
    head = [f"Metric: {fmt(d.get('metric'))}. Median KL over offsets > 0: {span} nats "
            f"(paper: {_span(ref['kl_range'], 'g')}).", ""]
    return head + table(["offset", "path", "KL median", "95% CI", "KL max", "top-1",
                         "paper (KL nats, top-1)"], rows)


def calibration_section(d: dict[str, Any]) -> list[str]:
    rows = []
    for reg in records(d.get("registries")):
        sample = reg.get("fixed_sample")
        one: dict[str, Any] = sample if isinstance(sample, dict) else reg
        for source in ("tools", "heldout"):
            c = mapping(one, source)
            if c:
                rows.append([fmt(reg.get("registry")), fmt(one.get("n_tools")), source,
                             fmt(c.get("tau"), ".4f"), fmt(c.get("n_adversarial")),
                             fmt(c.get("fire_rate_calibration")), fmt(c.get("fire_rate_test")),
                             fmt(c.get("errors_escalated"))])
    if not rows:  # an older layout: its scalar fields
        return table(["field", "measured"], scalar_rows(d))
    fire = float(_paper("calibration")["fire_rate"])
    head = [f"tau = 20th percentile of adversarial margins (paper: ~{fire:.0%} fire rate). `tools`: "
            "the registry's own tool texts stand in for queries (the library default); "
            "`heldout`: unlabeled held-out queries.", ""]
    return head + table(["registry", "tools", "calibrated on", "tau", "adversarial",
                         "fire rate (calibration)", "fire rate (test)",
                         "SLB errors escalated"], rows)


def curve_section(d: dict[str, Any]) -> list[str]:
    """``curve_calibration``: the recompute each depth needs, the fitted curve, held-out check."""
    paper = {r.get("n_past"): r for r in records(d.get("paper_curve_heldout"))}
    rows = []
    for r in sort_by(records(d.get("depths")), "n_past"):
        held, ref = mapping(r, "heldout"), paper.get(r.get("n_past"), {})
        rows.append([fmt(r.get("n_past")), fmt(r.get("need"), "g"), fmt(held.get("percent"), ".1f"),
                     fmt(held.get("kl_median"), ".4f"), fmt(held.get("top1"), ".2f"),
                     fmt(ref.get("percent"), ".1f"), fmt(ref.get("kl_median"), ".4f"),
                     fmt(ref.get("top1"), ".2f")])
    c = mapping(d, "curve")
    head = [f"Blocks compiled after: {fmt(d.get('block_context'))}; pass: top-1 on every "
            f"calibration tool and KL median <= {fmt(d.get('kl_limit'), 'g')} nats. Fitted curve: M = {fmt(c.get('M'))}, "
            f"R_base = {fmt(c.get('R_base'), 'g')}, K = {fmt(c.get('K'), 'g')}.", ""]
    return head + table(["n_past", "need %", "fitted %", "held-out KL", "held-out top-1",
                         "paper curve %", "its KL", "its top-1"], rows)


# ---- sections: paper 2 --------------------------------------------------------------------------
def allocators_section(d: dict[str, Any]) -> list[str]:
    allocs = mapping(d, "allocators")
    return sorted(allocs, key=lambda a: (a != "sur", a))


def niah_section(d: dict[str, Any]) -> list[str]:
    lengths = get(d, "spec", "lengths")
    lines = [f"{fmt(d.get('n_cases'))} cases, context lengths "
             f"{', '.join(fmt(x) for x in lengths) if isinstance(lengths, list) else NA} tokens.",
             ""]
    refs = mapping(d, "references")
    lines += ["References (operators without a budget):", ""]
    lines += table(["operator", "EM", "95% CI", "KL (nats)", "agree", "K/V dev"],
                   [[cell(name), fmt(get(refs, name, "em")), fmt_ci(get(refs, name, "em_ci")),
                     fmt(get(refs, name, "kl"), ".3g"), fmt(get(refs, name, "agree")),
                     fmt(get(refs, name, "kv_dev"), ".3g")] for name in sorted(refs)])
    allocs = allocators_section(d)
    budgets = sorted({b for a in allocs for b in sorted_keys(get(d, "allocators", a))}, key=order_key)
    pivot = [[cell(a)] + [fmt(get(d, "allocators", a, b, "em")) for b in budgets] for a in allocs]
    if budgets:
        ref = _paper("repair_niah")
        pivot.append(["paper (SUR)"] + [_span(ref["em_range"], ".3f")
                                        if as_float(b) == ref["budget_pct"] else ""
                                        for b in budgets])
    lines += ["Exact match by allocator and budget (% of the suffix):", ""]
    lines += table(["allocator"] + [f"{b}%" for b in budgets], pivot if allocs else [])
    detail = [[cell(a), f"{b}%", fmt(get(d, "allocators", a, b, "em")),
               fmt_ci(get(d, "allocators", a, b, "em_ci")),
               fmt(get(d, "allocators", a, b, "kl"), ".3g"),
               fmt(get(d, "allocators", a, b, "agree")),
               fmt(get(d, "allocators", a, b, "kv_dev"), ".3g"),
               fmt(get(d, "allocators", a, b, "repair_s"), ".3f")]
              for a in allocs for b in sorted_keys(get(d, "allocators", a))]
    lines += ["All metrics:", ""]
    lines += table(["allocator", "budget", "EM", "95% CI", "KL (nats)", "agree", "K/V dev",
                    "repair s"], detail)
    missing = d.get("missing")
    if isinstance(missing, list) and missing:
        lines += [f"Allocators not in the registry: {', '.join(sorted(map(str, missing)))}.", ""]
    return lines


def _qa_paper(method: Any, budget: Any) -> str:
    ref = _paper("repair_qa")
    if method == ref["method"] and number(budget) == ref["budget_pct"]:
        return f"EM ~ re-prefill, {_span(ref['speedup_range'], '.2f')}x"
    return ""


def qa_section(d: dict[str, Any]) -> list[str]:
    rows = sorted(records(d.get("rows")),
                  key=lambda r: (r.get("budget") is None, str(r.get("method")),
                                 order_key(r.get("budget"))))
    body = [[fmt(r.get("method")), fmt(r.get("budget")), fmt(r.get("em")), fmt_ci(r.get("em_ci")),
             fmt(r.get("agree")), fmt(r.get("latency_s"), ".3f"),
             fmt(r.get("speedup_vs_reprefill"), ".2f"), fmt_ci(r.get("speedup_ci"), ".2f"),
             _qa_paper(r.get("method"), r.get("budget"))] for r in rows]
    head = [f"{fmt(d.get('n_cases'))} cases per file; mean context "
            f"{fmt(d.get('mean_context_tokens'), '.0f')} tokens.", ""]
    return head + table(["method", "budget %", "EM", "95% CI", "agree with re-prefill",
                         "latency s", "speedup vs re-prefill", "95% CI", "paper"], body)


def packed_section(d: dict[str, Any]) -> list[str]:
    ref = _paper("packed_refresh")
    paper = f"up to {_num(ref['max_speedup'], 'g')}"
    rows = [[fmt(c.get("N")), fmt(c.get("R")), fmt(c.get("sequential_ms"), ".1f"),
             fmt(c.get("packed_ms"), ".1f"), fmt(c.get("floor_ms"), ".1f"),
             fmt(c.get("packed_over_floor"), ".2f"), fmt(c.get("speedup"), ".2f"),
             fmt_ci(c.get("speedup_ci"), ".2f"), fmt(c.get("ideal_speedup"), ".2f"),
             fmt(c.get("max_abs_diff"), ".2g"), fmt(c.get("packed_unfused_ms"), ".1f"),
             fmt(c.get("blocked_speedup"), ".2f"), fmt_ci(c.get("blocked_speedup_ci"), ".2f"),
             paper if number(c.get("R")) == ref["intervals"] else ""]
            for c in sort_by(records(d.get("cells")), "N", "R")]
    head = [f"B = {fmt(d.get('B'))} refreshed positions; context: {fmt(d.get('context'))}. "
            "Floor: the packed pass's FLOPs over the fp32 GEMM rate measured beside each cell; "
            "ideal speedup: the same count with one weight traversal per call. Unfused: the "
            "packed pass with the blocked attention kernel off (n/a: runs before it existed).", ""]
    return head + table(["N", "R intervals", "sequential ms", "packed ms", "floor ms",
                         "packed / floor", "speedup", "95% CI", "ideal speedup",
                         "max abs diff", "unfused ms", "blocked speedup", "95% CI",
                         "paper speedup"], rows)


# ---- sections: engineering ----------------------------------------------------------------------
def blas_section(d: dict[str, Any]) -> list[str]:
    rows = [["MLX fp32 matmul (ms)", fmt(d.get("mlx_fp32_ms"), ".1f"),
             fmt_ci(d.get("mlx_fp32_ci"), ".1f")],
            ["numpy fp32 matmul (ms)", fmt(d.get("numpy_fp32_ms"), ".1f"),
             fmt_ci(d.get("numpy_fp32_ci"), ".1f")],
            ["ratio MLX / numpy", fmt(d.get("ratio"), ".2f"), fmt_ci(d.get("ratio_ci"), ".2f")],
            ["target ratio", fmt(d.get("target_ratio"), ".2f"), ""],
            ["matrix size n", fmt(d.get("n")), ""],
            ["BLAS loaded", fmt(d.get("blas_loaded")), ""]]
    return table(["metric", "measured", "95% CI"], rows)


def engine_section(d: dict[str, Any]) -> list[str]:
    decodes = records(d.get("decode")) or ([mapping(d, "decode")] if mapping(d, "decode") else [])
    headed = any(dec.get("full_head_ratio") is not None for dec in decodes)  # newer runs
    extra = 2 if headed else 0
    rows = [["prefill", fmt(r.get("tokens")), fmt(r.get("nexus_tok_s"), ".1f"),
             fmt(r.get("mlx_lm_tok_s"), ".1f"), fmt(r.get("ratio"), ".2f"),
             fmt_ci(r.get("ratio_ci"), ".2f"), *[""] * extra]
            for r in sort_by(records(d.get("prefill")), "tokens")]
    for dec in decodes:  # one row per context (older results: one mapping)
        context = f" after {fmt(dec.get('context'))}" if dec.get("context") is not None else ""
        row = [f"decode{context}", fmt(dec.get("tokens")), fmt(dec.get("nexus_tok_s"), ".1f"),
               fmt(dec.get("mlx_lm_tok_s"), ".1f"), fmt(dec.get("ratio"), ".2f"),
               fmt_ci(dec.get("ratio_ci"), ".2f")]
        if headed:
            row += [fmt(dec.get("full_head_ratio"), ".2f"), fmt(dec.get("certified_share"), ".2f")]
        rows.append(row)
    head = [f"Max logit difference vs mlx-lm: {fmt(d.get('max_logit_diff'), '.3g')}; greedy "
            f"decodes identical: {fmt(d.get('greedy_identical'))}."
            + (" Decode: our greedy loop with the certified head (full head ratio: the same "
               "loop with the full projection against mlx-lm; certified: the share of steps "
               "the head certified)." if headed else ""), ""]
    columns = ["phase", "tokens", "nexus tok/s", "mlx-lm tok/s", "ratio", "95% CI"]
    return head + table(columns + (["full head ratio", "certified"] if headed else []), rows)


def slb_section(d: dict[str, Any]) -> list[str]:
    lat = mapping(d, "latency_us")
    sizes = sorted_keys(lat)
    methods = sorted({m for s in sizes for m in sorted_keys(lat.get(s))},
                     key=lambda m: (m != "slb_scan", m))
    rows = [[cell(m)] + [fmt(get(lat, s, m, "median_us"), ".2f") for s in sizes] for m in methods]
    if sizes:
        ref = _paper("slb_latency")
        paper = f"{_num(ref['scan_us_cpp'], 'g')} / {_num(ref['scan_us_in_situ'], 'g')}"
        rows.append(["paper (C++ / in situ)"] + [paper if s == str(ref["tools"]) else ""
                                                 for s in sizes])
    lines = ["Median scan latency (us), top-" + fmt(d.get("k")) + ", dim " + fmt(d.get("dim")), ""]
    lines += table(["method"] + [f"N = {s}" for s in sizes], rows if methods else [])
    rec = mapping(d, "recall")
    fields = ("random_recall_at_1", "random_recall_at_5", "near_recall_at_1", "near_recall_at_5")
    lines += ["INT8 recall against the fp32 scan:", ""]
    lines += table(["N", "queries", *fields],
                   [[cell(s), fmt(get(rec, s, "queries"))] + [fmt(get(rec, s, f)) for f in fields]
                    for s in sorted_keys(rec)])
    return lines


def l0_section(d: dict[str, Any]) -> list[str]:
    corr = mapping(d, "correctness")
    lines = [f"{fmt(d.get('slots'))} slots x {fmt(d.get('slot_tokens'))} tokens; bit-identical "
             f"to a chunked prefill: {fmt(corr.get('bit_identical_to_chunked_prefill'))}.", ""]
    work = mapping(d, "workloads")
    lines += table(["workload", "checkouts", "hit rate", "token hit rate", "checkout ms p50",
                    "commit ms p50", "lookup us p50", "evictions"],
                   [[cell(w), fmt(get(work, w, "checkouts")), fmt(get(work, w, "hit_rate")),
                     fmt(get(work, w, "token_hit_rate")),
                     fmt(get(work, w, "checkout_hit_ms_p50"), ".2f"),
                     fmt(get(work, w, "commit_ms_p50"), ".2f"),
                     fmt(get(work, w, "lookup_us_p50"), ".1f"), fmt(get(work, w, "evictions"))]
                    for w in sorted_keys(work)])
    copies = sort_by(records(d.get("copy_vs_prefill")), "prefix_tokens")
    lines += table(["prefix tokens", "copied MB", "checkout ms", "checkout into ms",
                    "cold prefill ms", "prefill / checkout into"],
                   [[fmt(c.get("prefix_tokens")),
                     fmt(b / 1e6 if (b := number(c.get("copied_bytes"))) is not None else None,
                         ".1f"),
                     fmt(c.get("checkout_ms"), ".2f"), fmt(c.get("checkout_into_ms"), ".2f"),
                     fmt(c.get("cold_prefill_ms"), ".1f"),
                     fmt(c.get("prefill_over_checkout_into"), ".1f")] for c in copies])
    return lines


def embedder_section(d: dict[str, Any]) -> list[str]:
    sizes = mapping(d, "batch_sizes")
    head = [f"{fmt(d.get('n_texts'))} texts ({fmt(d.get('text'))}), mean "
            f"{fmt(get(d, 'tokens', 'mean'), '.1f')} tokens; batch-size invariance max |diff| "
            f"{fmt(d.get('batch_size_max_abs_diff'), '.2g')}.", ""]
    return head + table(["batch size", "texts/s", "95% CI", "tokens/s", "ms per call"],
                        [[cell(b), fmt(get(sizes, b, "texts_per_s"), ".1f"),
                          fmt_ci(get(sizes, b, "texts_per_s_ci"), ".1f"),
                          fmt(get(sizes, b, "tokens_per_s"), ".1f"),
                          fmt(get(sizes, b, "ms_per_call"), ".1f")] for b in sorted_keys(sizes)])


def masks_section(d: dict[str, Any]) -> list[str]:
    us = mapping(d, "us")
    head = [f"Vocabulary {fmt(d.get('vocab'))}; {fmt(d.get('names'))} tool names; "
            f"{fmt(d.get('schemas'))} schemas.", ""]
    rows = []
    for step in sorted(us):
        vals = us[step] if isinstance(us[step], list) else []  # [median, lo, hi]
        rows.append([cell(step), fmt(get(vals, 0), ".2f"), fmt_ci(vals[1:3], ".2f"),
                     fmt(get(d, "steps", step))])
    return head + table(["step", "median us", "95% CI", "steps timed"], rows)


def _micro_us(bench: dict[str, Any], stat: str) -> str:
    seconds = number(get(bench, "stats", stat))
    return fmt(None if seconds is None else seconds * 1e6, ".2f")


def _per_step_us(bench: dict[str, Any]) -> str:
    """Median per step when the benchmark records ``extra_info.steps`` (mask walks)."""
    seconds = number(get(bench, "stats", "median"))
    steps = number(get(bench, "extra_info", "steps"))
    return fmt(seconds * 1e6 / steps, ".2f") if seconds is not None and steps else ""


def micro_section(d: dict[str, Any]) -> list[str]:
    rows = [[fmt(b.get("name")), _micro_us(b, "median"), _micro_us(b, "iqr"), _micro_us(b, "min"),
             fmt(get(b, "stats", "rounds")), _per_step_us(b)]
            for b in sort_by(records(d.get("benchmarks")), "fullname", "name")]
    return table(["benchmark", "median us", "IQR us", "min us", "rounds", "median us per step"],
                 rows)


def certified_head_section(d: dict[str, Any]) -> list[str]:
    views = (("head", "one head step", "ms"), ("generate", "generate_tokens", "ms_per_token"),
             ("session", "Session.generate", "ms_per_token"),
             ("tool_call", "generate_tool_call", "ms_per_token"))
    rows = [[label, fmt(get(d, view, f"certified_{unit}"), ".1f"),
             fmt(get(d, view, f"full_{unit}"), ".1f"), fmt(get(d, view, "ratio"), ".2f"),
             fmt_ci(get(d, view, "ratio_ci"), ".2f"), fmt(get(d, view, "certified_share"), ".2f")]
            for view, label, unit in views if mapping(d, view)]
    head = [f"Head {fmt(d.get('vocab'))} x {fmt(d.get('hidden'))}, {fmt(d.get('candidates'))} "
            f"candidates; BLAS threads {fmt(d.get('openblas_threads'))}; ms per step (head) or "
            "per decoded token; ratio: full projection / certified head (paired trials).", ""]
    return head + table(["view", "certified ms", "full ms", "ratio", "95% CI", "certified"], rows)


def skinny_section(d: dict[str, Any]) -> list[str]:
    """``skinny_gemm``: few-row products and short forwards, skinny kernel vs OpenBLAS."""
    gemm = [[fmt(r.get("shape")), fmt(r.get("rows")), fmt(r.get("skinny_ms"), ".2f"),
             fmt(r.get("openblas_ms"), ".2f"), f"{fmt(r.get('ratio'), '.2f')} "
             f"{fmt_ci(r.get('ratio_ci'), '.2f')}"] for r in records(d.get("gemm"))]
    fwd = [[fmt(r.get("tokens")), fmt(r.get("skinny_ms"), ".1f"), fmt(r.get("openblas_ms"), ".1f"),
            f"{fmt(r.get('ratio'), '.2f')} {fmt_ci(r.get('ratio_ci'), '.2f')}"]
           for r in records(d.get("forward"))]
    return (["Products `x @ W.T` (ratio: OpenBLAS / skinny; past 4 rows both arms run OpenBLAS):",
             ""] + table(["weights", "rows", "skinny ms", "OpenBLAS ms", "ratio [95% CI]"], gemm)
            + ["", "Forward passes appended at depth 512, logits of every token:", ""]
            + table(["tokens", "skinny ms", "OpenBLAS ms", "ratio [95% CI]"], fwd))


def weight_twins_section(d: dict[str, Any]) -> list[str]:
    """``weight_twins``: decode reading one-byte weight twins vs the float32 weights."""
    arms = (("engine", "generate_tokens, ms/token"), ("session", "Session.complete, ms/token"),
            ("forward4", "4-token forward, ms/pass"))
    rows = []
    for spec, m in mapping(d, "models").items():
        twins = mapping(m, "twins")
        for arm, label in arms:
            rows.append([fmt(spec), label, fmt(get(m, arm, "twins_ms"), ".1f"),
                         fmt(get(m, arm, "float32_ms"), ".1f"),
                         f"{fmt(get(m, arm, 'ratio'), '.2f')} "
                         f"{fmt_ci(get(m, arm, 'ratio_ci'), '.2f')}",
                         fmt(get(m, arm, "same_ids")),
                         f"{fmt(twins.get('twin_mib'), '.0f')} / "
                         f"{fmt(twins.get('float32_mib'), '.0f')}"])
    return ([f"{fmt(d.get('trials'))} paired trials per arm, {fmt(d.get('tokens'))} tokens "
             "decoded; ratio: float32 / twins (> 1: twins faster); the ids of every trial "
             "compared with twins on and off.", ""]
            + table(["model", "arm", "twins ms", "float32 ms", "ratio [95% CI]", "same ids",
                     "twin / float32 MiB"], rows))
