"""Command-line argument checks, run before any model, embedder or server is loaded.

Contract: each function takes the raw option value (and the option's name for the message) and
returns it checked and normalised, or raises :class:`~nexus_mlx.errors.ArgumentError` with one
line naming the option, the offending value and the fix. Checks that touch the file system only
look (``output_directory`` creates the folder, which the command would do anyway); none of them
read a registry or start anything: :func:`tools_source` only decides *what* ``--tools`` names.

It knows nothing about models, the cache or routing.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from nexus_mlx.errors import ArgumentError

REGISTRY_SUFFIXES = (".json", ".jsonl")


def request_text(value: str, option: str = "the request") -> str:
    """A non-empty, not-only-whitespace text (a prompt, a request to route)."""
    if not value.strip():
        raise ArgumentError(f"{option} is empty ({value!r}); give the text to work on, e.g. "
                            "'What time is it in Tokyo?'")
    return value


def positive_int(value: int, option: str) -> int:
    if value < 1:
        raise ArgumentError(f"{option} must be a positive integer, got {value}")
    return value


def non_negative_int(value: int, option: str) -> int:
    if value < 0:
        raise ArgumentError(f"{option} must be an integer >= 0, got {value}")
    return value


def port(value: int, option: str = "--port") -> int:
    """A TCP port (0: any free one)."""
    if not 0 <= value <= 65535:
        raise ArgumentError(f"{option} must be a TCP port in [0, 65535] (0: any free one), got "
                            f"{value}")
    return value


def host(value: str, option: str = "--host") -> str:
    """An address to listen on: a name or an IP, no spaces."""
    if not value.strip() or any(c.isspace() for c in value):
        raise ArgumentError(f"{option} {value!r} is not an address; give a host name or an IP "
                            "such as 127.0.0.1 (0.0.0.0 listens on every interface)")
    return value


def percentage(value: float, option: str) -> float:
    if not 0 <= value <= 100:
        raise ArgumentError(f"{option} must be a percentage in [0, 100], got {value:g}")
    return value


def nats(value: float | None, option: str) -> float | None:
    """A finite log-probability gap >= 0 (0: off), or None (off)."""
    if value is not None and not 0 <= value < float("inf"):
        raise ArgumentError(f"{option} must be a number of nats >= 0, got {value:g}")
    return value


def seconds_or_off(value: str, option: str) -> float | None:
    """A finite number of seconds >= 0, or None for ``off``."""
    if value.strip().lower() == "off":
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not 0 <= seconds < float("inf"):
        raise ArgumentError(f"{option} must be a number of seconds >= 0 or 'off', got {value!r}")
    return seconds


def depths(values: list[int], option: str = "--depths") -> list[int]:
    bad = [v for v in values if v < 0]
    if bad:
        raise ArgumentError(f"{option} must be history lengths >= 0, got {bad}")
    return values


@dataclass(frozen=True)
class ToolsSource:
    """What ``--tools`` names: a registry file, or an MCP server command line."""

    text: str
    file: Path | None = None
    command: tuple[str, ...] = ()


def tools_source(value: str, option: str = "--tools") -> ToolsSource:
    """A registry file (``.json`` / ``.jsonl``, which must exist) or a server command line."""
    if not value.strip():
        raise ArgumentError(f"{option} is empty; give a registry file (.json / .jsonl) or an "
                            "MCP server command such as 'mcp-server-time'")
    path = Path(value).expanduser()
    registry_like = path.suffix.lower() in REGISTRY_SUFFIXES
    if path.is_file() and (registry_like or not os.access(path, os.X_OK)):
        return ToolsSource(value, file=path)  # (a non-executable file: a registry, any suffix)
    if registry_like and len(value.split()) == 1:
        if path.is_dir():
            raise ArgumentError(f"{option} {value!r} is a directory; give the registry file in it")
        raise ArgumentError(f"{option} {value!r}: no such file; check the path (a registry "
                            "file is .json or Seal-Tools .jsonl)")
    try:
        words = tuple(shlex.split(value))
    except ValueError as exc:
        raise ArgumentError(f"{option} {value!r} is not a valid command line ({exc}); close the "
                            "quotes, or give a registry file (.json / .jsonl)") from None
    if not words:
        raise ArgumentError(f"{option} {value!r} names no command; give a registry file or an "
                            "MCP server command")
    return ToolsSource(value, command=words)


def registry_files(values: list[str], option: str = "--extra-tools") -> list[Path]:
    """Existing registry files."""
    out = []
    for value in values:
        path = Path(value).expanduser()
        if not path.is_file():
            what = "is a directory" if path.is_dir() else "no such file"
            raise ArgumentError(f"{option} {value!r}: {what}; give a registry file (.json / "
                                ".jsonl)")
        out.append(path)
    return out


def output_directory(value: str, option: str = "--out") -> Path:
    """A directory that exists or can be created, and is writable; created here."""
    if not value.strip():
        raise ArgumentError(f"{option} is empty; give a directory for the output files")
    path = Path(value).expanduser()
    if path.exists() and not path.is_dir():
        raise ArgumentError(f"{option} {value!r} is an existing file, not a directory; give a "
                            "new or existing directory (e.g. atb/)")
    ancestor = path
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ArgumentError(f"{option} {value!r}: {str(ancestor)!r} is a file, so no directory "
                            "can be made under it; choose another path")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ArgumentError(f"{option} {value!r}: cannot create the directory ({reason}); "
                            "choose a writable path") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ArgumentError(f"{option} {value!r} is not writable; choose a writable directory")
    return path


def results_directory(value: str, option: str = "--results", *, suggestion: Path | None = None
                      ) -> Path:
    """A directory holding at least one result file (``*.json``); ``suggestion`` (the source
    checkout's results folder) is named in the fix when it has results itself."""
    path = Path(value).expanduser()
    fix = "pass --results PATH/TO/results"
    if suggestion is not None and suggestion.is_dir() and any(suggestion.glob("*.json")):
        fix = f"pass --results {suggestion}"
    if not path.is_dir():
        raise ArgumentError(f"{option} {value!r}: no such directory (from {os.getcwd()}); {fix}")
    if not any(path.glob("*.json")):
        raise ArgumentError(f"{option} {value!r} holds no result files (*.json); run a benchmark "
                            f"first (nexus-mlx bench NAME) or {fix}")
    return path
