"""Copy drafting: several decoded tokens per forward pass where the output copies its context.

An agent's output often repeats its context: a call's arguments quote the request, an answer
quotes a tool's result. When the last tokens written also occur earlier in the context, the
tokens that followed them there are a likely continuation (prompt-lookup decoding). They are
forwarded together with the token just chosen, in one pass, and then verified one by one: the
decoder chooses each next token from the logits of that pass exactly as it would have from a
one-token step, and a drafted token is kept only while it equals the token chosen. So the
output is the decoder's own, token for token, for any sampler (up to the float32 rounding of
a several-token forward against a one-token one); a draft that turns out wrong costs only the
extra rows of that pass, which are dropped.

Contract:
- :func:`checked_draft_tokens` validates a draft length (what every caller's option is).
- :func:`propose` returns up to ``max_tokens`` ids that followed the most recent earlier
  occurrence of the context's last ``n`` ids, for the longest ``n`` from ``max_match`` down to
  ``min_match`` that occurs; ``[]`` when none does.
- :class:`Lookahead` feeds a decoder's chosen tokens to a model through two callables: ``run(ids,
  tail) -> rows`` appends ids to the cache and returns the next-token rows of the last ``tail`` of
  them (their evaluated logits ``(tail, V)``, ``models.forward.forward_tail``, or any per-id row
  the decoder reads, such as a :class:`~nexus_mlx.decode.certified_head.HeadRow`), and ``drop(n,
  row)`` removes the last ``n`` rows again, ``row`` being that of the row that is now last.
  ``feed(ids)`` returns the row after the last of ``ids``: from the pass that drafted them when
  they match its drafts, else from one new pass over the ids and a fresh draft. ``close()`` drops
  the rows of drafts not yet confirmed (call it before anything else reads or edits the cache;
  ``feed`` after ``close`` starts again). ``room()`` bounds the rows one pass may add. ``stats``
  counts passes, drafted and accepted tokens. With a ``prediction``
  (:class:`~nexus_mlx.decode.prediction.Prediction`), every id fed advances it, and a pass drafts
  what it expects next (up to its own ``max_draft``) before any copy from the context;
  ``stats.predicted`` and ``stats.predicted_accepted`` count its drafts and those kept.

It knows nothing about caches, models or constraints: the caller's callables do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from nexus_mlx.errors import ArgumentError

if TYPE_CHECKING:
    from nexus_mlx.decode.prediction import Prediction

Row = Any  # what ``run`` gives per id: logits (V,), or a row object the decoder reads
DEFAULT_DRAFT_TOKENS = 3
"""Drafted ids per pass. On a 2-core CPU a pass over 4 tokens cost 1.56-1.69x a one-token step
(SmolLM2 at depth 512 with the BLAS shim's few-row kernel, ``results/skinny_gemm.json`` and its
first run on another machine): a draft of 3 pays once 0.6-0.7 of its ids are kept on average.
Longer drafts were measured only on the first machine (6 tokens 2.9x there, 1.75x now)."""
DEFAULT_MIN_MATCH = 3
"""Ids the context's tail must match before its continuation is drafted: one id alone (a
quote, a comma) recurs everywhere, so its drafts are mostly wrong."""


def checked_draft_tokens(value: object, name: str = "draft_tokens") -> int:
    """``value`` when it is a count of ids to draft (an integer >= 0), else ArgumentError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ArgumentError(f"{name} must be an integer >= 0, got {value!r}")
    return value


def propose(context: np.ndarray | Sequence[int], max_tokens: int, *,
            min_match: int = DEFAULT_MIN_MATCH, max_match: int = 4) -> list[int]:
    """The ids after the most recent earlier occurrence of the context's last ``n`` ids
    (longest ``n`` first; module docstring)."""
    ids = np.asarray(context, dtype=np.int64)
    size = int(ids.size)
    if max_tokens < 1 or size < 2:
        return []
    for n in range(min(max_match, size - 1), min_match - 1, -1):
        tail = ids[size - n:]
        starts = np.flatnonzero(ids[: size - n] == tail[0])  # start + n <= size - 1
        for j in range(1, n):
            if not starts.size:
                break
            starts = starts[ids[starts + j] == tail[j]]
        if starts.size:
            follow = int(starts[-1]) + n
            return [int(t) for t in ids[follow: follow + max_tokens]]
    return []


