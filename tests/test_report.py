"""The benchmark report: synthetic result files (full, partial, older, malformed, missing) in a
temporary results folder give the expected sections, tables, links and Missing/Unreadable lists,
deterministically, without ever raising."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import report
from report import BENCHES, fmt, fmt_ci, fmt_pct, render_report, write_report

MACHINE = {
    "platform": "Linux-test", "cpu": "Test CPU", "cores": 2, "python": "3.11.7", "mlx": "0.32.4",
    "mlx_lm": "0.32.2", "numpy": "2.4.6", "nexus_mlx": "0.1.0",
    "blas": {"loaded": True, "config": "OpenBLAS test"}, "env": {}, "date": "2026-01-02T03:04:05",
}


def _write(folder: Path, name: str, payload: object) -> None:
    text = payload if isinstance(payload, str) else json.dumps(payload)
    (folder / f"{name}.json").write_text(text)


def _result(name: str, **fields: object) -> dict[str, object]:
    return {"name": name, "quick": False, **fields, "machine": MACHINE}


@pytest.fixture()
def results(tmp_path: Path) -> Path:
    folder = tmp_path / "results"
    (folder / "quick").mkdir(parents=True)
    _write(folder, "blas", _result("blas", mlx_fp32_ms=66.93239, mlx_fp32_ci=[64.8, 67.2],
                                   numpy_fp32_ms=63.35, numpy_fp32_ci=[60.4, 68.0],
                                   ratio=1.0565, ratio_ci=[0.97, 1.11], target_ratio=2.0,
                                   n=2048, blas_loaded=True))
    (folder / "blas.png").write_bytes(b"\x89PNG")
    _write(folder, "dkl_sweep", _result("dkl_sweep", model="default (SmolLM2)", rows=[
        {"offset": 256, "kl_median": 0.0312, "kl_ci": [0.02, 0.04], "top1": 1.0, "path": "bare"},
        {"offset": 0, "kl_median": 0.0, "kl_ci": [0.0, 0.0], "top1": 1.0, "path": "anchored"},
        {"offset": 64, "kl_median": 0.0123, "top1": 1.0},  # older file: no CI, no path
    ]))
    # an older deep-splice result: no machine block, some keys missing
    _write(folder, "deep_splice_ttft", {"name": "deep_splice_ttft", "cells": [
        {"n_past": 1024, "K": 4, "speedup": 0.991},
        {"n_past": 256, "K": 4, "prefill_ms": 1310.0, "splice_ms": 800.0, "speedup": 1.6375,
         "speedup_ci": [1.5, 1.7], "top1_ok": True, "kl": 0.0123},
        {"n_past": 512, "K": 16.0, "speedup": 2.49, "limit_speedup": 3.591},
        {"n_past": 512, "curve": "sur", "speedup": 1.58},
    ]})
    _write(folder, "repair_niah", _result("repair_niah", n_cases=2, spec={"lengths": [512]},
                                          references={"shift": {"em": 0.5, "kl": 0.01}},
                                          allocators={"sur": {"5": {"em": 1.0}, "2": {"em": 0.9}},
                                                      "bm25_units": {"2": {"em": 0.5}}}))
    _write(folder, "repair_niah_long", _result("repair_niah_long", n_cases=1,
                                               allocators={"sur": {"2": {"em": 0.75}}}))
    _write(folder, "micro", {"machine_info": {"cpu": {"brand_raw": "Bench CPU"},
                                              "python_version": "3.11.7"},
                             "datetime": "2026-01-02", "version": "5.3.1",
                             "benchmarks": [{"name": "test_scan", "fullname": "x::test_scan",
                                             "stats": {"median": 2.5e-6, "iqr": 1e-7,
                                                       "min": 2e-6, "rounds": 100},
                                             "extra_info": {"steps": 10}}]})
    _write(folder, "engine", "{not json")  # malformed
    _write(folder, "packed_refresh", "[1, 2, 3]")  # valid JSON, wrong top level
    _write(folder, "gating_nogo", _result("gating_nogo", mean_spearman="oops", rows="bad"))
    _write(folder, "extra_thing", _result("extra_thing", answer=42, ratio=0.123456, nested={}))
    _write(folder / "quick", "routing_accuracy", _result("routing_accuracy", cells=[]))
    return folder


def _section(text: str, title: str) -> str:
    start = text.index(title)
    nxt = [i for i in (text.find("\n### ", start + 1), text.find("\n## ", start + 1)) if i > 0]
    return text[start : min(nxt) if nxt else len(text)]


def test_sections_tables_and_paper_values(results: Path):
    path = write_report(results)
    assert path == results / "REPORT.md"
    text = path.read_text()
    for bench in BENCHES:
        assert f"### {bench.title}" in text
    blas = _section(text, "### BLAS")
    assert "| MLX fp32 matmul (ms) | 66.9 | [64.8, 67.2] |" in blas
    assert "| ratio MLX / numpy | 1.06 | [0.97, 1.11] |" in blas
    assert "![blas](blas.png)" in blas
    assert "CPU Test CPU (2 cores)" in blas and "MLX 0.32.4" in blas
    assert "BLAS OpenBLAS test" in blas
    dkl = _section(text, "### Fig. 5")
    assert "Paper 1, Fig. 5" in dkl and "0.008-0.038" in dkl
    rows = [line for line in dkl.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [r.split(" | ")[0] for r in rows] == ["| 0", "| 64", "| 256"]  # sorted by offset
    assert "| 64 | n/a | 0.0123 | n/a |" in dkl  # missing keys -> n/a
    assert "model default (SmolLM2)" in dkl
    ttft = _section(text, "### Table III")
    assert "| 256 | 4 | n/a | n/a | n/a | 1310.0 | 800.0 | 1.64 | [1.50, 1.70] | n/a | yes |" in ttft
    assert "| 2.49 | n/a | 3.59 |" in ttft  # the limit arm's speedup beside the splice's
    row_1024 = next(line for line in ttft.splitlines() if line.startswith("| 1024 | 4 |"))
    assert row_1024.endswith("| 0.98-1.00 |")
    assert ttft.rstrip().splitlines()[-1].startswith("| 512 | sur |")  # named curves sort last
    assert "machine n/a" in ttft
    assert "| 512 | 16 | n/a |" in ttft and "| 512 | sur | n/a |" in ttft


def test_variants_micro_and_other_results(results: Path):
    text = render_report(results)
    niah = text[text.index("### Tables 2-6") : text.index("### Table 7")]
    assert "#### `repair_niah`" in niah and "#### `repair_niah_long`" in niah
    assert "| allocator | 2% | 5% |" in niah
    assert "| sur | 0.900 | 1.000 |" in niah and "| bm25_units | 0.500 | n/a |" in niah
    assert "| paper (SUR) | 0.896-1.000 |  |" in niah
    micro = _section(text, "### Micro-benchmarks")
    assert "| test_scan | 2.50 | 0.10 | 2.00 | 100 | 0.25 |" in micro and "CPU Bench CPU" in micro
    other = text[text.index("## Other results") : text.index("## Missing")]
    assert "### `extra_thing`" in other
    assert "| answer | 42 |" in other and "| ratio | 0.1235 |" in other
    assert "nested" not in other


def test_missing_and_unreadable(results: Path):
    text = render_report(results)
    missing = text[text.index("## Missing") : text.index("## Unreadable")]
    names = [line.split("`")[1] for line in missing.splitlines() if line.startswith("- ")]
    expected_missing = {"routing_accuracy", "calibration", "sidecar_accuracy", "repair_qa",
                        "engine", "packed_refresh", "slb_latency", "l0_radix", "embedder",
                        "micro_masks", "rerank_fusion", "function_calling", "routing_levers",
                        "ir_hints", "agent_session", "server", "agent_run", "curve_calibration",
                        "rerank_choice", "guard_sweep", "session_copies", "lookahead",
                        "skinny_gemm", "certified_head", "forced_runs",
                        "predicted_outputs", "server_memory", "prompt_scoring",
                        "server_completions", "session_restore", "server_interleave",
                        "weight_twins"}
    assert set(names) == expected_missing  # quick/routing_accuracy.json is not a full result
    assert "- `routing_accuracy`: `python bench/routing_accuracy.py`" in missing
    assert "`blas`" not in missing and "`micro`" not in missing
    unreadable = text[text.index("## Unreadable") :]
    assert "- `engine.json`: JSONDecodeError" in unreadable
    assert "- `packed_refresh.json`: top level is a JSON list" in unreadable
    gating = _section(text, "### Table II")
    assert "| mean Spearman (proxy vs true drift) | oops | 0.193 |" in gating
    assert "_(no rows)_" in gating


def test_a_failing_section_is_reported_not_raised(results: Path, monkeypatch):
    def boom(data: dict) -> list[str]:
        raise KeyError("broken")

    benches = tuple(dataclasses.replace(b, render=boom) if b.name == "blas" else b
                    for b in BENCHES)
    monkeypatch.setattr(report, "BENCHES", benches)
    text = render_report(results)
    assert "_Could not render `blas.json` (see Unreadable)._" in text
    assert "- `blas.json`: could not render: KeyError: 'broken'" in text
    assert "- `blas`: `python bench/blas.py`" in text


def test_deterministic_and_out_elsewhere(results: Path, tmp_path: Path):
    first = write_report(results).read_bytes()
    assert write_report(results).read_bytes() == first
    out = write_report(results, tmp_path / "docs" / "report.md")
    assert "![blas](../results/blas.png)" in out.read_text()


def test_empty_or_absent_folder_lists_everything_missing(tmp_path: Path):
    text = render_report(tmp_path / "nothing")  # write_report refuses: test_cli_errors.py
    missing = text[text.index("## Missing") : text.index("## Unreadable")]
    assert sum(line.startswith("- ") for line in missing.splitlines()) == len(BENCHES)
    assert "`micro`: `pytest bench/micro --benchmark-json=results/micro.json`" in missing


def test_formatters():
    assert fmt(None) == "n/a" and fmt(True) == "yes" and fmt(3) == "3"
    assert fmt(0.12345) == "0.123" and fmt(1e-6, ".3g") == "1e-06" and fmt("a|b") == "a\\|b"
    assert fmt([1, 2]) == "n/a" and fmt(float("nan")) == "nan"
    assert fmt_ci([0.1, 0.2]) == "[0.100, 0.200]" and fmt_ci([0.1]) == "n/a"
    assert fmt_ci(["x", 1]) == "n/a"
    assert fmt_pct(0.8) == "80.0%" and fmt_pct(79.5) == "79.5%" and fmt_pct("x") == "n/a"


def test_routing_oracle_calibration_and_fusion_sections(tmp_path: Path):
    folder = tmp_path / "results"
    folder.mkdir()
    _write(folder, "routing_accuracy", _result("routing_accuracy", cells=[
        {"N": 50, "accuracy": 0.99, "ci": [0.96, 1.0], "oracle": {"n": 3, "accuracy": 1 / 3,
                                                                 "prompt_tokens_median": 5852.0}},
        {"N": 4076, "accuracy": 0.85, "ci": [0.79, 0.89], "oracle": "overflow"},
    ]))
    _write(folder, "calibration", _result("calibration", registries=[
        {"registry": "gh", "n_tools": 117, "tools": {"tau": 0.0793, "n_adversarial": 12,
                                                     "fire_rate_calibration": 0.026,
                                                     "fire_rate_test": 0.769,
                                                     "errors_escalated": 0.968}},
        {"registry": "seal-250", "fixed_sample": {"n_tools": 250, "heldout": {"tau": 0.0112}}},
    ]))
    _write(folder, "rerank_fusion", _result("rerank_fusion", n_queries=240, n_escalated=158,
                                            tau=0.068, chosen={"k": 10, "weight": 0.5},
                                            slb_only={"accuracy_escalated": 0.614},
                                            grid=[{"k": 10, "weight": 0.5,
                                                   "accuracy_escalated": 0.842,
                                                   "ci_escalated": [0.777, 0.890]}]))
    text = render_report(folder)
    assert "| 50 | 0.990 | [0.960, 1.000] |" in text and "1/3 right (5852 tokens)" in text
    assert "| 4076 | 0.850 |" in text and "| overflow |" in text
    assert "| gh | 117 | tools | 0.0793 | 12 | 0.026 | 0.769 | 0.968 |" in text
    assert "| seal-250 | 250 | heldout | 0.0112 |" in text
    assert "Chosen: k = 10, retrieval weight 0.5" in text
    assert "| 10 | 0.5 | 0.842 | [0.777, 0.890] |" in text


def test_curve_calibration_section():
    from report_sections import curve_section

    data = {"model": "default", "kl_limit": 0.02, "block_context": "system",
            "curve": {"M": 256, "R_base": 2.0, "K": 2.0},
            "depths": [{"n_past": 481, "need": 75.0, "heldout": {"percent": 88.1,
                                                                "kl_median": 0.0041, "top1": 1.0}}],
            "paper_curve_heldout": [{"n_past": 481, "percent": 32.8, "kl_median": 0.0111,
                                     "top1": 1.0}]}
    text = "\n".join(curve_section(data))
    assert "M = 256, R_base = 2, K = 2" in text
    assert "| 481 | 75 | 88.1 | 0.0041 | 1.00 | 32.8 | 0.0111 | 1.00 |" in text
    assert isinstance(curve_section({"depths": 3, "curve": []}), list)
