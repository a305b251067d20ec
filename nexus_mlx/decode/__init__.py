"""Decoding: the sampling loop over the engine (:mod:`.generate`)."""

from nexus_mlx.decode.generate import (
    Generation,
    GenerationStats,
    chat,
    generate,
    generate_tokens,
    greedy_continuation,
)

__all__ = ["Generation", "GenerationStats", "chat", "generate", "generate_tokens",
           "greedy_continuation"]
