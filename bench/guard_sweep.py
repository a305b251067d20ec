"""Replay the session's close-call guard at any threshold from one agent_session run without it.

Contract: ``python bench/guard_sweep.py RESULT.json [...] [--tag T] [--thresholds 0.1,0.25,...]``
reads ``bench/agent_session.py`` results (shards of one run, or one merged file) made with the
guard off and holding each repair arm's per-token top-2 margins (``margins``) and first
divergence from the reference (``diverge``), and computes, for every threshold G and repair
arm, what ``Session(guard=G)`` would have done on the same requests (the first request of each
trajectory, a cold prefill, is left out as in the benchmark's summary):

- the guard fires at the first chosen token whose margin is below G, if the step left stale
  rows (``stale > 0``; without stale rows it has nothing to heal);
- firing at or before the divergence makes the reply the reference's (a healed cache is the
  fresh prefill's, a tested equivalence), so its first 16 tokens and its call agree; firing
  after it, or not at all, leaves the reply as it was;
- firing costs the heal of the step's stale rows, taken from the same request's idle heal of
  those rows (``heal_ms``); at the first token it adds to TTFT, later to the decode.

This is exact up to timing noise: before the guard fires the guarded run decodes the same
tokens from the same cache as the unguarded one. Per G and arm, over the benchmark's ``deep``
requests (non-append, depth >= 1,024 tokens) and over every request: first-16 agreement, call
agreement, fire rate, mean added milliseconds, and the speed-up over the prefix cache per edit
class, with the heals the guard adds before the first token (``speedup_ttft``) and with every
heal it adds (``speedup_incl_guard``). Writes ``results/guard_sweep[_T].json`` (+ PNG) and prints
the final JSON line; ``check`` compares a run made with a guard against the replay of G where
both cover the same requests (``--check GUARDED.json ...``).
"""

from __future__ import annotations

from common import ( # first: loads nexus_mlx + fast BLAS
    add_tag_argument,
    arg_parser,
    emit,
    tagged_name,
)

import json
from pathlib import Path
from typing import Any

import numpy as np
from agent_session import is_deep

CLASSES = ("tools", "delete", "edit")
DEFAULT_THRESHOLDS = (0.05, 0.1, 0.15, 0.25, 0.35, 0.5, 0.75, 1.0, 1.5)


