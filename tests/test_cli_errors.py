"""The command line on hostile input: every user error is one line naming the value, exit status
2, no traceback unless ``--debug`` (accepted before or after the subcommand), and arguments are
checked before any model loads (``--model /nope.gguf`` would fail first otherwise). Also the
honest-output fixes: empty requests refused, splice-demo depths built as asked and timed as
medians, the report refusing an empty results folder, the gate label, the demo's call record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from nexus_mlx.cli import commands
from nexus_mlx.cli.main import main
from nexus_mlx.errors import ArgumentError

ROOT = Path(__file__).resolve().parent.parent
NOPE = "/nope/missing-model.gguf"  # loading it would fail: seeing another error proves the order
TOOLS = [{"name": "get_weather", "description": "Weather for a city",
          "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}}},
         {"name": "get_time", "description": "Time in a timezone",
          "inputSchema": {"type": "object", "properties": {"tz": {"type": "string"}}}}]


@pytest.fixture()
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "tools.json").write_text(json.dumps(TOOLS))
    (tmp_path / "a_file").write_text("not a directory\n")
    (tmp_path / "empty_results").mkdir()
    return tmp_path


def _cli(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nexus_mlx.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


HOSTILE = {  # id: (argv with {tmp} for the work folder, a fragment the one error line must hold)
    "compile-out-is-a-file": (["compile", "--model", NOPE, "--tools", "{tmp}/tools.json",
                               "--out", "{tmp}/a_file"], "is an existing file"),
    "compile-out-under-a-file": (["compile", "--model", NOPE, "--tools", "{tmp}/tools.json",
                                  "--out", "{tmp}/a_file/blocks"], "is a file"),
    "compile-out-uncreatable": (["compile", "--model", NOPE, "--tools", "{tmp}/tools.json",
                                 "--out", "/proc/nexus-mlx-nope/blocks"], "cannot create"),
    "compile-tools-unterminated": (["compile", "--model", NOPE, "--tools", "'unterminated",
                                    "--out", "{tmp}/atb"], "not a valid command line"),
    "compile-tools-missing-file": (["compile", "--model", NOPE, "--tools", "missing.json",
                                    "--out", "{tmp}/atb"], "'missing.json': no such file"),
    "route-empty": (["route", "", "--model", NOPE, "--tools", "{tmp}/tools.json"],
                    "the request is empty"),
    "route-whitespace": (["route", "  \t ", "--model", NOPE, "--tools", "{tmp}/tools.json"],
                         "the request is empty"),
    "route-tools-missing-file": (["route", "hi", "--model", NOPE, "--tools", "missing.jsonl"],
                                 "no such file"),
    "route-k-zero": (["route", "hi", "--model", NOPE, "--tools", "{tmp}/tools.json", "-k", "0"],
                     "-k must be a positive integer, got 0"),
    "chat-empty": (["chat", " ", "--model", NOPE], "the prompt is empty"),
    "chat-max-tokens": (["chat", "hi", "--model", NOPE, "--max-tokens", "0"], "--max-tokens"),
    "splice-negative-depth": (["splice-demo", "--model", NOPE, "--depths", "0", "-5"], "[-5]"),
    "splice-bad-K": (["splice-demo", "--model", NOPE, "-K", "1"], "K must be > 1"),
    "splice-repeats": (["splice-demo", "--model", NOPE, "--repeats", "0"], "--repeats"),
    "splice-too-deep": (["splice-demo", "--depths", "256", "9000"],
                        "[9000]: model 'default' holds 8192 positions"),
    "repair-budget": (["repair-demo", "--model", NOPE, "--budget", "150"], "--budget"),
    "repair-allocator": (["repair-demo", "--model", NOPE, "--allocator", "nope"],
                         "unknown allocator 'nope'"),
    "demo-extra-tools-missing": (["demo", "--model", NOPE, "--extra-tools", "missing.json"],
                                 "'missing.json': no such file"),
    "report-no-results-folder": (["report", "--results", "{tmp}/nowhere"], "no such directory"),
    "report-empty-results": (["report", "--results", "{tmp}/empty_results"], "no result files"),
    "report-default-elsewhere": (["report"],
                                 "'results': no such directory (from {tmp}); pass --results "),
    "bench-unknown": (["bench", "../../etc/passwd"], "unknown benchmark"),
    "serve-negative-guard": (["serve", "--model", NOPE, "--port", "0", "--guard", "-1"],
                             "--guard must be a number of nats >= 0, got -1"),
    "chat-negative-drafts": (["chat", "hi", "--model", NOPE, "--draft-tokens", "-1"],
                             "--draft-tokens must be an integer >= 0, got -1"),
    "serve-negative-drafts": (["serve", "--model", NOPE, "--port", "0", "--draft-tokens", "-2"],
                              "--draft-tokens must be an integer >= 0, got -2"),
    "serve-bad-trim-heap": (["serve", "--model", NOPE, "--port", "0", "--trim-heap", "soon"],
                            "--trim-heap must be a number of seconds >= 0 or 'off', got 'soon'"),
    "serve-bad-idle-release": (["serve", "--model", NOPE, "--port", "0", "--idle-release", "-5"],
                               "--idle-release must be a number of seconds >= 0 or 'off', got "
                               "'-5'"),
    "serve-session-dir-is-a-file": (["serve", "--model", NOPE, "--port", "0", "--session-dir",
                                     "{tmp}/a_file"], "--session-dir '{tmp}/a_file' is an existing "
                                    "file"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_input_is_one_line_exit_2_without_traceback(case: str, workdir: Path):
    argv, fragment = HOSTILE[case]
    fragment = fragment.replace("{tmp}", str(workdir))
    out = _cli([a.replace("{tmp}", str(workdir)) for a in argv], cwd=workdir)
    assert "Traceback" not in out.stderr, out.stderr
    assert out.returncode == 2, (out.returncode, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nexus-mlx: error: "), out.stderr
    assert fragment in lines[0], lines[0]
    assert "missing-model" not in lines[0]  # the arguments were checked before the model
    assert not (workdir / "results").exists()  # report never wrote a report of nothing


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="flock-locked directories")
def test_serve_refuses_a_session_dir_another_server_holds_before_loading_the_model(
        workdir: Path):
    from nexus_mlx.server.session_store import SessionStore

    held = SessionStore(workdir / "sessions")  # another server's, in this process
    try:
        out = _cli(["serve", "--model", NOPE, "--port", "0", "--session-dir",
                    str(workdir / "sessions")], cwd=workdir)
    finally:
        held.close()
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert "is in use by another nexus-mlx server" in lines[0] and "missing-model" not in lines[0]


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_is_accepted_anywhere_and_shows_the_traceback(where: str, workdir: Path, capsys):
    argv = ["compile", "--tools", "missing.json", "--out", str(workdir / "atb")]
    argv = ["--debug", *argv] if where == "before" else [*argv, "--debug"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "nexus-mlx: error: --tools 'missing.json': no such file" in err


def test_without_debug_there_is_no_traceback(workdir: Path, capsys):
    assert main(["compile", "--tools", "missing.json", "--out", str(workdir / "atb")]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_an_unexpected_error_is_one_internal_error_line(monkeypatch, capsys):
    def broken(args: object) -> int:
        raise RuntimeError("something\nbroke")

    monkeypatch.setattr(commands, "cmd_bench", broken)
    assert main(["bench", "blas"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error: RuntimeError: something broke" in err
    assert main(["bench", "blas", "--debug"]) == 1
    assert "Traceback" in capsys.readouterr().err


def test_an_os_error_is_a_user_error(monkeypatch, capsys):
    def unreadable(args: object) -> int:
        raise PermissionError(13, "Permission denied", "/some/file")

    monkeypatch.setattr(commands, "cmd_bench", unreadable)
    assert main(["bench", "blas"]) == 2
    err = capsys.readouterr().err
    assert err == "nexus-mlx: error: Permission denied '/some/file'; check the path and its " \
                  "permissions\n"


# ---- the router refuses an empty request --------------------------------------------------
class _HashEmbedder:
    def embed(self, texts, *, kind="document"):
        rows = [np.random.default_rng(abs(hash(t)) % 2**32).standard_normal(16) for t in texts]
        arr = np.asarray(rows, np.float32).reshape(len(texts), 16)
        return arr / np.linalg.norm(arr, axis=1, keepdims=True)


def test_router_refuses_an_empty_request():
    from nexus_mlx.routing.gate import MarginGate
    from nexus_mlx.routing.router import Router
    from nexus_mlx.routing.slb import SemanticLookasideBuffer
    from nexus_mlx.tools.registry import ToolRegistry
    from nexus_mlx.tools.tool import Tool

    registry = ToolRegistry([Tool.from_dict(t) for t in TOOLS])
    embedder = _HashEmbedder()
    slb = SemanticLookasideBuffer.from_registry(registry, embedder, embedder_id="hash")
    router = Router(registry, embedder, slb, MarginGate(0.0))
    for empty in ("", "   ", "\n\t"):
        with pytest.raises(ArgumentError, match="request is empty"):
            router.route(empty)
    assert router.route("weather in Paris").chosen in registry.names()


# ---- splice-demo: the asked depth, medians ------------------------------------------------
def test_splice_history_is_built_to_the_asked_depth(default_model):
    _, tokenizer = default_model
    for n in (0, 1, 255, 2202, 5000):
        assert len(commands.history_tokens(tokenizer, n)) == n


def test_splice_depth_limit_leaves_room_for_block_and_query(default_model):
    model, tokenizer = default_model
    deepest = commands.max_splice_depth(model, tokenizer)
    block = len(tokenizer.encode(commands.SPLICE_SCHEMA))
    assert deepest is not None and 0 < deepest == 8192 - block - len(
        tokenizer.encode(commands.SPLICE_QUERY))


def test_median_seconds_warms_up_and_takes_the_median():
    calls: list[int] = []
    out, seconds = commands.median_seconds(lambda x: calls.append(x) or x, lambda: len(calls), 3)
    assert calls == [0, 1, 2, 3] and out == 3 and seconds >= 0  # 1 warm-up + 3 timed runs


def test_splice_demo_labels_rows_by_the_measured_depth(capsys):
    assert main(["splice-demo", "--depths", "0", "40", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    assert "medians of 2 timed runs after 1 warm-up" in out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [r[0] for r in rows] == ["0", "40"]


# ---- report refuses an empty or absent results folder -------------------------------------
def test_report_script_refuses_without_results(tmp_path: Path):
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "report.py")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith("report: error: results directory 'results' does not exist")
    assert not (tmp_path / "results").exists()


def test_write_report_refuses_a_folder_without_results(tmp_path: Path):
    from report import NoResultsError, write_report

    (tmp_path / "results").mkdir()
    with pytest.raises(NoResultsError, match="holds no result files"):
        write_report(tmp_path / "results")
    assert list((tmp_path / "results").iterdir()) == []
    (tmp_path / "results" / "blas.json").write_text(json.dumps({"name": "blas"}))
    assert write_report(tmp_path / "results").is_file()


# ---- the gate says what its fire rate measured --------------------------------------------
def _calibrated():
    from nexus_mlx.routing.gate import calibrate
    from nexus_mlx.routing.slb import SemanticLookasideBuffer

    rng = np.random.default_rng(0)
    base = rng.standard_normal((20, 16)).astype(np.float32)
    vectors = np.concatenate([base, base + 0.05 * rng.standard_normal((20, 16))]).astype(
        np.float32)  # near-duplicate pairs: adversarial queries exist
    slb = SemanticLookasideBuffer(16, "test")
    slb.add([f"tool_{i}" for i in range(40)], vectors)
    return slb, calibrate


def test_gate_label_names_the_calibration_queries():
    slb, calibrate = _calibrated()
    cal = calibrate(slb)
    label = cal.describe()
    fired = round(cal.fire_rate * 40)
    assert f"calibration-set fire rate {cal.fire_rate:.0%}: {fired} of the registry's 40 own " \
           "tool texts, embedded as stand-in queries" in label
    assert "not the rate on real requests" in label and f"tau {cal.tau:.4f}" in label
    queries = np.random.default_rng(1).standard_normal((7, 16)).astype(np.float32)
    held = calibrate(slb, queries, query_source="7 held-out requests").describe()
    assert "on the 7 calibration queries (7 held-out requests)" in held


def test_calibration_files_without_a_query_source_still_load(tmp_path: Path):
    from nexus_mlx.routing.gate import TOOL_TEXTS, Calibration

    slb, calibrate = _calibrated()
    record = json.loads(json.dumps(calibrate(slb).__dict__))
    del record["query_source"]  # a file written before the field existed
    (tmp_path / "cal.json").write_text(json.dumps(record))
    assert Calibration.load(tmp_path / "cal.json").query_source == TOOL_TEXTS


# ---- the demo says what each server did with the calls ------------------------------------
def test_demo_answer_records_the_servers_refusal():
    from nexus_mlx.agent.mcp_server import McpCallResult
    from nexus_mlx.cli.demo import _answer
    from nexus_mlx.tools.tool import Tool

    call = SimpleNamespace(name="time.get_current_time", arguments={"timezone": "UTC-Z"},
                           valid=True, errors=())
    turn = SimpleNamespace(
        route=SimpleNamespace(candidates=[("time.get_current_time", 0.4)], escalated=False,
                              margin=0.2, tau=0.1),
        call=call, timings={"route": 0.01, "arguments": 0.02}, prompt_tokens=10)
    agent = SimpleNamespace(
        turn=lambda messages: turn,
        registry=SimpleNamespace(get=lambda name: Tool("get_current_time")),
        execute=lambda t: McpCallResult("Invalid timezone: 'UTC-Z'", is_error=True))
    said: list[str] = []
    outcome = _answer(agent, "What time is it?", {"time.get_current_time"}, said.append)
    assert any("server refused: Invalid timezone" in line for line in said)
    assert (outcome.server, outcome.status) == ("time", "refused")
    assert outcome.detail == "Invalid timezone: 'UTC-Z'"


def test_demo_summary_lists_accepted_refused_and_unsent_calls():
    from nexus_mlx.cli.demo import CallOutcome, outcome_summary

    outcomes = [
        CallOutcome("q1", "time", 'time.get_current_time({"timezone": "Asia/Tokyo"})', "accepted",
                    "{...}"),
        CallOutcome("q2", "time", 'time.convert_time({"time": "x"})', "refused",
                    "Invalid timezone: 'No time zone found with key 14:30'"),
        CallOutcome("q3", "", "git.git_commit({})", "not sent", "not executed: not read-only"),
    ]
    text = "\n".join(outcome_summary(outcomes, ["git", "time"]))
    assert "  git: accepted 0, refused 0" in text and "  time: accepted 1, refused 1" in text
    assert "refused  time.convert_time" in text and "No time zone found with key 14:30" in text
    assert "not sent: 1" in text and "1 of 3 calls accepted" in text
    refused = [CallOutcome("q", "time", "t()", "refused", "bad")]
    assert "no call succeeded" in outcome_summary(refused, ["time"])[-1]


def test_router_reports_its_stages():
    from nexus_mlx.routing.gate import MarginGate
    from nexus_mlx.routing.router import Router
    from nexus_mlx.routing.slb import SemanticLookasideBuffer
    from nexus_mlx.tools.registry import ToolRegistry
    from nexus_mlx.tools.tool import Tool

    class Reverse:
        def rerank(self, query, tools, retrieval_scores=None):
            return [(t.qualified_name, float(i)) for i, t in enumerate(tools)][::-1]

    registry = ToolRegistry([Tool.from_dict(t) for t in TOOLS])
    embedder = _HashEmbedder()
    slb = SemanticLookasideBuffer.from_registry(registry, embedder, embedder_id="hash")
    stages: list[str] = []
    Router(registry, embedder, slb, MarginGate(10.0), Reverse()).route("x", on_stage=stages.append)
    assert stages == ["embedding the request and scanning the SLB",
                      "gate fired: reranking 2 candidates"]
