"""Compile one C source file into a shared library in the user cache, keyed by its content.

Contract: :func:`build_shared_library` returns the path of ``<folder>/<stem>-<digest>.so``,
compiling it only if it is not there yet (``digest`` = first 16 hex digits of the SHA-256 of
the source and its local headers, so an edited source or header gets a new file). The file
appears atomically (written under a temporary name, then renamed), so concurrent processes never
load a partial library. Failures raise :class:`BuildError` with one readable sentence. It never
imports mlx: the BLAS shim is built with it before ``mlx.core`` may be loaded. It knows nothing
about what the library does; :func:`load_or_explain` loads one lazily, turned off by an
environment variable, and says why where it could not.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from nexus_mlx.errors import ArgumentError, BuildError

_LOCAL_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]+"([^"/]+)"', re.MULTILINE)


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/nexus-mlx`` (default ``~/.cache/nexus-mlx``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nexus-mlx"


def source_digest(source: Path) -> str:
    """First 16 hex digits of the SHA-256 of ``source`` and of the headers it includes with
    quotes from its own folder, in order (raises ``OSError`` if one is unreadable)."""
    source = Path(source)
    text = source.read_bytes()
    digest = hashlib.sha256(text)
    for name in _LOCAL_INCLUDE.findall(text):
        digest.update((source.parent / name.decode()).read_bytes())
    return digest.hexdigest()[:16]


def find_compiler(compiler: str | None = None) -> str:
    """``compiler``, else ``$CC``, else ``cc`` or ``gcc`` on the PATH."""
    found = compiler or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not found:
        raise BuildError("no C compiler (cc/gcc) found")
    return found


def build_shared_library(
    source: Path,
    stem: str,
    flags: Sequence[str],
    *,
    libraries: Sequence[str] = (),
    folder: Path | None = None,
    compiler: str | None = None,
    timeout: float = 300.0,
) -> Path:
    """Build ``source`` with ``compiler flags... source -o target libraries...`` (e.g.
    ``libraries=("-lm",)``), or reuse the cached build; return the library's path."""
    source = Path(source)
    try:
        digest = source_digest(source)
    except OSError as exc:
        raise BuildError(f"cannot read the source {source}: {exc}") from exc
    target = (cache_dir() if folder is None else Path(folder)) / f"{stem}-{digest}.so"
    if target.is_file():
        return target
    cc = find_compiler(compiler)
    tmp: str | None = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so.tmp", dir=target.parent)
        os.close(fd)
        cmd = [cc, *flags, str(source), "-o", tmp, *libraries]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise BuildError(f"compiling {source.name} failed: {proc.stderr.strip()[-800:]}")
        os.replace(tmp, target)  # atomic: concurrent importers never see a partial file
        tmp = None
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildError(f"compiling {source.name} into {target.parent} failed: {exc}") from exc
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    return target


def build_with_source_id(
    source: Path,
    stem: str,
    flags: Sequence[str],
    id_macro: str,
    *,
    libraries: Sequence[str] = (),
    folder: Path | None = None,
    compiler: str | None = None,
) -> Path:
    """:func:`build_shared_library` with ``-D<id_macro>="<digest>"`` added, so the library can
    report which source it was built from."""
    try:
        digest = source_digest(source)
    except OSError as exc:
        raise BuildError(f"the source {source} is missing: {exc}") from exc
    return build_shared_library(source, stem, (*flags, f'-D{id_macro}="{digest}"'),
                                libraries=libraries, folder=folder, compiler=compiler)


@dataclass(frozen=True)
class NativeStatus:
    """Outcome of loading a native kernel library: ``loaded``, the library ``path``, the
    ``isas`` this CPU can run, the ``best`` one, and one sentence of ``reason``."""

    loaded: bool
    reason: str
    path: str | None = None
    isas: tuple[str, ...] = ()
    best: str | None = None


class _NativeLibrary(Protocol):
    path: str
    isas: tuple[str, ...]
    best: str


_Library = TypeVar("_Library", bound=_NativeLibrary)


def load_or_explain(env_var: str, load: Callable[[], _Library], what: str
                    ) -> tuple[_Library | None, NativeStatus]:
    """``load()`` a native library unless ``env_var`` turns it off (``0``/``false``/``no``/
    ``off``); a build or load failure becomes a status that says why, never an exception."""
    if os.environ.get(env_var, "").strip().lower() in ("0", "false", "no", "off"):
        return None, NativeStatus(False, f"disabled by {env_var}={os.environ[env_var]}")
    try:
        native = load()
    except (BuildError, OSError, ArgumentError) as exc:
        return None, NativeStatus(False, f"no native {what} ({exc}); using MLX ops")
    return native, NativeStatus(True, "compiled into the cache", native.path, native.isas,
                                native.best)
