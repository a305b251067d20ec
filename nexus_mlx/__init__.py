"""nexus-mlx: KV-cache surgery and tool routing for agentic LLMs on MLX.

The public API is flat and lazily loaded: ``import nexus_mlx as nx`` costs only the platform
set-up below, and ``nx.splice`` imports the splice machinery on first use.

Importing this package first makes MLX's Linux CPU build use an optimized BLAS (see
``nexus_mlx._platform.blas``); that must happen before ``mlx.core`` is loaded, so it is the
first thing done here. Import ``nexus_mlx`` before ``mlx`` in programs that run on Linux CPUs.
On CPU-only builds it also raises MLX's buffer-cache limit (``nexus_mlx._platform.cpu_cache``).

Floors (each imports only the floors below it; ``tests/test_architecture.py`` checks it):
``errors``, ``metrics``, ``_platform`` < ``kv`` < ``kernels`` < ``models`` < ``tools``, ``sur``
< ``blocks``, ``refresh``, ``decode`` < ``routing`` < ``agent`` < ``server`` < ``cli``.
"""

from nexus_mlx._platform.blas import BLAS_STATUS  # noqa: I001  (must precede every mlx import)

import importlib
from typing import TYPE_CHECKING, Any

from nexus_mlx._platform.cpu_cache import tune_cpu_buffer_cache

CPU_CACHE_LIMIT = tune_cpu_buffer_cache()
__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    # models and the engine
    "load": "nexus_mlx.models.load",
    "forward": "nexus_mlx.models.forward",
    "make_cache": "nexus_mlx.models.forward",
    "model_plan": "nexus_mlx.models.arch",
    "model_fingerprint": "nexus_mlx.models.fingerprint",
    "convert_model": "nexus_mlx.models.convert",
    "save_mlx_lm": "nexus_mlx.models.convert",
    # the cache and RoPE
    "NexusCache": "nexus_mlx.kv.cache",
    "RopeSpec": "nexus_mlx.kv.rope",
    "apply_rope": "nexus_mlx.kv.rope",
    "reanchor": "nexus_mlx.kv.rope",
    # decoding
    "generate": "nexus_mlx.decode.generate",
    "chat": "nexus_mlx.decode.generate",
    "Generation": "nexus_mlx.decode.generate",
    "generate_tool_call": "nexus_mlx.decode.tool_call",
    # metrics
    "next_token_kl": "nexus_mlx.metrics",
    "top1_agreement": "nexus_mlx.metrics",
    # compiled blocks and splicing (paper 1)
    "CompiledBlock": "nexus_mlx.blocks.block",
    "compile_block": "nexus_mlx.blocks.compile",
    "compile_directory": "nexus_mlx.blocks.compile",
    "read_block": "nexus_mlx.blocks.atb",
    "write_block": "nexus_mlx.blocks.atb",
    "splice": "nexus_mlx.blocks.splicing",
    "Curve": "nexus_mlx.blocks.curve",
    "curve_for": "nexus_mlx.blocks.curve_table",
    # budgeted repair (paper 2)
    "repair": "nexus_mlx.refresh.budgeted",
    "RepairResult": "nexus_mlx.refresh.budgeted",
    "Edit": "nexus_mlx.refresh.edit",
    # tools
    "Tool": "nexus_mlx.tools.tool",
    "ToolRegistry": "nexus_mlx.tools.registry",
    "load_tools": "nexus_mlx.tools.registry",
    "tool_signature": "nexus_mlx.tools.ir",
    "IROptions": "nexus_mlx.tools.ir",
    # routing
    "Embedder": "nexus_mlx.routing.embedder",
    "SemanticLookasideBuffer": "nexus_mlx.routing.slb",
    "Router": "nexus_mlx.routing.router",
    "build_router": "nexus_mlx.routing.router",
    # agents
    "Agent": "nexus_mlx.agent.orchestrator",
    "ApprovalPolicy": "nexus_mlx.agent.approval",
    "READ_ONLY": "nexus_mlx.agent.approval",
    "McpServer": "nexus_mlx.agent.mcp_server",
    "ServerSpec": "nexus_mlx.agent.mcp_server",
    "RadixArena": "nexus_mlx.agent.radix_arena",
    "Session": "nexus_mlx.agent.session",
    "DEFAULT_GUARD": "nexus_mlx.agent.session",
    "StepReport": "nexus_mlx.agent.session",
    "ToolBlocks": "nexus_mlx.agent.tool_blocks",
    "save_session": "nexus_mlx.agent.session_file",
    "load_session": "nexus_mlx.agent.session_file",
    # the OpenAI-compatible server
    "Server": "nexus_mlx.server.runner",
    "serve": "nexus_mlx.server.runner",
    # errors
    "NexusError": "nexus_mlx.errors",
    "ModelNotFoundError": "nexus_mlx.errors",
    "ModelFormatError": "nexus_mlx.errors",
    "ModelMismatchError": "nexus_mlx.errors",
    "PositionError": "nexus_mlx.errors",
    "CacheError": "nexus_mlx.errors",
    "TokenError": "nexus_mlx.errors",
    "FormatError": "nexus_mlx.errors",
    "ToolError": "nexus_mlx.errors",
    "ArgumentError": "nexus_mlx.errors",
    "ServerError": "nexus_mlx.errors",
    "RunError": "nexus_mlx.errors",
    "BuildError": "nexus_mlx.errors",
}

