"""How to start one stdio MCP server: :class:`ServerSpec`, checked when it is made.

Contract: ``ServerSpec(command, args, env, cwd, namespace, start_timeout, call_timeout)`` holds
the fields of an ``mcpServers`` config entry, checked (a non-empty command, string args, string
env pairs stored sorted, a valid namespace, positive finite timeouts) or a
:class:`~nexus_mlx.errors.ServerError` naming the field; ``from_dict`` ignores unknown keys.
``installed_server(script, module, ...)`` is the spec of a server installed in this Python
environment. It starts nothing (:mod:`.mcp_server` does).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from nexus_mlx.errors import ServerError
from nexus_mlx.tools.tool import check_namespace


def check_timeout(name: str, value: Any) -> float:
    """``value`` as a positive finite number of seconds, or a ServerError naming ``name``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ServerError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


def _env_pairs(env: Any) -> tuple[tuple[str, str], ...]:
    """Extra environment variables as sorted ``(name, value)`` string pairs."""
    items = env.items() if isinstance(env, Mapping) else (env or ())
    try:
        pairs = [(k, v) for k, v in items]
    except (TypeError, ValueError):
        raise ServerError(f"server env must map names to values, got {env!r}") from None
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in pairs):
        raise ServerError(f"server env names and values must be strings, got {env!r}")
    return tuple(sorted(pairs))


@dataclass(frozen=True)
class ServerSpec:
    """How to start one stdio MCP server (the fields of an ``mcpServers`` config entry)."""

    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] | Sequence[tuple[str, str]] = ()
    cwd: str | None = None
    namespace: str | None = None
    start_timeout: float = 30.0
    call_timeout: float = 60.0
    label: str = field(init=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.command, str) or not self.command:
            raise ServerError(f"server command must be a non-empty string, got {self.command!r}")
        if isinstance(self.args, str) or not all(isinstance(a, str) for a in self.args):
            raise ServerError(f"server args must be a sequence of strings, got {self.args!r}")
        pairs = _env_pairs(self.env)
        if self.namespace is not None:
            check_namespace(self.namespace)
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "env", pairs)
        object.__setattr__(
            self, "start_timeout", check_timeout("start_timeout", self.start_timeout)
        )
        object.__setattr__(self, "call_timeout", check_timeout("call_timeout", self.call_timeout))
        object.__setattr__(self, "label", self.namespace or os.path.basename(self.command))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ServerSpec:
        """Build a spec from a dict (``command``, ``args``, ``env``, ...); unknown keys are ignored."""
        known = {f.name for f in fields(cls) if f.init}
        values = {k: v for k, v in data.items() if k in known}
        if isinstance(values.get("args"), list):
            values["args"] = tuple(values["args"])
        return cls(**values)


def installed_server(
    script: str, module: str, *args: str, **kwargs: Any
) -> ServerSpec:
    """A spec for an MCP server installed in this Python environment: its console ``script``
    beside the interpreter when present, else ``python -m module``."""
    path = Path(sys.executable).with_name(script)
    if path.is_file():
        return ServerSpec(str(path), tuple(args), **kwargs)
    return ServerSpec(sys.executable, ("-m", module, *args), **kwargs)
