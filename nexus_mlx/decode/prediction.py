"""Predicted outputs: drafts from text the caller expects the reply to repeat (OpenAI's
``prediction``), such as the file an agent asks the model to edit.

A reply that rewrites a file mostly repeats it: the ids after where the reply stands in the
prediction are a likely continuation, often for many ids at once. They are drafted as copy
drafts are (:class:`~nexus_mlx.decode.lookahead.Lookahead`) and verified the same way, so the
reply is the decoder's own, id for id, whatever the prediction says; a wrong prediction costs
only the rows of the drafts it made.

Contract: ``Prediction(ids, max_draft=..., min_match=...)`` follows one reply against the
predicted ``ids``. ``advance(ids)`` takes ids the decoder chose, in order; ``propose(limit)``
gives up to ``min(limit, max_draft)`` predicted ids expected next, ``[]`` while the reply stands
nowhere in the prediction. The reply starts aligned with the prediction's first id and stays
aligned while each id it chooses is the one expected. After any other id it realigns where its
last ``n`` ids occur in the prediction (the longest ``n`` from ``max_match`` down to
``min_match`` that occurs): at the first occurrence that ends at or after the place where it
last stood (an edit moves forward through what it rewrites), else at the last one before it.
:func:`prediction_of` ``(value, tokenizer)`` reads what a caller passes: text (encoded without
special tokens), ids, or a ``Prediction`` (returned as it is; None stays None).
The drafts it made and those kept are counted by the decoder's ``Lookahead``
(``stats.predicted``, ``stats.predicted_accepted``). It knows nothing about models or caches
(of a tokenizer, :func:`prediction_of` calls only ``encode``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from nexus_mlx.decode.lookahead import DEFAULT_MIN_MATCH, checked_draft_tokens
from nexus_mlx.errors import ArgumentError

DEFAULT_PREDICTION_DRAFT = 32
"""Predicted ids drafted per pass: a prediction is right for long runs, so it drafts further
than a copy from the context. On Qwen2.5-Coder-0.5B rewriting code on a 2-core CPU, 32 beat 8
and 16 (results/predicted_outputs.json, which also times 64 and a mismatched prediction)."""
MAX_MATCH = 8  # the longest reply tail looked up when realigning


class Prediction:
    """Where a reply stands in a predicted output (module docstring)."""

    def __init__(self, ids: Sequence[int] | np.ndarray, *,
                 max_draft: int = DEFAULT_PREDICTION_DRAFT,
                 min_match: int = DEFAULT_MIN_MATCH) -> None:
        self.max_draft = checked_draft_tokens(max_draft, "max_draft")
        if isinstance(min_match, bool) or not isinstance(min_match, int) or min_match < 1:
            raise ArgumentError(f"min_match must be an integer >= 1, got {min_match!r}")
        self.ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        self.min_match = min_match
        self.cursor: int | None = 0  # the predicted id expected next; None: not aligned
        self._last_place = 0  # where the reply last stood in the prediction
        self._tail: deque[int] = deque(maxlen=MAX_MATCH)  # the reply's last ids

    def advance(self, ids: Sequence[int]) -> None:
        for token in ids:
            self._tail.append(int(token))
            cursor = self.cursor
            if cursor is not None and cursor < self.ids.size and self.ids[cursor] == token:
                self.cursor = self._last_place = cursor + 1
            else:
                self.cursor = self._realign()

    def propose(self, limit: int) -> list[int]:
        if self.cursor is None or limit < 1:
            return []
        end = self.cursor + min(limit, self.max_draft)
        return [int(t) for t in self.ids[self.cursor:end]]

    def _realign(self) -> int | None:
        tail = np.asarray(self._tail, dtype=np.int64)
        for n in range(tail.size, self.min_match - 1, -1):
            ends = _occurrence_ends(self.ids, tail[-n:])
            if ends.size:
                later = ends[ends >= self._last_place]
                place = int(later[0] if later.size else ends[-1])
                self._last_place = place
                return place
        return None


def prediction_of(value: str | Sequence[int] | Prediction | None, tokenizer: Any
                  ) -> Prediction | None:
    """A reply's prediction from text, ids or a Prediction (module docstring)."""
    if value is None or isinstance(value, Prediction):
        return value
    if isinstance(value, str):
        return Prediction(tokenizer.encode(value, add_special_tokens=False))
    ids = list(value)
    if not all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in ids):
        raise ArgumentError("prediction must be text, a sequence of token ids or a Prediction")
    return Prediction(ids)


def _occurrence_ends(ids: np.ndarray, tail: np.ndarray) -> np.ndarray:
    """The index just past each occurrence of ``tail`` in ``ids``, ascending."""
    n = tail.size
    if n > ids.size:
        return np.zeros(0, dtype=np.int64)
    starts = np.flatnonzero(ids[: ids.size - n + 1] == tail[0])
    for j in range(1, n):
        if not starts.size:
            break
        starts = starts[ids[starts + j] == tail[j]]
    return starts + n
