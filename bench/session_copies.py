"""Benchmark: a live session's step with its cache copies made from slices vs by row gathers.

Contract: ``python bench/session_copies.py [--quick] [--model M] [--depths 2048,4096,8000]
[--trials T] [--tag T]`` times ``Session.step_ids`` after four edits of a cached sequence of
random token ids (the copy cost depends on the rows, not on what they say), at each depth:

- ``repair delete``: 132 rows deleted 400 rows before the end, 30 tokens appended (policy
  ``repair``: one move, then one packed pass);
- ``exact delete``: the same edit under policy ``exact`` (the re-encode's transaction backs up
  the rows it overwrites);
- ``repair insert``: 40 tokens inserted at row 300, 30 appended (policy ``repair``: almost every
  row moves and is re-anchored);
- ``exact insert``: the same under policy ``exact`` (almost every row re-encoded, and backed up
  first).

Each edit runs from a copy of one prefilled session, guard off, in two modes interleaved round
by round (their order alternating): ``sliced`` (the library's copies: runs of rows joined as
slices) and ``gathered`` (every copy one row gather, as before: ``regather.MAX_SLICES`` and
``row_backup.MAX_RUNS`` set to 0). Correctness first: both modes' next-token logits are equal
(max |diff| <= 1e-6), and the exact steps' are within 1e-4 of a fresh prefill of the edited
sequence; the script exits otherwise. Reported per depth and edit: medians (ms) with bootstrap
CIs, the paired ratio gathered / sliced with its CI, the path and the sliced step's stage
timings. Writes ``results/session_copies[_<tag>].json`` (``results/quick/`` with ``--quick``), a
PNG beside it, and prints the JSON as its last stdout line.
"""

from __future__ import annotations

from common import ( # first: nexus_mlx + BLAS
    add_model_argument,
    add_tag_argument,
    arg_parser,
    emit,
    median_ci,
    model_record,
    paired_ratio_ci,
    tagged_name,
)

import sys
import time
from typing import Any

import mlx.core as mx
import numpy as np

import plots
from nexus_mlx import load
from nexus_mlx.agent.session import Session
from nexus_mlx.kv import regather as regather_module
from nexus_mlx.kv import row_backup as row_backup_module
from nexus_mlx.models.forward import forward, make_cache

MODES = {"sliced": (regather_module.MAX_SLICES, row_backup_module.MAX_RUNS), "gathered": (0, 0)}
DELETED, BEFORE_END, INSERTED, INSERT_AT, APPENDED = 132, 400, 40, 300, 30


def edits(seq: np.ndarray, rng: np.random.Generator) -> dict[str, tuple[str, np.ndarray]]:
    """Edit name -> (policy, the edited sequence)."""
    n, tail = seq.size, rng.integers(1000, 20000, APPENDED)
    deleted = np.concatenate([seq[:n - BEFORE_END], seq[n - BEFORE_END + DELETED:], tail])
    inserted = np.concatenate([seq[:INSERT_AT], rng.integers(1000, 20000, INSERTED),
                               seq[INSERT_AT:], tail])
    return {"repair delete": ("repair", deleted), "exact delete": ("exact", deleted),
            "repair insert": ("repair", inserted), "exact insert": ("exact", inserted)}


def step(model: Any, tokenizer: Any, base: Session, policy: str, new: np.ndarray,
         mode: str) -> tuple[float, Any, mx.array]:
    """One timed step of a copy of ``base`` under ``mode``: (ms, report, next-token logits)."""
    regather_module.MAX_SLICES, row_backup_module.MAX_RUNS = MODES[mode]
    session = Session(model, tokenizer, policy=policy, guard=None)  # type: ignore[arg-type]
    session.copy_prefix(base, base.cache.n_past)
    start = time.perf_counter()
    report = session.step_ids(new)
    logits = session.editor.logits
    mx.eval(logits)
    return (time.perf_counter() - start) * 1e3, report, logits


