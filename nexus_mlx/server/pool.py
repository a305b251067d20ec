"""A pool of live sessions over one loaded model: which cached conversation serves a request.

Contract: ``SessionPool(factory, max_sessions=..., cache_budget=...)``; ``acquire(ids)`` hands out
an idle session for a request rendered to ``ids`` and marks it busy (one holder at a time: each
session is its own lock), ``release(entry)`` records what its cache now holds and frees it.

Choice (clients resend the whole conversation, so the conversation is recognised by its tokens):
for every idle session the pool counts the rows a step to ``ids`` would keep — the common prefix,
plus the reused block when the session repairs edits (the same plan the session makes,
:func:`~nexus_mlx.agent.alignment.plan_edit`) — and the rows it would drop. The session keeping
the most wins (ties: the most recently used), unless it would drop more than it keeps while a
new session may still be made (fewer than ``max_sessions``): then a new, empty one serves, so an
unrelated conversation does not overwrite a cached one. When every session is busy and none may
be made, ``acquire`` waits (checking ``cancelled`` every tenth of a second; None when it fires).

Budget: after each release the bytes of all caches (:attr:`NexusCache.nbytes`) are summed and
idle sessions are dropped, least recently used first, until the total fits ``cache_budget`` (a
session larger than the budget alone is dropped too). Busy sessions are never dropped.

It knows nothing about HTTP, requests or generation; ``factory`` builds sessions (on the MLX
thread, the caller's concern).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nexus_mlx.agent.alignment import common_prefix, plan_edit
from nexus_mlx.agent.session import Session
from nexus_mlx.errors import ArgumentError

WAIT_S = 0.1


@dataclass(eq=False)
class PooledSession:
    session: Session
    id: int
    tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # as last released
    nbytes: int = 0
    last_used: int = 0
    busy: bool = False
    requests: int = 0


def reuse_of(tokens: np.ndarray, ids: np.ndarray, *, repair: bool, min_reuse: int
             ) -> tuple[int, int]:
    """(rows kept, rows dropped) when a session holding ``tokens`` steps to ``ids``."""
    prefix = common_prefix(tokens, ids)
    if prefix == tokens.size or not repair:
        return prefix, int(tokens.size - prefix)
    plan = plan_edit(tokens, ids, min_reuse)
    kept = plan.prefix + plan.reused
    return kept, int(tokens.size - kept)


class SessionPool:
    """See the module docstring."""

    def __init__(self, factory: Callable[[], Session], *, max_sessions: int = 8,
                 cache_budget: int = 2 << 30) -> None:
        if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1:
            raise ArgumentError(f"max_sessions must be a positive integer, got {max_sessions!r}")
        if isinstance(cache_budget, bool) or not isinstance(cache_budget, int) or cache_budget < 0:
            raise ArgumentError(f"cache_budget must be a byte count >= 0, got {cache_budget!r}")
        self.factory, self.max_sessions, self.cache_budget = factory, max_sessions, cache_budget
        self.entries: list[PooledSession] = []
        self.evicted = 0
        self._reserved = 0  # sessions being built outside the lock
        self._clock = itertools.count(1)
        self._ids = itertools.count()
        self._cond = threading.Condition()

    # ---- choosing -----------------------------------------------------------------------
    def _choose(self, ids: np.ndarray) -> PooledSession | None | bool:
        """An idle entry, True for "make a new one", or None for "wait"."""
        best, best_key = None, None
        for entry in self.entries:
            if entry.busy:
                continue
            s = entry.session
            kept, dropped = reuse_of(entry.tokens, ids, repair=s.policy == "repair",
                                     min_reuse=s.min_reuse)
            key = (kept, entry.tokens.size == 0, entry.last_used)  # an empty one drops nothing
            if best_key is None or key > best_key:
                best, best_key = (entry, kept, dropped), key
        room = len(self.entries) + self._reserved < self.max_sessions
        if best is None:
            return True if room else None
        entry, kept, dropped = best
        if room and dropped > kept:
            return True
        return entry

    def acquire(self, ids: np.ndarray, cancelled: Callable[[], bool] | None = None
                ) -> PooledSession | None:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        with self._cond:
            while True:
                if cancelled is not None and cancelled():
                    return None
                choice = self._choose(ids)
                if isinstance(choice, PooledSession):
                    choice.busy = True
                    return choice
                if choice is True:
                    self._reserved += 1
                    break
                self._cond.wait(WAIT_S)
        try:
            session = self.factory()
        except BaseException:
            with self._cond:
                self._reserved -= 1
                self._cond.notify_all()
            raise
        with self._cond:
            self._reserved -= 1
            entry = PooledSession(session, next(self._ids), busy=True)
            self.entries.append(entry)
            return entry

    # ---- releasing ----------------------------------------------------------------------
    def release(self, entry: PooledSession) -> None:
        tokens = entry.session.tokens
        nbytes = int(entry.session.cache.nbytes)
        with self._cond:
            entry.tokens, entry.nbytes = tokens, nbytes
            entry.last_used, entry.busy = next(self._clock), False
            entry.requests += 1
            self._evict()
            self._cond.notify_all()

    def _evict(self) -> None:
        total = sum(e.nbytes for e in self.entries)
        for entry in sorted(self.entries, key=lambda e: e.last_used):
            if total <= self.cache_budget:
                break
            if entry.busy:
                continue
            self.entries.remove(entry)
            total -= entry.nbytes
            self.evicted += 1

    # ---- reading ------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        with self._cond:
            return {
                "sessions": len(self.entries),
                "busy": sum(e.busy for e in self.entries),
                "max_sessions": self.max_sessions,
                "cache_bytes": sum(e.nbytes for e in self.entries),
                "cache_budget_bytes": self.cache_budget,
                "cached_tokens": sum(int(e.tokens.size) for e in self.entries),
                "evicted": self.evicted,
            }
