"""Multi-hop QA after deleting an inserted passage: allocators at 2% / 5% vs Dirty/Shift/Replay/Re-prefill.

Cases come from ``tasks.multihop`` (HotpotQA and MuSiQue, 50 each by default): the passages and
the question in one cached user message, with one inserted passage (by default a *conflict*: a
supporting passage with its answer swapped for another item's) before, between or after the
supporting evidence; the passage is deleted and the question answered (greedy, up to 16 tokens,
first line). Per method: normalized EM against the gold answers, agreement with Re-prefill's
normalized answer, and the mean post-edit latency (selection + shift + refresh + answer;
Re-prefill: prefill of p + s + answer), each timed from the dirty cache, methods interleaved in
a rotating order per case. Dirty (answering with the passage still there) shows how often the
deletion matters (``dirty_gives_substitute``: it answered the planted substitute).
CIs: paired bootstrap over questions (the same resampled questions for every method), for EM,
agreement, latency, the EM difference to Re-prefill, the speedup over Re-prefill and the
agreement difference to Shift (``agree_diff_vs_shift``: does a repair beat doing nothing?).
JSON: {"model", "model_info", "spec", "rows": [{"method", "budget", "em", "agree", "latency_s",
"agree_diff_vs_shift", ...CIs}], "sur_vs_shift", "answers", "n_cases", ...}; ``sur_vs_shift`` is
SUR at 5% (the paper's budget) against Shift: both agreements, the difference and its CI.
Options: --model M (default qwen2.5-coder-0.5b), --data PATH (repeatable; default both shared
files), --cases N (per file), --methods a,b, --budgets 2,5, --deleted conflict|distractor,
--question-in-query, --out NAME (results file name). PNG: results/<out>.png.
"""

from __future__ import annotations

from common import arg_parser, emit, shared_data  # first: loads nexus_mlx + fast BLAS

import time
from pathlib import Path

import numpy as np

from nexus_mlx import load
from nexus_mlx.decode.generate import greedy_continuation
from nexus_mlx.refresh import dirty, repair, replay, shift
from nexus_mlx.refresh.allocators import ALLOCATORS, _load_builtin
from tasks.multihop import QASpec, build_cases, exact_match, load_items, normalize_answer, prediction_text
from repair_metrics import model_info, model_label, prefill

DATA = shared_data("multihop")
DEFAULT_FILES = (DATA / "hotpotqa_dev50.json", DATA / "musique_dev50.json")
ALLOCATOR_NAMES = ("sur", "bm25_units", "cacheblend", "infoflow", "prophetkv")
BUDGETS = (2, 5)
MAX_ANSWER = 16
N_BOOT = 2000
DEFAULT_MODEL = "qwen2.5-coder-0.5b"
HEADLINE = ("sur", 5.0)  # the paper's method and budget, compared with Shift


def run_method(model, tokenizer, case, cache, method: str, budget: float | None, stop):
    """(answer text, seconds) for one method from the dirty ``cache`` (left unchanged)."""
    edit = case.edit
    question = tokenizer.encode(case.question, add_special_tokens=False)
    start = time.perf_counter()
    if method == "reprefill":
        repaired = prefill(model, np.concatenate([case.tokens[: edit.p0], case.tokens[edit.p1 :]]))
    elif method == "shift":
        repaired = shift(cache, edit)
        repaired.evaluate()
    elif method == "dirty":
        repaired = dirty(cache, edit)
    elif method == "replay":
        repaired = replay(model, cache, edit)
    else:
        repaired = repair(model, cache, edit, question, budget, method, tokenizer=tokenizer).cache
    tokens = greedy_continuation(model, case.query, repaired, MAX_ANSWER, stop)  # not reused
    seconds = time.perf_counter() - start
    return tokenizer.decode(tokens), seconds


