"""KV-cache storage (:mod:`.cache`, its argument checks :mod:`.checks`, mlx-lm conversion
:mod:`.interop`) and RoPE at arbitrary positions (:mod:`.rope`)."""

from nexus_mlx.kv.cache import NexusCache, WritePlan
from nexus_mlx.kv.rope import RopeSpec, apply_rope, reanchor

__all__ = ["NexusCache", "RopeSpec", "WritePlan", "apply_rope", "reanchor"]
