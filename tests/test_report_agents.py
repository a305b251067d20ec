"""The report's agent sections (bench/report_agents.py): realistic result files render the
measured cells, and empty or mistyped ones render ``n/a`` without raising."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from report import render_report
from report_agents import (
    agent_run_section,
    function_calling_section,
    guard_sweep_section,
    ir_hints_section,
    rerank_choice_section,
    routing_levers_section,
    server_section,
    session_section,
)

SESSION = {"model": "default", "summary": {
    "prefix": {"delete": {"ttft_ms": 900.0, "speedup_vs_prefix": 1.0, "agree16": 1.0,
                          "calls_identical": 1.0, "kl": 0.0, "heal_ms": 0.0, "n": 12}},
    "repair-5": {"delete": {"ttft_ms": 150.0, "speedup_vs_prefix": 6.0,
                            "speedup_incl_guard": 4.5, "agree16": 0.917,
                            "calls_identical": 0.75, "calls_compared": 4, "kl": 0.0123,
                            "heal_ms": 210.5, "n": 12}}}}
SERVER = {"model": "default", "replay": {"summary": {"nexus-repair": {"edits": {
    "ttft_ms_mean": 120.0, "ttft_ms_ci": [100.0, 140.0], "ttft_speedup_vs_mlx_lm": 4.25,
    "agree_with_mlx_lm": 0.9, "cached_tokens_mean": 812.0, "n": 21}}}},
    "constraints": {"required": {"answers": {"mlx_lm": {"honoured": False, "detail": "text"},
                                             "nexus": {"honoured": True, "detail": "a call"}}}},
    "concurrency": {"sessions": 16, "requests_per_session": 10, "errors": 0,
                    "latency_ms_p50": 950.0, "latency_ms_p99": 4100.0,
                    "peak_cache_bytes": 300 << 20, "cache_budget_bytes": 1 << 30,
                    "rss_growth_bytes": 200 << 20}}
AGENT_RUN = {"model": "qwen", "correct": 1, "n": 2, "records": [
    {"request": "What changed in the last commit?", "answer": "It added the README.",
     "calls": [{"name": "git_show", "ok": True}], "correct": True, "seconds": 41.2},
    {"request": "Time in Tokyo?", "answer": "", "calls": [{"name": "get_current_time",
                                                         "ok": False}],
     "correct": False, "seconds": 12.0}]}
AGENT_RUNS = {**AGENT_RUN, "trials": 2, "correct_per_trial": [1, 0],
              "records": [{**r, "trial": t} for t, r in enumerate(AGENT_RUN["records"])]}
CALLS = {"model": "qwen", "n": 78, "routing_accuracy": 0.8, "routing_accuracy_ci": [0.7, 0.87],
         "call_accuracy": 0.55, "argument_accuracy": 0.9, "schema_valid": 1.0,
         "specified_argument_accuracy": 0.93, "json_valid": 1.0,
         "latency_ms": {"total": {"median": 5100.0}, "route": {"median": 41.0}},
         "targets": {"routing_accuracy": 0.85, "call_accuracy": 0.75}}
LEVERS = {"rows": [{"method": "fused:0.4", "set": "github", "N": 117, "n": 78, "top1": 0.731,
                    "top1_ci": [0.62, 0.82], "top3": 0.83}],
          "chosen": {"on": "github", "method": "fused:0.4", "tuning_top1": 0.731,
                     "held_out": {"seal-easy@250": 0.97}}}
HINTS = {"model": "qwen", "accuracy": {"hints-48": {"n": 12, "call_accuracy": 0.75,
                                                    "call_ci": [0.47, 0.91],
                                                    "argument_accuracy": 0.78}},
         "tokens": {"github-mcp": {"hints-48": {"median": 36.0}}}}
CHOICE = {"tune_set": "seal-tune", "k": 10, "chosen": {"weight": 2.0, "gated": True},
          "sets": {"seal-tune": {"n": 100, "slb": {"accuracy": 0.9, "ci": [0.83, 0.94]},
                                 "query_likelihood": {"accuracy": 0.87, "ci": [0.79, 0.92]},
                                 "choice": {"accuracy": 0.9, "ci": [0.83, 0.94]},
                                 "choice_fixed": 2, "choice_broke": 2, "escalated": 0.38,
                                 "choice_ms": 6500.0}}}
SWEEP = {"cells": {"repair-5": {
    "1.0": {"deep": {"n": 59, "agree16_count": 59, "calls_count": 40, "calls_compared": 40,
                     "fired": 0.69}, "speedup_ttft": {"tools": 8.34, "delete": 3.86, "edit": 3.81},
            "speedup_incl_guard": {"tools": 3.48, "delete": 3.47}},
    "0.35": {"deep": {"n": 59, "agree16_count": 58}}}},
    "checks": [{"guard": 1.0, "arm": "repair-5", "requests": 60, "fired_both": 25,
                "fired_only_run": 3, "fired_only_replay": 0, "agree16_run": 60,
                "agree16_replay": 60}]}

CASES = [(session_section, SESSION, "| repair-5 | delete | 12 | 150.0 | 6.00 | 4.50 | 0.917 | "
                                    "0.750 (4) | 0.0123 | 210.5 |"),
         # a run from before calls were compared: its calls_identical compared none; from
         # before the guard's heals were recorded: no speed-up with them
         (session_section, SESSION, "| prefix | delete | 12 | 900.0 | 1.00 | n/a | 1.000 | n/a | "),
         (server_section, SERVER, "| nexus-repair | edits | 21 | 120.0 | [100.0, 140.0] | 4.25 |"),
         (server_section, SERVER, "| required | mlx_lm | no | text |"),
         (server_section, SERVER, "16 sessions x 10 requests, 0 errors"),
         (agent_run_section, AGENT_RUN, "| What changed in the last commit? | git_show | "
                                        "It added the README. | yes | 41 |"),
         (agent_run_section, AGENT_RUN, "get_current_time (refused)"),
         (agent_run_section, {**AGENT_RUN, "records": [{
             **AGENT_RUN["records"][1], "calls": [{"name": "git_reset", "ok": False,
                                                   "approved": False}]}]},
          "git_reset (not approved)"),
         (agent_run_section, AGENT_RUNS, "| 1 | Time in Tokyo? | get_current_time (refused) | "),
         (agent_run_section, AGENT_RUNS, "1 of 2 requests over 2 conversations (per "
                                         "conversation: 1, 0)"),
         (agent_run_section, {**AGENT_RUN, "tools_ok": 2, "review": 1},
          "accepted the calls in 2 of 2; completeness review: on."),
         (agent_run_section, {**AGENT_RUN, "tools_ok": 2, "review": 0},
          "accepted the calls in 2 of 2; completeness review: off."),
         (function_calling_section, CALLS, "| routing accuracy | 0.800 | [0.700, 0.870] | 0.85 |"),
         (function_calling_section, {**CALLS, "call_accuracy_ungrounded": 0.41,
                                     "call_accuracy_ungrounded_ci": [0.3, 0.52]},
          "| call accuracy, ungrounded arguments kept | 0.410 | [0.300, 0.520] |  |"),
         (rerank_choice_section, CHOICE, "| seal-tune (tuning) | 100 | 0.900 [0.83, 0.94] | "
                                         "0.870 [0.79, 0.92] | 0.900 [0.83, 0.94] | +2 / -2 |"),
         (rerank_choice_section, CHOICE, "retrieval weight 2.0, gated"),
         (routing_levers_section, LEVERS, "| fused:0.4 | github@117 | 78 | 0.731 |"),
         (guard_sweep_section, SWEEP, "| repair-5 | 1.0 | 59/59 | 40/40 | 0.69 | "
                                      "8.3x / 3.9x / 3.8x | 3.5x / 3.5x / n/a |"),
         (guard_sweep_section, SWEEP, "| repair-5 | 0.35 | 58/59 | n/a/n/a | n/a |"),
         (guard_sweep_section, SWEEP, "fired in both 25, only in the run 3"),
         (ir_hints_section, HINTS, "| hints-48 | 12 | 0.750 | [0.470, 0.910] | 0.780 | "
                                   "github-mcp 36 |")]


@pytest.mark.parametrize(("render", "data", "line"), CASES)
def test_sections_show_the_measured_cells(render, data, line):
    text = "\n".join(render(data))
    assert line in text, text


@pytest.mark.parametrize("render", sorted({c[0] for c in CASES}, key=lambda f: f.__name__))
@pytest.mark.parametrize("data", [{}, {"summary": [], "replay": 3, "records": "x", "rows": {},
                                       "accuracy": [], "chosen": 1, "concurrency": "no",
                                       "sets": [1]}])
def test_partial_or_mistyped_results_render_without_raising(render, data):
    assert isinstance(render(data), list)


def test_the_sections_appear_in_the_report(tmp_path: Path):
    folder = tmp_path / "results"
    folder.mkdir()
    for name, data in (("agent_session", SESSION), ("server", SERVER), ("agent_run", AGENT_RUN),
                       ("function_calling_github", CALLS), ("guard_sweep_qwen20", SWEEP)):
        (folder / f"{name}.json").write_text(json.dumps({"name": name, **data}))
    text = render_report(folder)
    agents = text[text.index("## Agents"): text.index("## Engineering")]
    for title in ("Live sessions", "Server over HTTP", "Agent loop", "#### `function_calling_github`",
                  "Close-call guard"):
        assert title in agents
    assert "`agent_session`" not in text[text.index("## Missing"):]
