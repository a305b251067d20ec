"""Private platform floor: what makes MLX fast and native code buildable on this machine.

- :mod:`.blas`: on Linux, route MLX's CPU matmuls to an optimized BLAS (must run before
  ``mlx.core`` is imported; ``import nexus_mlx`` does it first).
- :mod:`.cpu_cache`: raise MLX's CPU buffer-cache limit on CPU-only builds.
- :mod:`.cbuild`: compile the C sources in ``csrc/`` into the user cache, keyed by their hash.
- :mod:`.mlx_thread`: one thread for the MLX work of objects that several threads share.
- :mod:`.heap`: give the C heap's free pages back to the OS (glibc's ``malloc_trim``).
- :mod:`.atomic_file`: replace a JSON file so that no reader sees half of it.

It imports only :mod:`nexus_mlx.errors` and knows nothing of models, caches or tools.
"""
