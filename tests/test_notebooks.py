"""Execute every notebook in ``notebooks/`` headless (nbclient, the ``python3`` kernel of this
interpreter) and fail on any cell error. Slow: each loads a real model (about a minute each on
a busy 2-core machine). Skipped when nbformat, nbclient or ipykernel are not installed, or when
the default model, the embedder or the shared data are absent."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from nexus_mlx.errors import ModelNotFoundError

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
TIMEOUT_S = 600  # per cell


def _require_embedder(stem: str) -> None:
    if stem == "routing_scaling":
        from nexus_mlx.routing.embedder import default_model_path

        try:
            default_model_path()
        except ModelNotFoundError as exc:
            pytest.skip(f"embedder not installed: {exc}")


def test_notebooks_match_their_builder_and_carry_no_outputs():
    spec = importlib.util.spec_from_file_location("build_notebooks",
                                                  ROOT / "notebooks" / "build_notebooks.py")
    assert spec is not None and spec.loader is not None
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    assert [p.stem for p in NOTEBOOKS] == sorted(builder.NOTEBOOKS)
    for path in NOTEBOOKS:
        nb = json.loads(path.read_text())
        assert nb == builder.notebook(path.stem, builder.NOTEBOOKS[path.stem]), (
            f"{path.name} is stale: run python notebooks/build_notebooks.py")
        code = [c for c in nb["cells"] if c["cell_type"] == "code"]
        assert all(c["outputs"] == [] and c["execution_count"] is None for c in code)
        assert code[0]["source"][0].startswith("import nexus_mlx")


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_without_errors(path: Path, monkeypatch, default_tokenizer, shared_data):
    """Needs the default model (``default_tokenizer`` skips if it is not installed) and the
    shared data; the routing notebook also needs the embedder."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    _require_embedder(path.stem)
    # The kernel spec runs ``python``: make that this interpreter (the project's venv).
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    nb = nbformat.read(path, as_version=4)
    assert all(not cell.get("outputs") for cell in nb.cells if cell.cell_type == "code")
    client = nbclient.NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()  # raises CellExecutionError on the first failing cell
    errors = [out for cell in nb.cells if cell.cell_type == "code"
              for out in cell.get("outputs", []) if out.get("output_type") == "error"]
    assert errors == []
