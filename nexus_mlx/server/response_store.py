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
references; an item stored without an ``id`` is stored as a copy that has one (``msg_...``,
``fc_...``, ``fco_...`` by its type), kept from then on.
``StoredResponse.input_items`` are the items the response answered (all but its own output),
and :func:`input_items_page` is one page of them as ``GET /v1/responses/{id}/input_items``
lists them: ``{"object": "list", "data", "first_id", "last_id", "has_more"}``, newest first
unless ``order="asc"``, at most ``limit`` (1-100, default 20) items after the item ``after``;
a message's string content is listed as one text part, and every item has a ``status``. A bad
``limit``, ``order`` or an ``after`` that is no item of the response raises ArgumentError.
``save(path)`` writes every stored response to a JSON file atomically (each item once, by its id,
however many responses share it; least recently used first), and writes nothing while no response
was stored, deleted or loaded since its last save to that file; ``load(path)`` reads such a file
back into the store (the newest ``max_responses``; a missing file loads nothing), so a server
restarted with a session directory still continues ``previous_response_id``. A file that is not
such a snapshot raises :class:`FormatError` naming the field, and the store is left as it was. Safe
from any thread (one lock). It knows nothing about HTTP or generation.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nexus_mlx._platform.atomic_file import write_json
from nexus_mlx.errors import ArgumentError, FormatError

DEFAULT_MAX_RESPONSES = 1024
DEFAULT_PAGE_ITEMS = 20
MAX_PAGE_ITEMS = 100
_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}
SNAPSHOT_FORMAT = "nexus-mlx-responses"


@dataclass(frozen=True)
class StoredResponse:
    body: Mapping[str, Any]  # the response object as answered
    items: tuple[Mapping[str, Any], ...]  # the conversation a continuation starts from

    @property
    def input_items(self) -> tuple[Mapping[str, Any], ...]:
        """The items this response answered: its conversation but its own output."""
        return self.items[: len(self.items) - len(self.body.get("output") or ())]


class ResponseStore:
    """See the module docstring."""

    def __init__(self, max_responses: int = DEFAULT_MAX_RESPONSES) -> None:
        if isinstance(max_responses, bool) or not isinstance(max_responses, int) \
                or max_responses < 0:
            raise ArgumentError(f"max_responses must be an integer >= 0, got {max_responses!r}")
        self.max_responses = max_responses
        self._stored: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()
        self._changes = 0  # puts, deletes and loads so far
        self._saved: tuple[Path, int] | None = None  # the last save's file and changes then

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
            self._changes += 1
            self._stored[str(body["id"])] = StoredResponse(body, tuple(map(_with_id, items)))
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
            self._changes += 1
            return self._stored.pop(response_id, None) is not None

    def save(self, path: str | os.PathLike[str]) -> int:
        """Write the stored responses to ``path`` atomically (not again while nothing changed
        since the last save there); returns how many."""
        target = Path(path)
        with self._lock:
            if self._saved == (target, self._changes) and target.is_file():
                return len(self._stored)
            changes = self._changes
            items = {str(i["id"]): i for r in self._stored.values() for i in r.items}
            responses = [[r.body, [str(i["id"]) for i in r.items]] for r in self._stored.values()]
        write_json(target, {"format": SNAPSHOT_FORMAT, "items": items, "responses": responses})
        with self._lock:
            self._saved = (target, changes)
        return len(responses)

    def load(self, path: str | os.PathLike[str]) -> int:
        """Store the responses a :meth:`save` wrote to ``path``; returns how many were kept."""
        source = Path(path)
        if not source.is_file():
            return 0
        try:
            data = json.loads(source.read_text())
        except (OSError, ValueError) as exc:
            raise FormatError(f"{source} is not a readable responses snapshot: {exc}") from None
        loaded = _snapshot_entries(source, data)
        with self._lock:
            self._changes += 1
            for body, items in loaded:
                self._stored[str(body["id"])] = StoredResponse(body, items)
                self._stored.move_to_end(str(body["id"]))
            while len(self._stored) > self.max_responses:
                self._stored.popitem(last=False)
        return min(len(loaded), self.max_responses)


def _snapshot_entries(source: Path, data: Any) -> list[tuple[dict[str, Any], tuple[Any, ...]]]:
    """The (body, items) pairs of a snapshot, checked; FormatError naming the field."""
    if not isinstance(data, dict) or data.get("format") != SNAPSHOT_FORMAT:
        raise FormatError(f"{source}: field format is not {SNAPSHOT_FORMAT!r}")
    items, responses = data.get("items"), data.get("responses")
    if not isinstance(items, dict) or not all(isinstance(i, dict) for i in items.values()):
        raise FormatError(f"{source}: field items is not an object of items")
    if not isinstance(responses, list):
        raise FormatError(f"{source}: field responses is not a list")
    out = []
    for k, entry in enumerate(responses):
        ok = (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], dict)
              and "id" in entry[0] and isinstance(entry[1], list)
              and all(isinstance(i, str) and i in items for i in entry[1]))
        if not ok:
            raise FormatError(f"{source}: field responses[{k}] is not [response, item ids]")
        out.append((entry[0], tuple(items[i] for i in entry[1])))
    return out


def _with_id(item: Mapping[str, Any]) -> Mapping[str, Any]:
    """``item`` itself when it has an id, else a copy with a new one."""
    if "id" in item:
        return item
    prefix = _ID_PREFIX.get(str(item.get("type", "message")), "item")
    return {"id": f"{prefix}_{uuid.uuid4().hex}", **item}


def input_items_page(stored: StoredResponse, after: str | None = None,
                     limit: int = DEFAULT_PAGE_ITEMS, order: str = "desc") -> dict[str, Any]:
    """One page of ``stored``'s input items (module docstring)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE_ITEMS:
        raise ArgumentError(f"limit must be an integer from 1 to {MAX_PAGE_ITEMS}, got "
                            f"{limit!r:.40}")
    if order not in ("asc", "desc"):
        raise ArgumentError(f"order must be 'asc' or 'desc', got {order!r:.40}")
    items = list(stored.input_items if order == "asc" else reversed(stored.input_items))
    start = 0
    if after is not None:
        ids = [item.get("id") for item in items]
        if after not in ids:
            raise ArgumentError(f"after {after!r:.80} is no input item of this response")
        start = ids.index(after) + 1
    page = [_listed(item) for item in items[start: start + limit]]
    return {"object": "list", "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": start + limit < len(items)}


def _listed(item: Mapping[str, Any]) -> dict[str, Any]:
    """``item`` as the API lists it: a message's string content as one text part, a status."""
    listed = {"status": "completed", **item}
    if listed.get("type", "message") == "message":
        listed["type"] = "message"
        if isinstance(listed.get("content"), str):
            kind = "output_text" if listed.get("role") == "assistant" else "input_text"
            listed["content"] = [{"type": kind, "text": listed["content"]}]
    return listed
