"""Erasing-NIAH: every repair allocator at budgets 2-80% against Dirty/Shift/Replay/Re-prefill.

Cases come from ``tasks.niah`` (seeded; real haystack paragraphs, two facts stating one vault's
access code, the question at the end of the cached user message; deleting one fact changes the
gold list of codes). Per case: the context ``p + e + s`` is prefilled, the edit applied by each
arm, then the query (end of turn, assistant header; the question too with
``--question-in-query``) is fed and greedily continued (first line). Per arm: EM (the parsed
codes equal the post-deletion gold, in order), KL(p_reprefill || p_arm) at the answer position
(the first answer token), top-1 agreement with Re-prefill's greedy answer over its tokens
(teacher-forced), and the mean relative K/V deviation of the suffix rows from Replay's cache
(``repair_metrics``). Allocators score relevance against the question text. Allocator names
missing from the registry are skipped and listed under ``missing``.
JSON: {"model", "n_cases", "spec", "references": {name: {"em", "kl", "agree", "kv_dev"}},
       "allocators": {name: {budget: {"em", "kl", "agree", "kv_dev", "repair_s",
       "em_vs_replay"}}}, "missing", "dirty_answers_deleted_value", "answers"}
(each entry also has "em_ci", "em_by_length", "kl_median" and the per-case "kl_cases";
"em_vs_replay" is EM / Replay's EM; "dirty_answers_deleted_value" is how often Dirty gave the
with-e gold, i.e. how often the deletion changes the model's answer; "answers" holds every
case's gold, the with-e gold and every arm's answer text).
Options: --model M (default qwen2.5-coder-0.5b; "model" names it, "model_info" has its file,
fingerprint and dtype), --cases N,
--allocators a,b (or "none"), --budgets 2,5, --references a,b, --lengths 1024,2048,
--answer list|latest, --values N, --deleted last|any, --distractors N, --depth LO,HI (where e
sits), --question-in-query,
--out NAME (results file name). PNG: results/<out>.png.
"""

from __future__ import annotations

from common import arg_parser, emit  # first: loads nexus_mlx + fast BLAS

import time

import numpy as np

from nexus_mlx import load
from nexus_mlx.decode.generate import greedy_continuation
from nexus_mlx.refresh import dirty, repair, replay, shift
from nexus_mlx.refresh.allocators import ALLOCATORS, _load_builtin
from tasks.niah import NiahSpec, niah_cases, score
from repair_metrics import (answer_logprobs, evaluate_arm, kv_deviation, model_info, model_label,
                            prefill)

ALLOCATOR_NAMES = (
    "sur", "dense_tokens", "single_window", "bm25_units", "random_units", "prophetkv", "infoflow",
    "cachecraft", "cacheblend", "a3", "cachetune", "speccache", "legolink", "oracle",
)
REFERENCES = ("dirty", "shift", "replay", "reprefill")
BUDGETS = (2, 5, 10, 20, 40, 80)
DEFAULT_MODEL = "qwen2.5-coder-0.5b"


def max_answer(spec: NiahSpec) -> int:
    """Greedy tokens per answer: room for every code of the case plus one more ("4821, 7730"
    is 10 tokens with per-digit tokenizers), so an extra code is seen, and the end of turn."""
    return 6 * (spec.n_values + 1) + 2


def _csv(text: str | None, default, cast=str):
    if text is None:
        return list(default)
    if text.strip().lower() in ("", "none"):
        return []
    return [cast(x) for x in text.split(",") if x.strip()]


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def _boot_ci(values: list[float], n_boot: int = 2000, seed: int = 0) -> list[float]:
    arr = np.asarray(values, dtype=np.float64)
    idx = np.random.default_rng(seed).integers(0, arr.size, size=(n_boot, arr.size))
    means = arr[idx].mean(axis=1)
    return [float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))]


def summarize(rows: list[dict[str, float]], lengths: list[int]) -> dict[str, object]:
    """Means of every metric over cases, the median and per-case KLs, a bootstrap CI of EM, and
    EM per context length."""
    out: dict[str, object] = {}
    for key in rows[0]:
        vals = [r[key] for r in rows if r[key] is not None]
        out[key] = _mean(vals)
    kls = [r["kl"] for r in rows if r["kl"] is not None]
    out["kl_median"] = float(np.median(kls)) if kls else None
    out["kl_cases"] = kls  # per case, in case order: paired comparisons between arms
    out["em_ci"] = _boot_ci([r["em"] for r in rows])
    out["em_by_length"] = {
        str(n): _mean([r["em"] for r, m in zip(rows, lengths, strict=True) if m == n])
        for n in sorted(set(lengths))
    }
    out["n"] = len(rows)
    return out


