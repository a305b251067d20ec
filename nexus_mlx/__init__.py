"""nexus-mlx: KV-cache surgery and tool routing for agentic LLMs on MLX.

Importing this package first makes MLX's Linux CPU build use an optimized BLAS (see
``nexus_mlx._blas``); that must happen before ``mlx.core`` is loaded, so it is the first thing
done here.
"""

from nexus_mlx._blas import BLAS_STATUS  # noqa: I001  (must precede every mlx import)

__version__ = "0.1.0"
__all__ = ["BLAS_STATUS", "__version__"]
