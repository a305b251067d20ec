"""Stored responses of the Responses API: what ``previous_response_id`` continues and what
``GET`` / ``DELETE /v1/responses/{id}`` read.

Contract: ``ResponseStore(max_responses)`` keeps finished responses in memory. ``put(body,
items)`` stores one: ``body`` is the ``response`` object as it was answered, ``items`` the
conversation the next turn continues, as Responses input items: the earlier responses' items,
this request's input, then this response's output items (``instructions`` are not part of it:
the API does not carry them over to the next turn). ``get(id)`` returns the
:class:`StoredResponse` or None; ``delete(id)`` drops one and says whether it was there.
``max_responses`` bounds the store: past it, the least recently used response (stored, read or
continued) is dropped, and its id is unknown from then on; 0 stores nothing. Items are shared,
not copied, between the responses of one conversation, so a chain of N turns costs N lists of
references. Safe from any thread (one lock). It knows nothing about HTTP or generation.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nexus_mlx.errors import ArgumentError

DEFAULT_MAX_RESPONSES = 1024


@dataclass(frozen=True)
class StoredResponse:
    body: Mapping[str, Any]  # the response object as answered
    items: tuple[Mapping[str, Any], ...]  # the conversation a continuation starts from


class ResponseStore:
    """See the module docstring."""

    def __init__(self, max_responses: int = DEFAULT_MAX_RESPONSES) -> None:
        if isinstance(max_responses, bool) or not isinstance(max_responses, int) \
                or max_responses < 0:
            raise ArgumentError(f"max_responses must be an integer >= 0, got {max_responses!r}")
        self.max_responses = max_responses
        self._stored: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.max_responses > 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._stored)

    def put(self, body: Mapping[str, Any], items: Sequence[Mapping[str, Any]]) -> None:
        if not self.enabled:
            return
        with self._lock:
            self._stored[str(body["id"])] = StoredResponse(body, tuple(items))
            self._stored.move_to_end(str(body["id"]))
            while len(self._stored) > self.max_responses:
                self._stored.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            stored = self._stored.get(response_id)
            if stored is not None:
                self._stored.move_to_end(response_id)
            return stored

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._stored.pop(response_id, None) is not None
