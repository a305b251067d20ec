"""Compile one C source file into a shared library in the user cache, keyed by its content.

Contract: :func:`build_shared_library` returns the path of ``<folder>/<stem>-<digest>.so``,
compiling it only if it is not there yet (``digest`` = first 16 hex digits of the SHA-256 of
the source and its local headers, so an edited source or header gets a new file). The file
appears atomically (written under a temporary name, then renamed), so concurrent processes never
load a partial library. Failures raise :class:`BuildError` with one readable sentence. It never
imports mlx: the BLAS shim is built with it before ``mlx.core`` may be loaded. It knows nothing
about what the library does; :func:`load_or_explain` loads one, turned off by an environment
variable, and says why where it could not; :class:`NativeLoader` does that once per process, with
an off switch for a block; :func:`bind_isa_exports` reads what every kernel library exports
(ABI version, source id, ISAs).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Protocol, TypeVar

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


class NativeLoader(Generic[_Library]):
    """One native kernel library per process: ``load`` runs on first use only (under a lock), a
    failure or ``env_var`` becomes a :class:`NativeStatus`, and :meth:`disabled` switches the
    kernel off for a block (A/B measurements in one run; the switch is process-wide, not
    thread-safe)."""

    def __init__(self, env_var: str, load: Callable[[], _Library], what: str) -> None:
        self.env_var, self.what = env_var, what
        self._load = load
        self._lock = threading.Lock()
        self._result: tuple[_Library | None, NativeStatus] | None = None
        self._off = 0

    def _resolved(self) -> tuple[_Library | None, NativeStatus]:
        result = self._result  # settled after the first use: no lock on the per-layer path
        if result is not None:
            return result
        with self._lock:
            if self._result is None:
                self._result = load_or_explain(self.env_var, self._load, self.what)
            return self._result

    def library(self) -> _Library | None:
        """The loaded library, or None where it could not be (see :meth:`status`)."""
        return self._resolved()[0]

    def status(self) -> NativeStatus:
        """Why :meth:`library` is (not) available."""
        return self._resolved()[1]

    def cache_clear(self) -> None:
        """Forget the outcome: the next use loads again (after the environment changed)."""
        with self._lock:
            self._result = None

    @property
    def switched_off(self) -> bool:
        """True inside :meth:`disabled`."""
        return self._off > 0

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        """Inside the block :attr:`switched_off` is True."""
        self._off += 1
        try:
            yield
        finally:
            self._off -= 1


def bind_isa_exports(lib: ctypes.CDLL, prefix: str, abi: int, isas: Sequence[str], path: str
                     ) -> tuple[str, tuple[str, ...], str]:
    """Check ``<prefix>_abi_version() == abi`` and read what every kernel library exports:
    its source id (``<prefix>_source_id``), the ISAs of ``isas`` (indexed as the library numbers
    them) this CPU runs (``<prefix>_isa_available``) and the best (``<prefix>_best_isa``).
    Raises :class:`ArgumentError` for another ABI version."""
    version = getattr(lib, f"{prefix}_abi_version")
    version.restype = ctypes.c_int
    if int(version()) != abi:
        raise ArgumentError(f"{path} has another ABI version than {abi}")
    source_id = getattr(lib, f"{prefix}_source_id")
    source_id.restype = ctypes.c_char_p
    available = getattr(lib, f"{prefix}_isa_available")
    available.argtypes = [ctypes.c_int]
    available.restype = ctypes.c_int
    best = getattr(lib, f"{prefix}_best_isa")
    best.restype = ctypes.c_int
    runs = tuple(name for i, name in enumerate(isas) if available(i))
    return (source_id() or b"").decode(), runs, isas[int(best())]
