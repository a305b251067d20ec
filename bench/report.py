"""Benchmark report: ``results/*.json`` -> ``results/REPORT.md``, measured next to paper values.

Contract: :func:`write_report` reads every top-level ``<results_dir>/*.json`` (full runs only:
``results/quick/`` is never read) and writes one markdown file (default
``<results_dir>/REPORT.md``) with a section per paper table or figure and per engineering
benchmark, in a fixed order. A section holds markdown tables of the *measured* values, the
*paper's* values with a citation note (both from ``bench/paper_reference.json``, see
:data:`~report_sections.PAPER`), the PNG beside the JSON (relative link) when there is one, and
the machine, model and versions recorded in the result (``bench/common.py``'s ``machine``;
pytest-benchmark's ``machine_info`` for ``micro.json``). A "Missing" list names every expected
benchmark without a result and the command that produces it.

Output is deterministic: sections in :data:`BENCHES` order, rows sorted, fixed float formats,
no generation timestamp, so the same inputs give the same bytes. It tolerates partial or older
JSON (a missing or mistyped key renders as ``n/a``) and never stops on one bad file: a file that
is not a JSON object, or whose section fails to render, is listed under "Unreadable" (and its
benchmark under "Missing").

:func:`write_report` refuses (:class:`NoResultsError`, nothing written) when the results
directory is absent or holds no top-level ``*.json``: a report of nothing but "No result" lines
is a wrong path, not a report. Run as a script, that refusal is one line on stderr and exit
status 2. :func:`render_report` still renders any folder, empty or not.

It does not run benchmarks, judge results or know how a number was measured beyond the JSON
contract in each ``bench/<name>.py`` docstring.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from report_format import (  # fmt, fmt_ci, fmt_pct: also the public number formats
    cell,
    fmt,
    fmt_ci,
    fmt_pct,
    get,
    scalar_rows,
    table,
)
from report_agents import (
    agent_run_section,
    forced_runs_section,
    function_calling_section,
    guard_sweep_section,
    ir_hints_section,
    lookahead_section,
    predicted_outputs_section,
    rerank_choice_section,
    routing_levers_section,
    prompt_scoring_section,
    server_interleave_section,
    session_restore_section,
    server_completions_section,
    server_memory_section,
    server_section,
    session_copies_section,
    session_section,
)
from report_sections import (
    PAPER,
    blas_section,
    calibration_section,
    certified_head_section,
    curve_section,
    dkl_section,
    embedder_section,
    engine_section,
    fusion_section,
    gating_section,
    l0_section,
    masks_section,
    micro_section,
    niah_section,
    packed_section,
    qa_section,
    routing_section,
    sidecar_section,
    skinny_section,
    slb_section,
    ttft_section,
    weight_twins_section,
)

REPORT_NAME = "REPORT.md"
__all__ = ["BENCHES", "PAPER", "Bench", "NoResultsError", "fmt", "fmt_ci", "fmt_pct", "main",
           "render_report", "write_report"]


class NoResultsError(ValueError):
    """The results directory is missing or holds no result file; nothing was written."""


# ---- the benchmark list -------------------------------------------------------------------------
@dataclass(frozen=True)
class Bench:
    name: str  # results/<name>.json
    title: str
    group: str
    render: Callable[[dict[str, Any]], list[str]]
    command: str = ""  # default: python bench/<name>.py
    variants: bool = False  # also render results/<name>_*.json (e.g. repair_niah --out NAME)

    @property
    def run(self) -> str:
        return self.command or f"python bench/{self.name}.py"


P1, P2, ENG = "Paper 1: Nexus", "Paper 2: Semantic-Unit Refresh", "Engineering benchmarks"
AGENTS = "Agents: sessions, server, function calling"
BENCHES: tuple[Bench, ...] = (
    Bench("routing_accuracy", "Fig. 1: routing accuracy vs registry size", P1, routing_section),
    Bench("calibration", "Margin-gate calibration (tau, fire rate)", P1, calibration_section),
    Bench("rerank_fusion", "Reranker settings chosen on held-out queries (k, retrieval weight)",
          P1, fusion_section),
    Bench("gating_nogo", "Table II: reference-free drift gate (no-go)", P1, gating_section),
    Bench("deep_splice_ttft", "Table III: deep-splice time to first token", P1, ttft_section,
          variants=True),
    Bench("sidecar_accuracy", "Table IV: sidecar first-argument latency and accuracy", P1,
          sidecar_section, variants=True),
    Bench("dkl_sweep", "Fig. 5: bare-splice KL vs offset", P1, dkl_section, variants=True),
    Bench("curve_calibration", "Depth-adaptive curve calibrated per model", P1, curve_section,
          variants=True),
    Bench("repair_niah", "Tables 2-6: Erasing-NIAH by allocator and budget", P2, niah_section,
          variants=True),
    Bench("repair_qa", "Table 7: multi-hop QA after a deletion", P2, qa_section, variants=True),
    Bench("packed_refresh", "Table 8: packed vs sequential refresh", P2, packed_section),
    Bench("function_calling", "Function calling end to end (parsed-call scoring)", AGENTS,
          function_calling_section, variants=True),
    Bench("routing_levers", "Routing levers: tool text and BM25 fusion", AGENTS,
          routing_levers_section),
    Bench("rerank_choice", "Tool-choice reranker vs query likelihood (tuned on one set)",
          AGENTS, rerank_choice_section, command="python bench/rerank_choice.py",
          variants=True),
    Bench("ir_hints", "Compressed IR with per-argument format hints", AGENTS, ir_hints_section,
          variants=True),
    Bench("agent_session", "Live sessions: TTFT and fidelity by edit class", AGENTS,
          session_section, variants=True),
    Bench("session_copies", "Live sessions: cache copies from slices vs row gathers", AGENTS,
          session_copies_section, variants=True),
    Bench("lookahead", "Live sessions: copy drafts verified per pass", AGENTS,
          lookahead_section, variants=True),
    Bench("forced_runs", "Live sessions: forced ids fed in one pass", AGENTS,
          forced_runs_section, variants=True),
    Bench("predicted_outputs", "Live sessions: predicted outputs in code edits", AGENTS,
          predicted_outputs_section, variants=True),
    Bench("guard_sweep", "Close-call guard: thresholds replayed from one unguarded run", AGENTS,
          guard_sweep_section, variants=True,
          command="python bench/guard_sweep.py results/agent_session_RUN_t*_margins.json "
          "--tag RUN"),
    Bench("server", "Server over HTTP vs mlx_lm.server", AGENTS, server_section),
    Bench("server_memory", "Server memory over a long run: heap trims", AGENTS,
          server_memory_section, variants=True),
    Bench("prompt_scoring", "Completions API: scoring continuations of one context", AGENTS,
          prompt_scoring_section, variants=True),
    Bench("session_restore", "Server restarts: sessions restored from --session-dir", AGENTS,
          session_restore_section, variants=True),
    Bench("server_interleave", "Server: a short request during a long reply, interleaved",
          AGENTS, server_interleave_section, variants=True),
    Bench("server_completions", "Completions API over HTTP vs mlx_lm.server: an edited "
          "document", AGENTS, server_completions_section, variants=True),
    Bench("agent_run", "Agent loop on live MCP servers (multi-step requests)", AGENTS,
          agent_run_section, variants=True),
    Bench("blas", "BLAS: MLX CPU matmul vs numpy", ENG, blas_section),
    Bench("engine", "Engine: prefill and decode vs mlx-lm", ENG, engine_section,
          variants=True),
    Bench("certified_head", "Certified head: greedy ids without the full projection", ENG,
          certified_head_section, variants=True),
    Bench("skinny_gemm", "BLAS shim: few-row products, skinny kernel vs OpenBLAS", ENG,
          skinny_section, variants=True),
    Bench("weight_twins", "BLAS shim: decode reading weight twins vs float32 weights", ENG,
          weight_twins_section, variants=True),
    Bench("slb_latency", "SLB scan latency and INT8 recall", ENG, slb_section),
    Bench("l0_radix", "L0 radix arena: warm-prefix reuse", ENG, l0_section),
    Bench("embedder", "Embedder throughput", ENG, embedder_section),
    Bench("micro_masks", "Decode masks: tool-name FSM and JSON constraint", ENG, masks_section),
    Bench("micro", "Micro-benchmarks (pytest-benchmark)", ENG, micro_section,
          command="pytest bench/micro --benchmark-json=results/micro.json"),
)


# ---- assembling ---------------------------------------------------------------------------------
def _machine_line(d: dict[str, Any]) -> str:
    m = d.get("machine")
    if isinstance(m, dict):
        blas = m.get("blas")
        blas_text = (get(blas, "config") or "loaded") if get(blas, "loaded") else "not loaded"
        parts = [f"date {fmt(m.get('date'))}",
                 f"CPU {fmt(m.get('cpu'))} ({fmt(m.get('cores'))} cores)",
                 f"platform {fmt(m.get('platform'))}", f"Python {fmt(m.get('python'))}",
                 f"MLX {fmt(m.get('mlx'))}", f"mlx-lm {fmt(m.get('mlx_lm'))}",
                 f"numpy {fmt(m.get('numpy'))}", f"nexus-mlx {fmt(m.get('nexus_mlx'))}",
                 f"BLAS {cell(str(blas_text))}"]
    elif isinstance(d.get("machine_info"), dict):  # pytest-benchmark
        m = d["machine_info"]
        parts = [f"date {fmt(d.get('datetime'))}", f"CPU {fmt(get(m, 'cpu', 'brand_raw'))}",
                 f"platform {fmt(m.get('system'))} {fmt(m.get('release'))}",
                 f"Python {fmt(m.get('python_version'))}",
                 f"pytest-benchmark {fmt(d.get('version'))}"]
    else:
        parts = ["machine n/a"]
    model = d.get("model")
    if model is not None:
        parts.insert(0, f"model {fmt(model)}")
    if d.get("quick") is True:
        parts.append("**quick run**")
    return "Measured on: " + "; ".join(parts) + "."


def _load(path: Path) -> tuple[dict[str, Any] | None, str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if not isinstance(data, dict):
        return None, f"top level is a JSON {type(data).__name__}, expected an object"
    return data, ""


def _link(target: Path, report: Path) -> str:
    return Path(os.path.relpath(target.resolve(), report.resolve().parent)).as_posix()


def _section(bench: Bench, stem: str, path: Path, data: dict[str, Any], report: Path) -> list[str]:
    lines = [f"Source: `{path.name}` (`{bench.run}`).", "", _machine_line(data), ""]
    lines += bench.render(data)
    png = path.with_suffix(".png")
    if png.is_file():
        lines += [f"![{stem}]({_link(png, report)})", ""]
    return lines


def _owner(stem: str) -> Bench | None:
    for bench in BENCHES:
        if stem == bench.name or (bench.variants and stem.startswith(bench.name + "_")):
            return bench
    return None


def render_report(results_dir: str | os.PathLike[str] = "results",
                  out: str | os.PathLike[str] | None = None) -> str:
    """The report's markdown text (see the module docstring); nothing is written."""
    root = Path(results_dir)
    report = Path(out) if out is not None else root / REPORT_NAME
    files = sorted(root.glob("*.json")) if root.is_dir() else []
    loaded: dict[str, tuple[Path, dict[str, Any]]] = {}
    unreadable: list[tuple[str, str]] = []
    for path in files:
        data, error = _load(path)
        if data is None:
            unreadable.append((path.name, error))
        else:
            loaded[path.stem] = (path, data)

    lines = ["# nexus-mlx benchmark report", "",
             "Generated by `python -m report` from the full-run results in "
             f"`{root.as_posix()}/` (quick runs in `quick/` are not reported). Paper values are "
             "the papers' own (paper 1: Qwen2.5-14B Q4_K_M on an M4 Max); ours are measured on "
             "the default model (SmolLM2-135M) and the machine named in each section, so compare "
             "trends and orders of magnitude, not absolute numbers.", ""]
    present: set[str] = set()
    body: list[str] = []
    group = ""
    for bench in BENCHES:
        if bench.group != group:
            group = bench.group
            body += [f"## {group}", ""]
        body += [f"### {bench.title}", ""]
        if bench.name in PAPER:
            body += [f"> {PAPER[bench.name]}", ""]
        stems = sorted(s for s in loaded if _owner(s) is bench)
        if not stems:
            body += [f"_No result: run `{bench.run}`._", ""]
        for stem in stems:
            path, data = loaded.pop(stem)
            if len(stems) > 1 or stem != bench.name:
                body += [f"#### `{stem}`", ""]
            try:
                body += _section(bench, stem, path, data, report)
                if stem == bench.name:
                    present.add(stem)
            except Exception as exc:  # a malformed result must not stop the report
                unreadable.append((path.name, f"could not render: {type(exc).__name__}: {exc}"))
                body += [f"_Could not render `{path.name}` (see Unreadable)._", ""]

    body += ["## Other results", "",
             "Result files no section above covers (paper 2 Table 18 and any other table), "
             "top-level scalar fields only.", ""]
    if not loaded:
        body += ["_None._", ""]
    for stem in sorted(loaded):
        path, data = loaded[stem]
        body += [f"### `{stem}`", "", f"Source: `{path.name}`.", "", _machine_line(data), ""]
        body += table(["field", "value"], scalar_rows(data))

    missing = [b for b in BENCHES if b.name not in present]
    body += ["## Missing", ""]
    body += [f"- `{b.name}`: `{b.run}`" for b in missing] or ["_None: every expected result "
                                                                "is present._"]
    body += ["", "## Unreadable", ""]
    body += [f"- `{name}`: {cell(error)}" for name, error in sorted(unreadable)] or ["_None._"]
    contents = ["Contents: " + ", ".join(f"[{g}](#{_anchor(g)})" for g in (P1, P2, AGENTS, ENG))
                + ", [Other results](#other-results), [Missing](#missing), "
                "[Unreadable](#unreadable).", ""]
    return "\n".join(lines + contents + body) + "\n"


def _anchor(title: str) -> str:
    kept = "".join(ch for ch in title.lower() if ch.isalnum() or ch in " -")
    return kept.replace(" ", "-")


def write_report(results_dir: str | os.PathLike[str] = "results",
                 out: str | os.PathLike[str] | None = None) -> Path:
    """Write the report (default ``<results_dir>/REPORT.md``) and return its path; raise
    :class:`NoResultsError` (nothing written) when ``results_dir`` has no ``*.json``."""
    root = Path(results_dir)
    if not root.is_dir() or not any(root.glob("*.json")):
        what = "does not exist" if not root.is_dir() else "holds no result files (*.json)"
        raise NoResultsError(
            f"results directory {str(root)!r} {what} (looked from {os.getcwd()}); run a "
            "benchmark first, or pass the folder holding the results, e.g. "
            "python bench/report.py path/to/checkout/results")
    path = Path(out) if out is not None else root / REPORT_NAME
    text = render_report(results_dir, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("results_dir", nargs="?", default="results")
    parser.add_argument("--out", default=None, help="default: <results_dir>/REPORT.md")
    args = parser.parse_args(argv)
    try:
        print(write_report(args.results_dir, args.out))
    except NoResultsError as exc:
        print(f"report: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