@dataclass
class LookaheadStats:
    passes: int = 0  # forward passes run
    drafted: int = 0  # drafted ids forwarded
    accepted: int = 0  # of them, confirmed by the decoder
    predicted: int = 0  # drafted ids that came from a prediction
    predicted_accepted: int = 0  # of them, confirmed


class Lookahead:
    """Verified copy drafts over a decoder's cache (module docstring)."""

    def __init__(self, run: Callable[[list[int], int], Any],  # rows, indexable by id
                 drop: Callable[[int, Row], None], context: Sequence[int] | np.ndarray, *,
                 max_draft: int = DEFAULT_DRAFT_TOKENS, min_match: int = DEFAULT_MIN_MATCH,
                 room: Callable[[], int] | None = None,
                 prediction: Prediction | None = None) -> None:
        checked_draft_tokens(max_draft, "max_draft")
        if isinstance(min_match, bool) or not isinstance(min_match, int) or min_match < 1:
            raise ArgumentError(f"min_match must be an integer >= 1, got {min_match!r}")
        self._run, self._drop, self._room = run, drop, room
        self.max_draft, self.min_match = max_draft, min_match
        self._context = np.asarray(context, dtype=np.int64).copy()
        self._size = int(self._context.size)
        self._drafts: list[int] = []  # forwarded, not yet confirmed
        self._ahead: list[Row] = []  # the row after each draft, in order
        self._last: Row | None = None  # the row after the last confirmed id
        self._prediction = prediction
        self._predicted = False  # whether the drafts forwarded came from the prediction
        self.stats = LookaheadStats()

    @property
    def ahead(self) -> int:
        """Rows of drafts forwarded and not yet confirmed (the cache holds them)."""
        return len(self._drafts)

    @property
    def context(self) -> np.ndarray:
        """The initial context and every id fed since."""
        return self._context[: self._size]

    def feed(self, ids: Sequence[int], *, draft: bool = True) -> Row:
        """The row (logits ``(V,)``, or the caller's row) after the last of ``ids``, which the
        decoder has chosen."""
        ids = [int(t) for t in ids]
        if not ids:
            raise ArgumentError("feed() needs at least one id")
        taken = 0
        while taken < len(ids) and self._drafts and self._drafts[0] == ids[taken]:
            self._drafts.pop(0)
            self._last = self._ahead.pop(0)
            self.stats.accepted += 1
            self.stats.predicted_accepted += self._predicted
            taken += 1
        self._extend(ids[:taken])
        if taken == len(ids):
            assert self._last is not None
            return self._last
        self.close()
        rest = ids[taken:]
        self._extend(rest)
        proposal = self._draft(len(rest)) if draft else []
        rows = self._run(rest + proposal, 1 + len(proposal))
        self.stats.passes += 1
        self.stats.drafted += len(proposal)
        self.stats.predicted += len(proposal) if self._predicted else 0
        self._drafts = proposal
        self._ahead = [rows[i] for i in range(1, 1 + len(proposal))]
        self._last = rows[0]
        return self._last

    def close(self) -> None:
        """Drop the rows of unconfirmed drafts (the cache then ends at the last id fed)."""
        if self._drafts:
            assert self._last is not None
            self._drop(len(self._drafts), self._last)
        self._drafts, self._ahead = [], []

    def _draft(self, running: int) -> list[int]:
        room = self._room() - running if self._room is not None else None
        self._predicted = False
        if self._prediction is not None:
            predicted = self._prediction.propose(self._prediction.max_draft if room is None
                                                 else room)
            if predicted:
                self._predicted = True
                return predicted
        limit = self.max_draft if room is None else min(self.max_draft, room)
        if limit < 1:
            return []
        return propose(self.context, limit, min_match=self.min_match)

    def _extend(self, ids: list[int]) -> None:
        if not ids:
            return
        if self._prediction is not None:
            self._prediction.advance(ids)
        need = self._size + len(ids)
        if need > self._context.size:
            grown = np.zeros(max(need, 2 * self._context.size), dtype=np.int64)
            grown[: self._size] = self._context[: self._size]
            self._context = grown
        self._context[self._size: need] = ids
        self._size = need
