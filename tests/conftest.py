"""Shared fixtures. ``import nexus_mlx`` comes first so MLX loads with the fast BLAS.

``bench/`` goes on ``sys.path`` so tests can import the benchmark helpers, the report and the
evaluation tasks (``report``, ``tasks.niah``...), which live outside the package.
"""

import sys
from pathlib import Path

import pytest  # noqa: E402

import nexus_mlx  # noqa: F401  (must precede mlx imports)

BENCH = Path(__file__).resolve().parent.parent / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))


@pytest.fixture(scope="session")
def default_model():
    """The embedded default model (SmolLM2-135M-Instruct, float32 on CPU), loaded once."""
    return nexus_mlx.load("default")