def plot(result: dict[str, object], name: str, quick: bool):
    """EM, KL and K/V deviation against the budget; None when matplotlib is missing."""
    try:
        from plots import budget_axis, figure, save, series_styles
    except ImportError:
        return None
    fig, axes = figure(3, width=5.0, height=4.5)
    allocs: dict = result["allocators"]  # type: ignore[assignment]
    all_budgets: set[float] = set()
    for (alloc, by_budget), style in zip(allocs.items(), series_styles(len(allocs)), strict=True):
        budgets = sorted(by_budget, key=float)
        xs = [float(b) for b in budgets]
        all_budgets.update(xs)
        for ax, metric in zip(axes, ("em", "kl", "kv_dev"), strict=True):
            ax.plot(xs, [by_budget[b][metric] for b in budgets], ms=3, label=alloc, **style)
    refs: dict = result["references"]  # type: ignore[assignment]
    styles = {"dirty": ("r", ":"), "shift": ("k", "--"), "replay": ("g", "-."),
              "reprefill": ("b", "-")}
    for ref, vals in refs.items():
        for ax, metric in zip(axes, ("em", "kl", "kv_dev"), strict=True):
            value = vals.get(metric)
            if value is not None and (metric == "em" or value > 0):  # log axes: skip exact zeros
                color, style = styles[ref]
                ax.axhline(value, ls=style, color=color, lw=1, label=f"{ref} (ref)")
    axes[0].set(xlabel="budget (%)", ylabel="exact match", title="EM")
    axes[1].set(yscale="log", xlabel="budget (%)", ylabel="nats",
                title="KL(re-prefill || arm), answer position (mean)")
    axes[2].set(yscale="log", xlabel="budget (%)", ylabel="relative deviation",
                title="suffix K/V deviation from Replay")
    for ax in axes:
        budget_axis(ax, sorted(all_budgets))
    axes[0].legend(fontsize=6, ncol=2)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(f"Erasing-NIAH, {result['n_cases']} cases, {result['model']}")
    return save(fig, name, quick)


def run_case(model, tokenizer, case, references, names, budgets, stop, max_tokens):
    """Rows for one case: ({reference: row}, {allocator: {budget: row}}, whether Dirty gave
    the with-e gold (None without Dirty), {arm: answer text} (allocators as "name@budget"))."""
    edit, query = case.edit, case.query
    question = tokenizer.encode(case.question, add_special_tokens=False)
    gold = prefill(model, np.concatenate([case.tokens[: edit.p0], case.tokens[edit.p1 :]]))
    ref_answer = greedy_continuation(model, query, gold.copy(), max_tokens, stop)
    ref_logp = answer_logprobs(model, gold, query, ref_answer)
    needs_dirty = bool(names) or any(r != "reprefill" for r in references)
    cache = prefill(model, case.tokens) if needs_dirty else gold
    replayed = replay(model, cache, edit) if needs_dirty else gold

    def evaluate(arm_cache, kv_ref=True):
        ev = evaluate_arm(model, arm_cache, query, ref_answer, ref_logp, max_tokens, stop)
        text = tokenizer.decode(ev.tokens)
        return {
            "em": float(score(text, case.answer)), "kl": ev.kl, "agree": ev.agree,
            "kv_dev": kv_deviation(arm_cache, replayed, edit.p0) if kv_ref else None,
        }, text

    arms = {"dirty": lambda: dirty(cache, edit), "shift": lambda: shift(cache, edit),
            "replay": lambda: replayed, "reprefill": lambda: gold}
    refs, deleted, texts = {}, None, {}
    for name in references:
        refs[name], texts[name] = evaluate(arms[name](), kv_ref=name != "dirty")
        if name == "dirty":
            deleted = float(score(texts[name], case.deleted_answer))
    allocs: dict[str, dict[float, dict]] = {}
    for name in names:
        allocs[name] = {}
        for b in budgets:
            result = repair(model, cache, edit, question, b, name, tokenizer=tokenizer)
            row, texts[f"{name}@{b:g}"] = evaluate(result.cache)
            row["repair_s"] = sum(result.timings.values())
            allocs[name][b] = row
    texts.setdefault("reprefill", tokenizer.decode(ref_answer))
    return refs, allocs, deleted, texts


