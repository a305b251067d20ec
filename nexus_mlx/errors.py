"""Exception hierarchy of nexus-mlx.

Every caller error raises a subclass of :class:`NexusError` whose message names the offending
value. Expected rejections (a token a grammar refuses, a block that does not fit) are return
values, not exceptions; ``assert`` is kept for internal invariants only.
"""

from __future__ import annotations


class NexusError(Exception):
    """Base class of every error nexus-mlx raises on purpose."""


class ModelSpecError(NexusError, ValueError):
    """A model spec names nothing loadable (unknown alias, missing path, missing package)."""


class ModelFileError(NexusError, ValueError):
    """A model file or directory exists but is corrupt, truncated or inconsistent."""


class UnsupportedArchitectureError(NexusError, ValueError):
    """The model's architecture is not one the engine implements."""


class UnsupportedQuantizationError(NexusError, ValueError):
    """A tensor uses a quantization type nexus-mlx cannot load."""


class UnsupportedRopeError(NexusError, ValueError):
    """The RoPE scaling cannot be evaluated at explicit positions (e.g. dynamic NTK)."""


class RopeMismatchError(NexusError, ValueError):
    """Two RoPE specs (or model fingerprints) differ; the message lists every field."""


class PositionError(NexusError, ValueError):
    """Token positions are negative, too large, or do not match the tokens."""


class CacheError(NexusError, ValueError):
    """A cache operation got an invalid range, row set or layout request."""


class CacheOverflowError(CacheError):
    """A write would need more rows than the cache may hold."""


class TokenError(NexusError, ValueError):
    """Token ids are empty, not integers, or outside the model's vocabulary."""


class BlockFormatError(NexusError, ValueError):
    """A compiled KV block (``.atb`` file or in-memory block) is malformed, truncated or
    internally inconsistent; the message names the offending field and values."""


class BlockMismatchError(NexusError, ValueError):
    """A compiled KV block was made by another model (architecture, shapes, weights or RoPE);
    the message lists every differing field."""