def paired_bootstrap(table: dict[str, dict[str, np.ndarray]], ref: str, base: str | None = None,
                     seed: int = 0):
    """95% intervals for every method's mean EM, agreement, latency, EM - EM_ref, speedup over
    ``ref`` and (with ``base``) agreement - agreement_base, all on the same resampled questions."""
    n = len(next(iter(table.values()))["em"])
    idx = np.random.default_rng(seed).integers(0, n, size=(N_BOOT, n))
    ref_lat = table[ref]["latency"][idx].mean(axis=1)
    ref_em = table[ref]["em"][idx].mean(axis=1)
    base_agree = table[base]["agree"][idx].mean(axis=1) if base else None
    out = {}
    for name, cols in table.items():
        em = cols["em"][idx].mean(axis=1)
        lat = cols["latency"][idx].mean(axis=1)
        agree = cols["agree"][idx].mean(axis=1)
        q = lambda a: [float(np.quantile(a, 0.025)), float(np.quantile(a, 0.975))]  # noqa: E731
        out[name] = {"em_ci": q(em), "agree_ci": q(agree),
                     "latency_s_ci": q(lat), "em_diff_ci": q(em - ref_em),
                     "speedup_ci": q(ref_lat / lat)}
        if base_agree is not None:
            out[name]["agree_diff_vs_shift_ci"] = q(agree - base_agree)
    return out


def plot(rows: list[dict[str, object]], name: str, quick: bool):
    """EM / agreement and latency per method; None when matplotlib is missing."""
    try:
        from plots import error_bars, figure, save
    except ImportError:
        return None
    labels = [r["method"] + (f" {r['budget']:g}%" if r["budget"] is not None else "") for r in rows]
    x = np.arange(len(rows))
    fig, axes = figure(2, width=6.5, height=4.5)
    for offset, key, label in ((-0.2, "em", "EM"), (0.2, "agree", "agreement with re-prefill")):
        vals = [r[key] for r in rows]
        axes[0].bar(x + offset, vals, width=0.4, capsize=2, label=label,
                    yerr=error_bars(vals, [r[f"{key}_ci"] for r in rows]))
    axes[0].set(ylabel="fraction", title="multi-hop QA after deleting a passage", ylim=(0, 1.05))
    axes[0].legend(fontsize=8)
    lat = [r["latency_s"] for r in rows]
    axes[1].bar(x, lat, yerr=error_bars(lat, [r["latency_s_ci"] for r in rows]), capsize=2,
                color="tab:gray")
    axes[1].set(ylabel="seconds (mean)", title="post-edit latency (repair + answer)")
    for ax in axes:
        ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    return save(fig, name, quick)