def relative_to_replay(result: dict[str, object]) -> None:
    """Add ``em_vs_replay`` (EM / Replay's EM; None without Replay or when it is 0) to every
    allocator entry of ``result``."""
    replay_em = result["references"].get("replay", {}).get("em")  # type: ignore[union-attr]
    for by_budget in result["allocators"].values():  # type: ignore[union-attr]
        for row in by_budget.values():
            row["em_vs_replay"] = row["em"] / replay_em if replay_em else None


def main() -> None:
    parser = arg_parser(__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=None)
    parser.add_argument("--allocators", default=None)
    parser.add_argument("--budgets", default=None)
    parser.add_argument("--references", default=None)
    parser.add_argument("--lengths", default=None)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--answer", default=NiahSpec.answer, choices=("list", "latest"))
    parser.add_argument("--distractors", type=int, default=NiahSpec.n_distractors)
    parser.add_argument("--values", type=int, default=NiahSpec.n_values,
                        help="statements of the target's code (one is deleted)")
    parser.add_argument("--deleted", default=NiahSpec.deleted, choices=("last", "any"))
    parser.add_argument("--depth", default=None, help="LO,HI: where e sits (haystack fraction)")
    parser.add_argument("--question-in-query", action="store_true",
                        help="ask the question after the repair instead of caching it")
    parser.add_argument("--out", default="repair_niah")
    args = parser.parse_args()
    quick = args.quick
    n_cases = args.cases if args.cases is not None else (1 if quick else NiahSpec.n_cases)
    budgets = _csv(args.budgets, (5,) if quick else BUDGETS, float)
    lengths = tuple(_csv(args.lengths, (512,) if quick else NiahSpec().lengths, int))
    references = _csv(args.references, REFERENCES)
    wanted = _csv(args.allocators, ALLOCATOR_NAMES)
    _load_builtin()
    names = [a for a in wanted if a in ALLOCATORS]
    missing = [a for a in wanted if a not in ALLOCATORS]

    model, tokenizer = load(args.model)
    stop = set(tokenizer.eos_token_ids) | {tokenizer.encode(t, add_special_tokens=False)[0]
                                           for t in ("\n", "\n\n")}  # the first line counts
    depth = tuple(_csv(args.depth, NiahSpec.edit_depth, float))
    spec = NiahSpec(n_cases=n_cases, lengths=lengths, answer=args.answer, n_values=args.values,
                    deleted=args.deleted, n_distractors=args.distractors,
                    edit_depth=depth,  # type: ignore[arg-type]
                    question_in_cache=not args.question_in_query)
    max_tokens = max_answer(spec)
    info = model_info(args.model, model)
    answers: list[dict[str, object]] = []
    ref_rows: dict[str, list] = {r: [] for r in references}
    alloc_rows: dict[str, dict[float, list]] = {a: {b: [] for b in budgets} for a in names}
    dirty_deleted: list[float] = []
    case_lengths: list[int] = []  # the spec's nominal length of each case
    start = time.perf_counter()
    for case in niah_cases(tokenizer, spec):
        case_lengths.append(spec.lengths[case.index % len(spec.lengths)])
        refs, allocs, deleted, texts = run_case(model, tokenizer, case, references, names,
                                                budgets, stop, max_tokens)
        answers.append({"gold": list(case.answer), "with_e": list(case.deleted_answer),
                        "deleted_index": case.deleted_index, "tokens": case.n_tokens,
                        "suffix": case.suffix_length, **texts})
        for name, row in refs.items():
            ref_rows[name].append(row)
        for name, by_b in allocs.items():
            for b, row in by_b.items():
                alloc_rows[name][b].append(row)
        if deleted is not None:
            dirty_deleted.append(deleted)
        shown = ", ".join(f"{k} {v!r}" for k, v in texts.items())
        print(f"case {case.index}: {case.n_tokens} tokens (suffix {case.suffix_length}), gold "
              f"{', '.join(case.answer)}; {shown}; {time.perf_counter() - start:.0f} s", flush=True)

    result: dict[str, object] = {
        "model": model_label(info), "model_info": info,
        "n_cases": n_cases,
        "spec": {k: getattr(spec, k) for k in spec.__dataclass_fields__},
        "references": {r: summarize(rows, case_lengths) for r, rows in ref_rows.items()},
        "allocators": {a: {f"{b:g}": summarize(rows, case_lengths) for b, rows in by_b.items()}
                       for a, by_b in alloc_rows.items()},
        "missing": missing,
        "dirty_answers_deleted_value": _mean(dirty_deleted),
        "answers": answers,
        "seconds": time.perf_counter() - start,
    }
    relative_to_replay(result)
    plot(result, args.out, quick)
    emit(args.out, result, quick)


if __name__ == "__main__":
    main()
