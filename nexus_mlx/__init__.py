"""nexus-mlx: KV-cache surgery and tool routing for agentic LLMs on MLX.

Importing this package first makes MLX's Linux CPU build use an optimized BLAS (see
``nexus_mlx._blas``); that must happen before ``mlx.core`` is loaded, so it is the first thing
done here. Import ``nexus_mlx`` before ``mlx`` in programs that run on Linux CPUs. On CPU-only
builds it also raises MLX's buffer-cache limit (see ``nexus_mlx._cpu_cache``).
"""

from nexus_mlx._blas import BLAS_STATUS  # noqa: I001  (must precede every mlx import)

from nexus_mlx._cpu_cache import tune_cpu_buffer_cache
from nexus_mlx.decode.generate import Generation, chat, generate
from nexus_mlx.kv.cache import NexusCache
from nexus_mlx.kv.rope import RopeSpec, apply_rope, reanchor
from nexus_mlx.models.arch import model_plan
from nexus_mlx.models.forward import forward, make_cache
from nexus_mlx.models.load import load

CPU_CACHE_LIMIT = tune_cpu_buffer_cache()
__version__ = "0.1.0"
__all__ = [
    "BLAS_STATUS",
    "CPU_CACHE_LIMIT",
    "Generation",
    "NexusCache",
    "RopeSpec",
    "__version__",
    "apply_rope",
    "chat",
    "forward",
    "generate",
    "load",
    "make_cache",
    "model_plan",
    "reanchor",
]
