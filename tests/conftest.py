"""Shared fixtures. ``import nexus_mlx`` comes first so MLX loads with the fast BLAS."""

import nexus_mlx  # noqa: F401  (must precede mlx imports)
