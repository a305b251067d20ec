"""Benchmark: scoring multiple-choice continuations of one context, fresh vs reusing its prefix.

Contract: ``python bench/prompt_scoring.py [--quick] [--model M] [--questions Q] [--choices C]
[--tag T]`` builds one multiple-choice item per HotpotQA question of
``../shared/data/multihop/hotpotqa_dev50.json``: the context is its supporting paragraphs, then
``Question: ...`` and ``Answer:``; the choices are its gold answer and ``C - 1`` gold answers of
other questions (distinct strings, drawn with a fixed seed). Each choice is the context's ids
followed by the ids of `` <answer>`` (encoded apart, as evaluation harnesses do), scored as the
completions API scores ``echo`` with ``logprobs`` (:mod:`nexus_mlx.agent.prompt_scoring`). Two
arms, interleaved item by item (their order alternating): ``fresh`` scores each choice from an
empty cache (:func:`prompt_logprobs`), ``reuse`` scores an item's choices one after another
with one :class:`PromptScorer` (each choice after the first computes only the rows from the
context's last one on). Correctness first: every score of the two arms agrees within 1e-4 (the
script exits otherwise). Reported: per-item medians (ms) with bootstrap CIs, the paired ratio
fresh / reuse with its CI, rows computed per item in each arm, and the model's accuracy (the
choice whose answer tokens have the highest summed log probability, and the highest mean),
the same in both arms. Writes ``results/prompt_scoring[_<tag>].json`` (``results/quick/``
with ``--quick``), a PNG beside it, and prints the JSON as its last stdout line.
"""

from __future__ import annotations

from common import (  # first: loads nexus_mlx + fast BLAS
    add_model_argument,
    add_tag_argument,
    arg_parser,
    emit,
    median_ci,
    model_record,
    paired_ratio_ci,
    shared_data,
    tagged_name,
)

import json
import sys
import time
from typing import Any

import numpy as np

import plots
from nexus_mlx import load
from nexus_mlx.agent.prompt_scoring import PromptScorer, prompt_logprobs
from nexus_mlx.decode.name_fsm import vocab_of

TOL = 1e-4


def items(tokenizer: Any, n_questions: int, n_choices: int, seed: int = 0) -> list[dict]:
    """Multiple-choice items: context ids, the choices' answer ids, the gold choice's index."""
    data = json.loads(shared_data("multihop", "hotpotqa_dev50.json").read_text())[:n_questions]
    answers = [q["answer"] for q in data]
    rng = np.random.default_rng(seed)
    out = []
    for i, q in enumerate(data):
        paragraphs = dict((title, "".join(sents)) for title, sents in q["context"])
        support = dict.fromkeys(title for title, _ in q["supporting_facts"])
        context = "\n\n".join(paragraphs[t] for t in support if t in paragraphs)
        prompt = f"{context}\n\nQuestion: {q['question']}\nAnswer:"
        others = [a for a in dict.fromkeys(answers) if a != q["answer"]]
        picks = [others[j] for j in rng.choice(len(others), n_choices - 1, replace=False)]
        gold = int(rng.integers(n_choices))
        choices = picks[:gold] + [q["answer"]] + picks[gold:]
        out.append({"id": i, "context": list(tokenizer.encode(prompt)), "gold": gold,
                    "answers": [list(tokenizer.encode(" " + c)) for c in choices]})
    return out


def score_item(model: Any, item: dict, vocab_size: int, reuse: bool
               ) -> tuple[float, list, int]:
    """(ms, per choice the answer tokens' log probabilities, rows computed) of one item in
    one arm."""
    scorer = PromptScorer(model, vocab_size) if reuse else None
    start = time.perf_counter()
    scores, rows = [], 0
    for answer in item["answers"]:
        ids = item["context"] + answer
        if scorer is None:
            scored = prompt_logprobs(model, ids, 1, vocab_size)
            rows += len(ids) - 1
        else:
            scored = scorer.score(ids, 1)
        scores.append([s.logprob for s in scored[len(item["context"]) - 1:]])
    ms = (time.perf_counter() - start) * 1e3
    return ms, scores, rows if scorer is None else scorer.computed


def picked(scores: list[list[float]], mean: bool) -> int:
    return int(np.argmax([np.mean(s) if mean else np.sum(s) for s in scores]))


def draw(result: dict[str, Any], name: str, quick: bool) -> None:
    plots.median_bars({arm: result[f"{arm}_ms"] for arm in ("fresh", "reuse")},
                      "ms per item (median, 95% CI)",
                      f"{result['model_info']['spec']}: scoring {result['choices']} continuations "
                      f"of one context ({result['speedup'][0]:.2f}x)", name, quick)


def main() -> None:
    parser = arg_parser(__doc__.splitlines()[0])
    add_model_argument(parser)
    parser.add_argument("--questions", type=int, default=50, help="HotpotQA questions (<= 50)")
    parser.add_argument("--choices", type=int, default=4, help="choices per item")
    add_tag_argument(parser)
    args = parser.parse_args()
    model, tokenizer = load(args.model)
    vocab_size = vocab_of(tokenizer).size
    work = items(tokenizer, 5 if args.quick else args.questions, args.choices)
    score_item(model, work[0], vocab_size, True)  # warm-up
    times: dict[str, list[float]] = {"fresh": [], "reuse": []}
    rows: dict[str, list[int]] = {"fresh": [], "reuse": []}
    hits = {"sum": 0, "mean": 0}
    worst = 0.0
    for k, item in enumerate(work):
        order = [True, False] if k % 2 else [False, True]
        scores = {}
        for reuse in order:
            ms, scores[reuse], computed = score_item(model, item, vocab_size, reuse)
            times["reuse" if reuse else "fresh"].append(ms)
            rows["reuse" if reuse else "fresh"].append(computed)
        worst = max(worst, max(float(np.max(np.abs(np.subtract(a, b))))
                               for a, b in zip(scores[True], scores[False], strict=True)))
        if worst > TOL:
            sys.exit(f"item {item['id']}: the arms' scores differ by {worst:.3g} > {TOL}")
        hits["sum"] += picked(scores[True], False) == item["gold"]
        hits["mean"] += picked(scores[True], True) == item["gold"]
    context = [len(i["context"]) for i in work]
    answer = [len(a) for i in work for a in i["answers"]]
    result = {**model_record(args.model, model), "items": len(work), "choices": args.choices,
              "context_tokens": {"median": float(np.median(context)), "max": max(context)},
              "answer_tokens": {"median": float(np.median(answer)), "max": max(answer)},
              "fresh_ms": median_ci(times["fresh"]), "reuse_ms": median_ci(times["reuse"]),
              "speedup": paired_ratio_ci(times["fresh"], times["reuse"]),
              "rows_per_item": {arm: float(np.mean(r)) for arm, r in rows.items()},
              "max_abs_diff": worst,
              "accuracy": {"sum": hits["sum"] / len(work), "mean": hits["mean"] / len(work),
                           "chance": 1 / args.choices},
              "trials_ms": times}
    name = tagged_name("prompt_scoring", args.tag)
    print(f"fresh {result['fresh_ms'][0]:.0f} ms, reuse {result['reuse_ms'][0]:.0f} ms per item, "
          f"{result['speedup'][0]:.2f}x; accuracy {result['accuracy']}", flush=True)
    draw(result, name, args.quick)
    emit(name, result, args.quick)


if __name__ == "__main__":
    main()
