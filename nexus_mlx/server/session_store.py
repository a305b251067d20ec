"""A server's live sessions kept across restarts: saved to a directory at stop, restored at start.

Contract: :func:`save_pool` writes every idle, non-empty session of a
:class:`~nexus_mlx.server.pool.SessionPool` to ``directory`` as ``session-NNN.safetensors``
(``000`` the most recently used; :func:`~nexus_mlx.agent.session_file.save_session`: atomic, with
the model's fingerprint and the chat template's digest) and then removes the files of that pattern
it did not write (an earlier stop's), so the directory holds the pool as it was at this stop; each
file also keeps the length of the last request its session served, so a restored session tells a
continued conversation (served in place) from a new branch (served by a copy) as before the
restart. Files of other names are never touched. Busy sessions (a request cut off by the stop) are
not saved. :func:`restore_pool` loads the newest ``max_sessions`` such files, oldest first, into
sessions that ``factory`` builds (the server's own settings: policy, budget, guard, compiled
blocks; the saved rows, ids and stale flags are copied in, and under policy ``exact`` stale rows
are healed first, as that policy never holds any) and adopts them into the pool, so a
conversation resumed after a restart appends to its cache instead of prefilling it again. A file
that cannot be restored — another model, template or dtype, another format version, a damaged
file — is skipped and reported with the reason; it is left where it is until the next save
replaces the pattern. Each call returns a :class:`StoreReport`; a session that cannot be written
(a full disk) is reported there too, and the others are still saved.

Both do MLX work: call them where the pool's sessions are evaluated (a server's MLX thread).
It knows nothing about HTTP or requests.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nexus_mlx.agent.session import Session
from nexus_mlx.agent.session_file import read_session, save_session
from nexus_mlx.errors import ArgumentError, FormatError, ModelMismatchError
from nexus_mlx.server.pool import SessionPool

PATTERN = re.compile(r"session-(\d{3,})\.safetensors")
log = logging.getLogger(__name__)


@dataclass
class StoreReport:
    """Sessions written or restored (with their rows), and files refused with the reason."""

    sessions: int = 0
    rows: int = 0
    refused: list[tuple[str, str]] = field(default_factory=list)


def _file_name(index: int) -> str:
    return f"session-{index:03d}.safetensors"


def _stored(directory: Path) -> list[Path]:
    """The pattern's files in ``directory``, most recently used first."""
    found = [(int(m.group(1)), p) for p in directory.iterdir()
             if (m := PATTERN.fullmatch(p.name)) is not None and p.is_file()]
    return [p for _, p in sorted(found)]


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


def save_pool(pool: SessionPool, directory: Path) -> StoreReport:
    """Write the pool's idle sessions (module docstring); return what was written."""
    report, written = StoreReport(), set()
    for entry in pool.idle():
        if entry.session.cache.n_past == 0:
            continue
        name = _file_name(report.sessions)
        try:
            save_session(entry.session, directory / name, {"prompt": entry.prompt})
        except OSError as exc:  # a full disk, a directory gone: the others may still fit
            report.refused.append((name, f"not saved: {exc.strerror or exc}"))
            log.warning("session %s not saved: %s", name, exc)
            continue
        written.add(name)
        report.sessions += 1
        report.rows += int(entry.session.cache.n_past)
    for path in _stored(directory):
        if path.name not in written:
            path.unlink(missing_ok=True)
    return report


def restore_pool(pool: SessionPool, directory: Path, model: Any, tokenizer: Any,
                 factory: Callable[[], Session]) -> StoreReport:
    """Adopt the sessions saved in ``directory`` into ``pool`` (module docstring)."""
    report = StoreReport()
    for path in reversed(_stored(directory)[: pool.max_sessions]):  # oldest first
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
        pool.adopt(session, prompt if isinstance(prompt, int) else None)
        report.sessions += 1
        report.rows += int(session.cache.n_past)
    return report
