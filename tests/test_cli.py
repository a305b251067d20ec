"""The nexus-mlx command line: every subcommand has help, errors are one line with exit 2, and
the cheap subcommands run for real on the default model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from nexus_mlx.cli.main import build_parser, main

SUBCOMMANDS = ("chat", "demo", "compile", "route", "splice-demo", "repair-demo", "serve", "bench",
               "report")


def test_help_lists_every_subcommand():
    text = build_parser().format_help()
    for name in SUBCOMMANDS:
        assert name in text


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_each_subcommand_has_help(name, capsys):
    with pytest.raises(SystemExit) as info:
        main([name, "--help"])
    assert info.value.code == 0
    assert "usage: nexus-mlx" in capsys.readouterr().out


def test_errors_are_one_line_without_traceback():
    out = subprocess.run([sys.executable, "-m", "nexus_mlx.cli.main", "chat", "--model", "/nope.gguf", "hi"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.startswith("nexus-mlx: error: model spec '/nope.gguf'")
    assert "Traceback" not in out.stderr


def test_unknown_benchmark_lists_the_available_ones(capsys):
    assert main(["bench", "no-such-bench"]) == 2
    err = capsys.readouterr().err
    assert "unknown benchmark 'no-such-bench'" in err and "blas" in err


def test_compile_writes_blocks(tmp_path, capsys):
    tools = [{"name": "get_weather", "description": "Weather for a city",
              "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}}},
             {"name": "get_time", "description": "Time in a timezone",
              "inputSchema": {"type": "object", "properties": {"tz": {"type": "string"}}}}]
    registry = tmp_path / "tools.json"
    registry.write_text(json.dumps(tools))
    assert main(["compile", "--tools", str(registry), "--out", str(tmp_path / "atb")]) == 0
    assert sorted(p.name for p in (tmp_path / "atb").iterdir()) == ["get_time.atb", "get_weather.atb"]
    assert main(["compile", "--tools", str(registry), "--out", str(tmp_path / "atb")]) == 0
    assert "0 blocks written, 2 up to date" in capsys.readouterr().out


def test_route_shows_progress_and_reuses_the_embedding_cache(tmp_path):
    tools = [{"name": "get_weather", "description": "Weather for a city",
              "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}}},
             {"name": "get_time", "description": "Time in a timezone",
              "inputSchema": {"type": "object", "properties": {"tz": {"type": "string"}}}}]
    registry = tmp_path / "tools.json"
    registry.write_text(json.dumps(tools))
    env = {**os.environ, "NEXUS_MLX_CACHE": str(tmp_path / "cache")}
    argv = [sys.executable, "-m", "nexus_mlx.cli", "route", "What is the weather in Paris?",
            "--tools", str(registry), "-k", "1", "--max-tokens", "6"]  # k 1: no reranking
    runs = [subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
            for _ in range(2)]
    for run in runs:
        assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
        assert "route: loading model 'default'" in run.stderr  # the stage bar, on stderr
        assert "route: generating arguments for" in run.stderr
        assert "gate: " in run.stdout and "route:" not in run.stdout
    assert "2 tools embedded (cache miss)" in runs[0].stdout
    assert "2 tools read from the embedding cache" in runs[1].stdout
    assert len(list((tmp_path / "cache" / "embeddings").glob("*.npz"))) == 1