def load_records(files: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The records of ``files`` (later requests only) and the first file's settings."""
    payloads = [json.loads(Path(f).read_text()) for f in files]
    records = [r for p in payloads for r in p["records"] if r["request"] > 0]
    return records, payloads[0]


def replay(arm: dict[str, Any], guard: float) -> dict[str, Any]:
    """What the guard at ``guard`` nats would have done on one request of one repair arm."""
    margins = arm.get("margins")
    if margins is None:
        raise ValueError("a record holds no per-token margins: rerun bench/agent_session.py "
                         "(it records them since 2026-12-04) without --guard")
    fire = next((t for t, m in enumerate(margins) if m < guard), None) if arm["stale"] else None
    diverge = arm["diverge"]
    fixes = fire is not None and diverge is not None and fire <= diverge
    added = float(arm.get("heal_ms", 0.0)) if fire is not None else 0.0
    return {"fire": fire, "agree16": bool(arm["agree16"]) or fixes,
            "call": None if arm["calls_identical"] is None else bool(arm["calls_identical"])
            or fixes, "added_ms": added, "step_ms": added if fire == 0 else 0.0}


def sweep_cell(records: list[dict[str, Any]], arm: str, guard: float) -> dict[str, Any]:
    """One (threshold, arm) cell over ``records``."""
    replays = [replay(r["arms"][arm], guard) for r in records]
    out: dict[str, Any] = {}
    for scope, keep in (("deep", is_deep), ("all", lambda _: True)):
        played = [p for r, p in zip(records, replays, strict=True) if keep(r)]
        calls = [p["call"] for p in played if p["call"] is not None]
        out[scope] = {"n": len(played), "agree16": _mean([p["agree16"] for p in played]),
                      "agree16_count": sum(p["agree16"] for p in played),
                      "calls_identical": _mean(calls), "calls_count": sum(calls),
                      "calls_compared": len(calls),
                      "fired": _mean([p["fire"] is not None for p in played]),
                      "added_ms": _mean([p["added_ms"] for p in played])}
    out["speedup_ttft"], out["speedup_incl_guard"] = {}, {}
    for cls in CLASSES:
        rows = [(r, p) for r, p in zip(records, replays, strict=True)
                if is_deep(r) and r["edit"] == cls]
        if rows and "prefix" in rows[0][0]["arms"]:
            prefix = np.mean([r["arms"]["prefix"]["ttft_ms"] for r, _ in rows])
            for key, added in (("speedup_ttft", "step_ms"), ("speedup_incl_guard", "added_ms")):
                mine = np.mean([r["arms"][arm]["ttft_ms"] + p[added] for r, p in rows])
                out[key][cls] = float(prefix / mine)
    return out


def _mean(values: list[Any]) -> float | None:
    return float(np.mean(values)) if values else None


def check(records: list[dict[str, Any]], guarded_files: list[str], arm: str
          ) -> dict[str, Any]:
    """The replay of a guarded run's G against that run, on the requests both hold (with
    ``arm``: a guarded shard may have run fewer budgets): requests where the guard fired in one
    and not the other, and first-16 / call agreement of each."""
    guarded, settings = load_records(guarded_files)
    guard = float(settings["guard"])
    mine = {(r["trajectory"], r["request"]): r for r in records}
    pairs = [(mine[k], g) for g in guarded
             if (k := (g["trajectory"], g["request"])) in mine and arm in g["arms"]]
    fired_real = [bool(g["arms"][arm].get("guarded") or g["arms"][arm].get("decode_guarded"))
                  for _, g in pairs]
    played = [replay(r["arms"][arm], guard) for r, _ in pairs]
    fired_sim = [p["fire"] is not None for p in played]
    return {"guard": guard, "arm": arm, "requests": len(pairs),
            "fired_both": sum(a and b for a, b in zip(fired_real, fired_sim, strict=True)),
            "fired_only_run": sum(a and not b for a, b in zip(fired_real, fired_sim, strict=True)),
            "fired_only_replay": sum(b and not a for a, b in zip(fired_real, fired_sim,
                                                                 strict=True)),
            "agree16_run": sum(bool(g["arms"][arm]["agree16"]) for _, g in pairs),
            "agree16_replay": sum(p["agree16"] for p in played)}


def draw(cells: dict[str, dict[str, Any]], thresholds: list[float], name: str) -> None:
    import plots

    fig, (ax_f, ax_s) = plots.figure(2, width=6)
    for arm, by_g in cells.items():
        ax_f.plot(thresholds, [by_g[str(g)]["deep"]["agree16"] for g in thresholds], "o-",
                  label=f"{arm} first 16")
        ax_f.plot(thresholds, [by_g[str(g)]["deep"]["calls_identical"] for g in thresholds],
                  "s--", label=f"{arm} calls")
        for cls in CLASSES:
            ax_s.plot(thresholds, [by_g[str(g)]["speedup_incl_guard"].get(cls, np.nan)
                                   for g in thresholds], "o-", label=f"{arm} {cls}")
    ax_f.axhline(0.95, color="grey", lw=0.8)
    ax_f.set(xscale="log", xlabel="guard threshold G (nats)", ylabel="identical to reference",
             title="Fidelity, deep edits (replayed)")
    ax_s.axhline(3.0, color="grey", lw=0.8)
    ax_s.set(xscale="log", yscale="log", xlabel="guard threshold G (nats)",
             ylabel="speed-up over prefix cache", title="TTFT + guard heals")
    ax_f.legend(fontsize=7)
    ax_s.legend(fontsize=7)
    plots.save(fig, name, False)


def main() -> None:
    parser = arg_parser(__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("results", nargs="+", help="agent_session results without a guard")
    parser.add_argument("--thresholds", default=",".join(f"{g:g}" for g in DEFAULT_THRESHOLDS))
    parser.add_argument("--check", nargs="+", default=None, metavar="GUARDED",
                        help="runs made with a guard, to compare with the replay of their G")
    add_tag_argument(parser)
    args = parser.parse_args()
    records, settings = load_records(args.results)
    if settings.get("guard") is not None:
        parser.error("replay needs a run made without a guard")
    thresholds = [float(g) for g in str(args.thresholds).split(",")]
    arms = [a for a in records[0]["arms"] if a.startswith("repair-")]
    cells = {arm: {str(g): sweep_cell(records, arm, g) for g in thresholds} for arm in arms}
    checks = [check(records, args.check, arm) for arm in arms] if args.check else []
    name = tagged_name("guard_sweep", args.tag)
    emit(name, {"model": settings.get("model"), "sources": args.results,
                "reference": settings.get("reference", "reprefill"),
                "trajectories": sorted({r["trajectory"] for r in records}),
                "thresholds": thresholds, "cells": cells, "checks": checks}, False)
    draw(cells, thresholds, name)


if __name__ == "__main__":
    main()
