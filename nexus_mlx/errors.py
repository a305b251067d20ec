"""Every exception nexus-mlx raises on purpose: one module, one base class.

Contract: each class is named for what the caller did wrong, and every message names the
offending value and, where there is one, the fix. All derive from :class:`NexusError`; those a
caller could have checked first also derive from ``ValueError`` (server failures from
``RuntimeError``), so generic handlers keep working. Expected rejections (a token a grammar
refuses, a block that does not fit, a splice that declines) are return values, not exceptions;
``assert`` is kept for internal invariants only. This module imports nothing.
"""

from __future__ import annotations


class NexusError(Exception):
    """Base class of every error nexus-mlx raises on purpose."""


class ModelNotFoundError(NexusError, ValueError):
    """A model spec names nothing loadable: an unknown alias, a missing path, or a packaged
    model whose PyPI packages are not installed (the message names the pip command). This is
    the one error that means "not installed"."""


class ModelFormatError(NexusError, ValueError):
    """A model exists but cannot be used: its file is corrupt, truncated or inconsistent, or it
    uses an architecture, quantization or RoPE scaling the engine does not implement."""


class ModelMismatchError(NexusError, ValueError):
    """An artifact (a compiled block, an SLB file, a RoPE spec, a saved session) was made for
    another model or embedder; the message lists every differing field."""


class PositionError(NexusError, ValueError):
    """Token positions are negative, past the model's limit, or do not match the tokens."""


class CacheError(NexusError, ValueError):
    """A cache operation got an invalid range, row set or layout, or would need more rows than
    the cache may hold."""


class TokenError(NexusError, ValueError):
    """Token ids are empty, not integers, or outside the model's vocabulary; or a tokenizer
    cannot map them to text."""


class FormatError(NexusError, ValueError):
    """A file or serialized object nexus-mlx reads (an ``.atb`` block, a tool registry file,
    an SLB file) is malformed, truncated or internally inconsistent; the message names the
    field."""


class ToolError(NexusError, ValueError):
    """A tool definition or registry operation is invalid: a schema that is not valid JSON
    Schema or that the grammar cannot compile, a duplicate or unknown tool name, a call to a
    tool no server owns."""


class ArgumentError(NexusError, ValueError):
    """An argument value is outside what the operation accepts: a budget, a recompute curve,
    an allocator name, a k, an empty request, a command-line option."""


class ServerError(NexusError, RuntimeError):
    """An MCP server could not be started, timed out, or died while answering."""


class RunError(NexusError, RuntimeError):
    """An agent run stopped part-way on a failure that is not the model's choice (the model or
    the cache failed, the conversation outgrew the context). ``run`` holds what the run did up
    to then, the calls it executed and their results included; ``__cause__`` is the failure."""

    def __init__(self, message: str, run: object) -> None:
        super().__init__(message)
        self.run = run


class BuildError(NexusError, RuntimeError):
    """A native library (the BLAS shim, the INT8 scan) could not be compiled or loaded; callers
    fall back to a slower path and say so."""
