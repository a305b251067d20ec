"""A server's live sessions kept across restarts: saved to a directory, restored at start.

Contract: ``SessionStore(directory)`` keeps the idle sessions of a
:class:`~nexus_mlx.server.pool.SessionPool` in ``directory``: one file per session,
``session-<12 hex digits>.safetensors`` (:func:`~nexus_mlx.agent.session_file.save_session`:
atomic, with the model's fingerprint, the chat template's digest and the length of the last
request the session served, so a restored session tells a continued conversation, served in
place, from a new branch, served by a copy, as before), and an index, ``sessions.json``, that
lists them most recently used first (written atomically after the files).

- ``save(pool)`` writes each idle, non-empty session that changed since this store last wrote or
  restored it (it served a request since); an unchanged one keeps its file. Then it writes the
  index and removes the pattern's files the index no longer names (sessions the pool dropped). A
  busy session keeps its earlier file. A session that cannot be written (a full disk) is reported,
  keeps its earlier file if it has one, and the others are still saved. A server saves at its stop
  and, as a checkpoint, when it goes idle.
- ``restore(pool, model, tokenizer, factory)`` loads the newest ``max_sessions`` files (in the
  index's order; files the index does not name come after it, newest first), oldest first,
  into sessions ``factory`` builds (the server's own settings: policy, budget, guard, compiled
  blocks; the saved rows, ids and stale flags copied in, and under policy ``exact`` stale rows
  healed first, as that policy never holds any) and adopts them into the pool, so a
  conversation resumed after a restart appends to its cache instead of prefilling it again. A
  file that cannot be restored (another model, template or dtype, another format version, a
  damaged file) is skipped and reported with the reason; the next save removes it.

One store at a time owns a directory: ``SessionStore(directory)`` takes an exclusive lock on
``directory/.lock`` (``flock``, where the platform has it) and raises :class:`ArgumentError`
when another process holds it (two servers would overwrite each other's index); ``close()``
lets it go, as does the process's end. Files of other names are never touched. Each call
returns a :class:`StoreReport`. Both do MLX work: call them where the pool's sessions are
evaluated (a server's MLX thread). It knows nothing about HTTP or requests.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

try:
    import fcntl
except ImportError:  # no flock (Windows): the directory is not locked
    fcntl = None  # type: ignore[assignment]

from nexus_mlx._platform.atomic_file import write_json
from nexus_mlx.agent.session import Session
from nexus_mlx.agent.session_file import read_session, save_session
from nexus_mlx.errors import ArgumentError, FormatError, ModelMismatchError
from nexus_mlx.server.pool import PooledSession, SessionPool

PATTERN = re.compile(r"session-[0-9a-f]{12}\.safetensors")
INDEX = "sessions.json"
INDEX_FORMAT = "nexus-mlx-session-index"
LOCK = ".lock"
log = logging.getLogger(__name__)


@dataclass
class StoreReport:
    """Sessions in the store after a save (or restored) with their rows, files written by a
    save, and files refused (not restored, or not written) with the reason."""

    sessions: int = 0
    rows: int = 0
    written: int = 0
    refused: list[tuple[str, str]] = field(default_factory=list)


def checked_directory(value: str | os.PathLike[str], option: str = "session_dir") -> Path:
    """``value`` as a directory path: created if missing; :class:`ArgumentError` naming
    ``option`` when it is a file or cannot be created."""
    path = Path(value).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ArgumentError(f"{option} {str(value)!r} cannot be used as a directory: "
                            f"{exc.strerror or exc}") from None
    return path


def _locked(directory: Path) -> IO[str] | None:
    """An open ``directory/.lock`` holding an exclusive ``flock`` (None where the platform has
    no ``flock``); :class:`ArgumentError` when another process holds it."""
    if fcntl is None:
        return None
    handle = open(directory / LOCK, "a+")  # noqa: SIM115 (held open: the lock lives with it)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise ArgumentError(f"session_dir {str(directory)!r} is in use by another nexus-mlx "
                            "server; give each server a directory of its own") from None
    return handle


def check_free(directory: str | os.PathLike[str]) -> Path:
    """``directory`` checked as :func:`checked_directory` does and not held by another store
    (its lock taken and let go at once: a command line checks before it loads a model)."""
    path = checked_directory(directory)
    handle = _locked(path)
    if handle is not None:
        handle.close()
    return path


class SessionStore:
    """See the module docstring."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = checked_directory(directory)
        self._files: dict[int, tuple[str, int]] = {}  # pool entry id -> (file, its requests)
        self._lock_file = _locked(self.directory)

    def close(self) -> None:
        """Let another store take the directory (idempotent)."""
        if self._lock_file is not None:
            self._lock_file.close()  # closing the descriptor drops its flock
            self._lock_file = None

    # ---- reading ------------------------------------------------------------------------
    def _indexed(self) -> list[str]:
        """The index's file names, most recently used first ([] when it is missing or bad)."""
        try:
            index = json.loads((self.directory / INDEX).read_text())
            names = index["sessions"] if index.get("format") == INDEX_FORMAT else []
        except (OSError, ValueError, AttributeError, KeyError, TypeError):
            return []
        return [n for n in names if isinstance(n, str) and PATTERN.fullmatch(n)]

    def _ordered(self) -> list[Path]:
        """The pattern's files, most recently used first: the index's, then any others."""
        present = {p.name: p for p in self.directory.iterdir()
                   if PATTERN.fullmatch(p.name) and p.is_file()}
        named = [present[n] for n in dict.fromkeys(self._indexed()) if n in present]
        rest = sorted((p for n, p in present.items() if p not in named),
                      key=lambda p: p.stat().st_mtime_ns, reverse=True)
        return named + rest

    def restore(self, pool: SessionPool, model: Any, tokenizer: Any,
                factory: Callable[[], Session]) -> StoreReport:
        """Adopt the stored sessions into ``pool`` (module docstring)."""
        report = StoreReport()
        for path in reversed(self._ordered()[: pool.max_sessions]):  # oldest first
            try:
                saved = read_session(model, tokenizer, path)
            except (FormatError, ModelMismatchError) as exc:
                report.refused.append((path.name, str(exc)))
                log.warning("session file not restored: %s", exc)
                continue
            session = factory()
            session.copy_prefix(saved.session, saved.session.cache.n_past)
            if session.policy == "exact" and session.stale_rows:
                session.heal()
            prompt = saved.annotations.get("prompt")
            entry = pool.adopt(session, prompt if isinstance(prompt, int) else None)
            self._files[entry.id] = (path.name, entry.requests)
            report.sessions += 1
            report.rows += int(session.cache.n_past)
        return report

    # ---- writing ------------------------------------------------------------------------
    def save(self, pool: SessionPool) -> StoreReport:
        """Write the changed idle sessions, the index, and drop stale files (module docstring)."""
        report = StoreReport()
        # a session in use now keeps its earlier file (a request the stop cut off changed it)
        names = [name for e in list(pool.entries) if e.busy and e.id in self._files
                 for name in [self._files[e.id][0]] if (self.directory / name).is_file()]
        for entry in pool.idle():
            if entry.session.cache.n_past == 0:
                continue
            name = self._write(entry, report)
            if name is not None:
                names.append(name)
                report.sessions += 1
                report.rows += int(entry.session.cache.n_past)
        try:
            write_json(self.directory / INDEX, {"format": INDEX_FORMAT, "sessions": names})
        except OSError as exc:  # the old index still names files that exist: keep them all
            report.refused.append((INDEX, f"not saved: {exc.strerror or exc}"))
            return report
        for path in self.directory.iterdir():
            if PATTERN.fullmatch(path.name) and path.name not in names:
                path.unlink(missing_ok=True)
        alive = {e.id for e in pool.entries}
        self._files = {k: v for k, v in self._files.items() if k in alive}
        return report

    def _write(self, entry: PooledSession, report: StoreReport) -> str | None:
        """The file holding ``entry`` after writing it if it changed; None if it cannot be."""
        known = self._files.get(entry.id)
        name = known[0] if known else f"session-{secrets.token_hex(6)}.safetensors"
        if known and known[1] == entry.requests and (self.directory / name).is_file():
            return name
        try:
            save_session(entry.session, self.directory / name, {"prompt": entry.prompt})
        except OSError as exc:  # a full disk, a directory gone: the others may still fit
            report.refused.append((name, f"not saved: {exc.strerror or exc}"))
            log.warning("session %s not saved: %s", name, exc)
            # its earlier file, if any, is still whole (the write was atomic): keep it
            return name if known and (self.directory / name).is_file() else None
        self._files[entry.id] = (name, entry.requests)
        report.written += 1
        return name