__all__ = ["BLAS_STATUS", "CPU_CACHE_LIMIT", "__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'nexus_mlx' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:  # the same names, for type checkers and IDEs
    from nexus_mlx.agent.approval import READ_ONLY, ApprovalPolicy
    from nexus_mlx.agent.mcp_server import McpServer, ServerSpec
    from nexus_mlx.agent.orchestrator import Agent
    from nexus_mlx.agent.radix_arena import RadixArena
    from nexus_mlx.agent.session import DEFAULT_GUARD, Session, StepReport
    from nexus_mlx.agent.session_file import load_session, save_session
    from nexus_mlx.agent.tool_blocks import ToolBlocks
    from nexus_mlx.blocks.atb import read_block, write_block
    from nexus_mlx.blocks.block import CompiledBlock
    from nexus_mlx.blocks.compile import compile_block, compile_directory
    from nexus_mlx.blocks.curve import Curve
    from nexus_mlx.blocks.curve_table import curve_for
    from nexus_mlx.blocks.splicing import splice
    from nexus_mlx.decode.generate import Generation, chat, generate
    from nexus_mlx.decode.tool_call import generate_tool_call
    from nexus_mlx.errors import (
        ArgumentError,
        BuildError,
        CacheError,
        FormatError,
        ModelFormatError,
        ModelMismatchError,
        ModelNotFoundError,
        NexusError,
        PositionError,
        RunError,
        ServerError,
        TokenError,
        ToolError,
    )
    from nexus_mlx.kv.cache import NexusCache
    from nexus_mlx.kv.rope import RopeSpec, apply_rope, reanchor
    from nexus_mlx.metrics import next_token_kl, top1_agreement
    from nexus_mlx.models.arch import model_plan
    from nexus_mlx.models.convert import convert_model, save_mlx_lm
    from nexus_mlx.models.fingerprint import model_fingerprint
    from nexus_mlx.models.forward import forward, make_cache
    from nexus_mlx.models.load import load
    from nexus_mlx.refresh.budgeted import RepairResult, repair
    from nexus_mlx.refresh.edit import Edit
    from nexus_mlx.routing.embedder import Embedder
    from nexus_mlx.routing.router import Router, build_router
    from nexus_mlx.routing.slb import SemanticLookasideBuffer
    from nexus_mlx.server.runner import Server, serve
    from nexus_mlx.tools.ir import IROptions, tool_signature
    from nexus_mlx.tools.registry import ToolRegistry, load_tools
    from nexus_mlx.tools.tool import Tool
