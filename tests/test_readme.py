"""Every ```python block of README.md runs, as written, on the default model.

Each block runs in a namespace of its own, seeded with the default model's ``model`` and
``tokenizer`` (the README's later examples reuse those of the first), in a scratch working
directory. A block may only be skipped by a visible marker line in the README,
``# needs: <pip package>``, and only when that package is not installed here.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
FENCE = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)
NEEDS = re.compile(r"^\s*# needs: *(.+?)\s*$", re.M)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """``(line number, source)`` of every fenced python block, in order."""
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in FENCE.finditer(text)]


def needs(source: str) -> list[str]:
    """The pip packages a block's ``# needs:`` markers name."""
    return [name.strip() for line in NEEDS.findall(source) for name in line.split(",")]


def installed(package: str) -> bool:
    """Whether the pip package is installed: by its distribution name (``openai-agents``
    imports as ``agents``), else by the module its name spells."""
    try:
        importlib.metadata.distribution(package)
        return True
    except importlib.metadata.PackageNotFoundError:
        return importlib.util.find_spec(package.replace("-", "_")) is not None


def missing(packages: list[str]) -> list[str]:
    return [p for p in packages if not installed(p)]


BLOCKS = python_blocks(README.read_text(encoding="utf-8"))


def test_the_extraction_sees_every_block_and_marker():
    text = "x\n```python\na = 1\n```\n```bash\nls\n```\n```python\n# needs: mcp-server-git\nb\n```\n"
    assert python_blocks(text) == [(2, "a = 1\n"), (8, "# needs: mcp-server-git\nb\n")]
    assert needs("# needs: mcp-server-git, nbformat\n") == ["mcp-server-git", "nbformat"]
    assert missing(["pytest", "nexus-surely-not-installed"]) == ["nexus-surely-not-installed"]
    assert len(BLOCKS) >= 4
    assert all("import nexus_mlx as nx" in source for _, source in BLOCKS)


def test_the_examples_use_only_the_flat_api():
    for line, source in BLOCKS:
        deep = re.findall(r"^\s*(?:from|import) nexus_mlx\.\S+", source, re.M)
        assert not deep, f"README.md:{line}: import from the flat API (nx.<name>): {deep}"


@pytest.mark.parametrize("line, source", BLOCKS, ids=[f"line{line}" for line, _ in BLOCKS])
def test_readme_block_runs(line, source, default_model, tmp_path, monkeypatch):
    absent = missing(needs(source))
    if absent:
        pytest.skip(f"README.md:{line} needs {absent} (marked '# needs:')")
    monkeypatch.chdir(tmp_path)  # blocks may write files (.atb blocks)
    monkeypatch.setenv("NEXUS_MLX_CACHE", str(tmp_path / "cache"))  # embedding cache, etc.
    # console scripts of this environment (the MCP servers) as a user with it active sees them
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    model, tokenizer = default_model
    namespace = {"__name__": f"readme_line{line}", "model": model, "tokenizer": tokenizer}
    exec(compile(source, f"README.md:{line}", "exec"), namespace)  # noqa: S102
