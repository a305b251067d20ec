"""Tool routing without the deep cache: sentence embedder (and, alongside it, the SLB, gate and IR).

This package re-exports the embedder's public names; it does not touch any LLM's KV cache.
"""

from nexus_mlx.routing.embedder import (
    BertConfig,
    Embedder,
    bert_encode,
    default_model_path,
    mean_pool_normalize,
)

__all__ = ["BertConfig", "Embedder", "bert_encode", "default_model_path", "mean_pool_normalize"]
