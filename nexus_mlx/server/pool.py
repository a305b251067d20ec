"""A pool of live sessions over one loaded model: which cached conversation serves a request.

Contract: ``SessionPool(factory, max_sessions=..., cache_budget=..., held_elsewhere=...)``;
``acquire(ids)`` hands out an idle session for a request rendered to ``ids`` and marks it busy
(one holder at a time: each session is its own lock), ``release(entry)`` records what its cache
now holds and frees it. ``adopt(session)`` adds a session built elsewhere (one restored from
disk) as the most recently used idle one; ``idle()`` lists the idle entries, most recently used
first.

Choice (clients resend the whole conversation, so the conversation is recognised by its tokens):
for every idle session the pool counts the rows a step to ``ids`` would keep — the common prefix,
plus the reused block when the session repairs edits (the same plan the session makes,
:func:`~nexus_mlx.agent.alignment.plan_edit`) — and the rows it would drop. The session whose
kept rows exceed its dropped ones by the most wins (then the one keeping the most; then the least
recently used). It serves the request itself when the request goes on with its conversation: it
drops nothing, or only rows of the reply to the last request (clients send it back
re-rendered), or it edits the conversation (a reused block past the prefix, dropping no more
than it keeps). Otherwise the request departs inside that conversation's last prompt without
reusing a block — another conversation sharing a prefix (agents share a system prompt and
tools), or a branch of it: a new session serves (or, with ``max_sessions`` reached, the least
recently used idle one is overwritten), seeded with a copy of the longest common prefix an idle
session holds (:meth:`~nexus_mlx.agent.session.Session.copy_prefix`), so the shared rows are
not recomputed and the other conversation keeps its cache. The copy's source is held busy
while it is made. A request that goes on with a busy session's conversation waits for it
rather than taking another session; when every session is busy and none may be made,
``acquire`` waits too (checking ``cancelled`` every tenth of a second; None when it fires).

Budget: after each release (and at ``fit()``) the bytes of all caches (:attr:`NexusCache.nbytes`)
are summed, with ``held_elsewhere()``'s (K/V the caller keeps outside the pool: a server's prompt
scorer), and idle sessions are dropped, least recently used first, until the total fits
``cache_budget`` (a session larger than the budget alone is dropped too). Busy sessions are never
dropped.

It knows nothing about HTTP, requests or generation; ``factory`` builds sessions and ``run(fn)``
runs that MLX work (building, seeding) where the caller's MLX work runs (a server: its MLX
thread; default: in the calling thread).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

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
    prompt: int = 0  # length of the last request served; its reply's rows follow


class Reuse(NamedTuple):
    kept: int  # rows a step keeps: the common prefix and any reused block
    dropped: int  # rows it drops
    prefix: int  # the common prefix alone


def reuse_of(tokens: np.ndarray, ids: np.ndarray, *, repair: bool, min_reuse: int) -> Reuse:
    """What a session holding ``tokens`` keeps and drops when it steps to ``ids``."""
    prefix = common_prefix(tokens, ids)
    if prefix == tokens.size or not repair:
        return Reuse(prefix, int(tokens.size - prefix), prefix)
    plan = plan_edit(tokens, ids, min_reuse)
    kept = plan.prefix + plan.reused
    return Reuse(kept, int(tokens.size - kept), prefix)


def _key(entry: PooledSession, reuse: Reuse) -> tuple[int, int, bool, int]:
    """Rows saved less rows destroyed; then the most kept; an empty one (drops nothing); then
    the least recently used."""
    return (reuse.kept - reuse.dropped, reuse.kept, entry.tokens.size == 0, -entry.last_used)


def _continues(entry: PooledSession, reuse: Reuse) -> bool:
    """Whether the request goes on with ``entry``'s conversation: it drops nothing, or only rows
    of the reply to the last request (clients send it back re-rendered), or it edits the
    conversation (a reused block past the prefix, dropping no more than it keeps)."""
    follows = reuse.prefix >= entry.prompt
    edit = reuse.kept > reuse.prefix and reuse.dropped <= reuse.kept
    return reuse.dropped == 0 or follows or edit


@dataclass(frozen=True)
class _Plan:
    target: PooledSession | None  # the session that serves (None: a new one)
    source: PooledSession | None = None  # whose first ``rows`` rows it copies first
    rows: int = 0


class SessionPool:
    """See the module docstring."""

    def __init__(self, factory: Callable[[], Session], *, max_sessions: int = 8,
                 cache_budget: int = 2 << 30,
                 run: Callable[[Callable[[], Session]], Session] = lambda build: build(),
                 held_elsewhere: Callable[[], int] = lambda: 0) -> None:
        if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1:
            raise ArgumentError(f"max_sessions must be a positive integer, got {max_sessions!r}")
        if isinstance(cache_budget, bool) or not isinstance(cache_budget, int) or cache_budget < 0:
            raise ArgumentError(f"cache_budget must be a byte count >= 0, got {cache_budget!r}")
        self.factory, self.max_sessions, self.cache_budget = factory, max_sessions, cache_budget
        self.run = run  # runs the MLX work of building (and seeding) a session
        self.held_elsewhere = held_elsewhere  # K/V bytes outside the pool, in the budget
        self.entries: list[PooledSession] = []
        self.evicted = 0
        self._reserved = 0  # sessions being built outside the lock
        self._clock = itertools.count(1)
        self._ids = itertools.count()
        self._cond = threading.Condition()

    # ---- choosing -----------------------------------------------------------------------
    def _choose(self, ids: np.ndarray) -> _Plan | None:
        """Who serves ``ids`` and what it copies first; None for "wait"."""
        scored = [(_key(entry, reuse), entry, reuse) for entry in self.entries
                  for reuse in [self._reuse(entry, ids)]]
        if scored:
            _, owner, reuse = max(scored, key=lambda t: t[0])
            if owner.busy and owner.tokens.size and _continues(owner, reuse):
                return None  # its conversation's session is in use (or lent): wait for it
        idle = [t for t in scored if not t[1].busy]
        best = max(idle, key=lambda t: t[0]) if idle else None
        if best is not None and _continues(best[1], best[2]):
            return _Plan(best[1])
        # a new branch copies the longest common prefix any idle session holds (the session
        # that would best serve in place may hold less: a small unrelated one drops little)
        longest = max(idle, key=lambda t: (t[2].prefix, t[1].last_used)) if idle else None
        source, rows = ((longest[1], longest[2].prefix) if longest is not None
                        and longest[2].prefix else (None, 0))
        if len(self.entries) + self._reserved < self.max_sessions:
            return _Plan(None, source, rows)
        if not idle:
            return None
        target = min((t[1] for t in idle), key=lambda e: e.last_used)  # no room: overwrite it
        return _Plan(target) if source is target else _Plan(target, source, rows)

    @staticmethod
    def _reuse(entry: PooledSession, ids: np.ndarray) -> Reuse:
        s = entry.session
        return reuse_of(entry.tokens, ids, repair=s.policy == "repair", min_reuse=s.min_reuse)

    def acquire(self, ids: np.ndarray, cancelled: Callable[[], bool] | None = None
                ) -> PooledSession | None:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        with self._cond:
            while (plan := self._choose(ids)) is None:
                if cancelled is not None and cancelled():
                    return None
                self._cond.wait(WAIT_S)
            if cancelled is not None and cancelled():
                return None
            self._hold(plan, True)
            if plan.target is not None and plan.source is None:
                plan.target.prompt = int(ids.size)
                return plan.target
        try:
            session = self.run(lambda: self._prepare(plan))
        except BaseException:
            with self._cond:
                self._hold(plan, False)
            raise
        with self._cond:
            if plan.source is not None:
                plan.source.busy = False
            entry = plan.target
            if entry is None:
                self._reserved -= 1
                entry = PooledSession(session, next(self._ids), busy=True)
                self.entries.append(entry)
            entry.prompt = int(ids.size)
            self._cond.notify_all()
            return entry

    def _hold(self, plan: _Plan, held: bool) -> None:
        """Mark (or free, after a failure) what ``plan`` uses, under the lock."""
        for entry in (plan.target, plan.source):
            if entry is not None:
                entry.busy = held
        if plan.target is None:
            self._reserved += 1 if held else -1
        if not held:
            self._cond.notify_all()

    def _prepare(self, plan: _Plan) -> Session:
        """The serving session (built when new), seeded with the plan's rows (MLX work)."""
        session = plan.target.session if plan.target is not None else self.factory()
        if plan.source is not None:
            session.copy_prefix(plan.source.session, plan.rows)
        return session

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

    def adopt(self, session: Session, prompt: int | None = None) -> PooledSession:
        """Add ``session`` as an idle entry (the most recently used) whose last request was
        ``prompt`` ids long (None: all it holds, so only an append or an edit continues in it;
        anything else branches off with a copy). Past ``max_sessions`` or the budget, the
        least recently used idle ones are dropped."""
        tokens, nbytes = session.tokens, int(session.cache.nbytes)
        prompt = int(tokens.size) if prompt is None else min(max(int(prompt), 0), tokens.size)
        with self._cond:
            entry = PooledSession(session, next(self._ids), tokens, nbytes,
                                  last_used=next(self._clock), prompt=prompt)
            self.entries.append(entry)
            idle = sorted((e for e in self.entries if not e.busy), key=lambda e: e.last_used)
            for old in idle[: max(len(self.entries) - self.max_sessions, 0)]:
                self.entries.remove(old)
                self.evicted += 1
            self._evict()
            self._cond.notify_all()
            return entry

    def idle(self) -> list[PooledSession]:
        """The idle entries, most recently used first."""
        with self._cond:
            return sorted((e for e in self.entries if not e.busy), key=lambda e: -e.last_used)

    def fit(self) -> None:
        """Drop idle sessions until the caches fit the budget (after K/V held elsewhere grew)."""
        with self._cond:
            self._evict()

    def _evict(self) -> None:
        total = sum(e.nbytes for e in self.entries) + self.held_elsewhere()
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
                "cache_bytes_elsewhere": self.held_elsewhere(),
                "cached_tokens": sum(int(e.tokens.size) for e in self.entries),
                "evicted": self.evicted,
            }