def main() -> None:
    parser = arg_parser(__doc__.splitlines()[0])
    parser.add_argument("--data", action="append", default=None, help="HotpotQA/MuSiQue JSON")
    parser.add_argument("--cases", type=int, default=None, help="questions per file")
    parser.add_argument("--methods", default=None, help="allocators (default the five)")
    parser.add_argument("--budgets", default=None)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--deleted", default=QASpec.deleted, choices=("conflict", "distractor"))
    parser.add_argument("--out", default="repair_qa", help="results file name")
    parser.add_argument("--question-in-query", action="store_true",
                        help="ask the question after the repair instead of caching it")
    args = parser.parse_args()
    files = [Path(p) for p in args.data] if args.data else list(DEFAULT_FILES[:1] if args.quick
                                                                  else DEFAULT_FILES)
    per_file = args.cases if args.cases is not None else (1 if args.quick else 50)
    budgets = ([float(b) for b in args.budgets.split(",")] if args.budgets
               else [5.0] if args.quick else list(BUDGETS))
    wanted = args.methods.split(",") if args.methods else list(ALLOCATOR_NAMES)
    _load_builtin()
    allocators = [a for a in wanted if a in ALLOCATORS]
    missing = [a for a in wanted if a not in ALLOCATORS]
    methods: list[tuple[str, float | None]] = [(a, b) for a in allocators for b in budgets]
    methods += [("dirty", None), ("shift", None), ("replay", None), ("reprefill", None)]

    model, tokenizer = load(args.model)
    info = model_info(args.model, model)
    spec = QASpec(deleted=args.deleted, question_in_cache=not args.question_in_query)
    stop = set(tokenizer.eos_token_ids) | {tokenizer.encode(t, add_special_tokens=False)[0]
                                           for t in ("\n", "\n\n")}
    cases = []
    for path in files:
        items = load_items(path)
        cases += build_cases(tokenizer, items, spec)[:per_file]  # substitutes: the whole file
    preds: dict[tuple[str, float | None], list[str]] = {m: [] for m in methods}
    seconds: dict[tuple[str, float | None], list[float]] = {m: [] for m in methods}
    start = time.perf_counter()
    for k, case in enumerate(cases):
        cache = prefill(model, case.tokens)
        order = methods[k % len(methods):] + methods[: k % len(methods)]
        for method, budget in order:
            text, sec = run_method(model, tokenizer, case, cache, method, budget, stop)
            preds[(method, budget)].append(prediction_text(text))
            seconds[(method, budget)].append(sec)
        shown = {f"{m}@{b:g}" if b is not None else m: preds[(m, b)][-1] for m, b in methods}
        print(f"{case.dataset} {k}: {case.n_tokens} tokens ({case.placement}, "
              f"{case.deleted_kind} {case.substitute!r}), gold {case.answers[0]!r}: {shown}, "
              f"{time.perf_counter() - start:.0f} s", flush=True)

    ref_key = ("reprefill", None)
    table = {}
    for m in methods:
        em = np.array([exact_match(p, c.answers) for p, c in zip(preds[m], cases, strict=True)])
        agree = np.array([float(normalize_answer(p) == normalize_answer(r))
                          for p, r in zip(preds[m], preds[ref_key], strict=True)])
        table[f"{m[0]}@{m[1]}"] = {"em": em, "agree": agree, "latency": np.array(seconds[m])}
    cis = paired_bootstrap(table, f"{ref_key[0]}@{ref_key[1]}", "shift@None")
    ref_cols = table[f"{ref_key[0]}@{ref_key[1]}"]
    shift_cols = table["shift@None"]
    rows = []
    for m in methods:
        cols = table[f"{m[0]}@{m[1]}"]
        rows.append({
            "method": m[0], "budget": m[1], "em": float(cols["em"].mean()),
            "agree": float(cols["agree"].mean()), "latency_s": float(cols["latency"].mean()),
            "latency_s_median": float(np.median(cols["latency"])),
            "em_diff_vs_reprefill": float(cols["em"].mean() - ref_cols["em"].mean()),
            "speedup_vs_reprefill": float(ref_cols["latency"].mean() / cols["latency"].mean()),
            "agree_diff_vs_shift": float(cols["agree"].mean() - shift_cols["agree"].mean()),
            **cis[f"{m[0]}@{m[1]}"],
            "em_by_dataset": {d: float(np.mean([e for e, c in zip(cols["em"], cases, strict=True)
                                                if c.dataset == d]))
                              for d in sorted({c.dataset for c in cases})},
        })
    sub_cases = [i for i, c in enumerate(cases) if c.substitute is not None]
    dirty_sub = [exact_match(preds[("dirty", None)][i], (cases[i].substitute,)) for i in sub_cases]
    head = [r for r in rows if (r["method"], r["budget"]) == HEADLINE]
    sur_vs_shift = ({"method": f"{HEADLINE[0]}@{HEADLINE[1]:g}", "agree": head[0]["agree"],
                     "shift_agree": float(shift_cols["agree"].mean()),
                     "diff": head[0]["agree_diff_vs_shift"],
                     "diff_ci": head[0]["agree_diff_vs_shift_ci"]} if head else None)
    answers = [{"id": c.id, "dataset": c.dataset, "gold": list(c.answers), "kind": c.deleted_kind,
                "substitute": c.substitute, "placement": c.placement,
                **{f"{m}@{b:g}" if b is not None else m: preds[(m, b)][i] for m, b in methods}}
               for i, c in enumerate(cases)]
    plot(rows, args.out, args.quick)
    emit(args.out, {
        "model": model_label(info), "model_info": info, "n_cases": len(cases),
        "spec": {k: getattr(spec, k) for k in spec.__dataclass_fields__},
        "files": [str(p) for p in files], "missing": missing, "rows": rows,
        "sur_vs_shift": sur_vs_shift,
        "dirty_gives_substitute": float(np.mean(dirty_sub)) if dirty_sub else None,
        "conflict_cases": len(sub_cases), "answers": answers,
        "mean_context_tokens": float(np.mean([c.n_tokens for c in cases])),
        "seconds": time.perf_counter() - start,
    }, args.quick)


if __name__ == "__main__":
    main()
