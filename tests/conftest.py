"""Shared fixtures. ``import nexus_mlx`` comes first so MLX loads with the fast BLAS."""

import pytest  # noqa: E402

import nexus_mlx  # noqa: F401  (must precede mlx imports)


@pytest.fixture(scope="session")
def default_model():
    """The embedded default model (SmolLM2-135M-Instruct, float32 on CPU), loaded once."""
    return nexus_mlx.load("default")