def check(model: Any, tokenizer: Any, base: Session, cases: dict[str, tuple[str, np.ndarray]]
          ) -> dict[str, float]:
    """Max |logit diff| of sliced vs gathered per edit, and of exact vs a fresh prefill."""
    out = {}
    for name, (policy, new) in cases.items():
        _, _, sliced = step(model, tokenizer, base, policy, new, "sliced")
        _, _, gathered = step(model, tokenizer, base, policy, new, "gathered")
        out[f"{name}: sliced vs gathered"] = float(mx.abs(sliced - gathered).max())
        if policy == "exact":
            fresh = forward(model, new, make_cache(model), logits="last")
            out[f"{name}: vs fresh prefill"] = float(mx.abs(sliced.reshape(-1)
                                                            - fresh.reshape(-1)).max())
    return out


def run_depth(model: Any, tokenizer: Any, depth: int, trials: int) -> dict[str, Any]:
    rng = np.random.default_rng(depth)
    seq = rng.integers(1000, 20000, depth)
    base = Session(model, tokenizer, guard=None)
    base.step_ids(seq)
    cases = edits(seq, rng)
    diffs = check(model, tokenizer, base, cases)
    bad = {k: v for k, v in diffs.items() if v > (1e-4 if "fresh" in k else 1e-6)}
    if bad:
        sys.exit(f"depth {depth}: results differ: {bad}")
    rows = []
    for name, (policy, new) in cases.items():
        times: dict[str, list[float]] = {mode: [] for mode in MODES}
        report = None
        for trial in range(trials):
            order = list(MODES) if trial % 2 == 0 else list(reversed(MODES))
            for mode in order:
                ms, rep, _ = step(model, tokenizer, base, policy, new, mode)
                times[mode].append(ms)
                report = rep if mode == "sliced" else report
        ratio = paired_ratio_ci(times["gathered"], times["sliced"])
        assert report is not None
        rows.append({"depth": depth, "edit": name, "policy": policy, "path": report.path,
                     **{f"{mode}_ms": median_ci(times[mode]) for mode in MODES},
                     "gathered_over_sliced": ratio,
                     "sliced_stages_ms": {k: v * 1e3 for k, v in report.timings.items()},
                     "trials_ms": times})
        print(f"depth {depth} {name}: sliced {rows[-1]['sliced_ms'][0]:.0f} ms, gathered "
              f"{rows[-1]['gathered_ms'][0]:.0f} ms, ratio {ratio[0]:.2f} "
              f"[{ratio[1]:.2f}, {ratio[2]:.2f}]", flush=True)
    return {"depth": depth, "checks": diffs, "rows": rows}


def draw(results: list[dict[str, Any]], name: str, quick: bool) -> None:
    fig, ax = plots.figure(width=7.0)
    rows = [row for result in results for row in result["rows"]]
    labels = [f"{row['edit']}\n{row['depth']}" for row in rows]
    x = np.arange(len(rows))
    for offset, mode in ((-0.2, "sliced"), (0.2, "gathered")):
        medians = [row[f"{mode}_ms"][0] for row in rows]
        cis = [row[f"{mode}_ms"][1:] for row in rows]
        ax.bar(x + offset, medians, 0.4, yerr=plots.error_bars(medians, cis), label=mode)
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("step ms (median, 95% CI)")
    ax.set_title("Session step: cache copies from slices vs row gathers")
    ax.legend()
    plots.save(fig, name, quick)


def main() -> None:
    parser = arg_parser(__doc__.splitlines()[0])
    add_model_argument(parser)
    parser.add_argument("--depths", default="2048,4096,8000", help="cached rows before the edit")
    parser.add_argument("--trials", type=int, default=5, help="rounds per edit (both modes)")
    add_tag_argument(parser)
    args = parser.parse_args()
    depths = [1024] if args.quick else [int(d) for d in args.depths.split(",")]
    trials = 2 if args.quick else args.trials
    model, tokenizer = load(args.model)
    try:
        results = [run_depth(model, tokenizer, depth, trials) for depth in depths]
    finally:
        regather_module.MAX_SLICES, row_backup_module.MAX_RUNS = MODES["sliced"]
    name = tagged_name("session_copies", args.tag)
    emit(name, {**model_record(args.model, model), "trials": trials,
                "edits": {"deleted": DELETED, "before_end": BEFORE_END, "inserted": INSERTED,
                          "insert_at": INSERT_AT, "appended": APPENDED},
                "results": results}, args.quick)
    draw(results, name, args.quick)


if __name__ == "__main__":
    main()
