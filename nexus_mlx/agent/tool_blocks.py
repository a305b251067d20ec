"""Compiled tool definitions for live sessions: each tool's K/V as the chat template renders it,
content-addressed, spliced into later requests instead of prefilled (paper 1's compiled blocks).

Contract: ``ToolBlocks(model, render, template, source=...)`` is shared by the sessions of one
model and one renderer (``render(messages, tools) -> ids``, a session's own
:meth:`Session.render`; ``template``: any string naming the chat template, hashed into the
keys). ``source`` says where blocks come from: ``"harvest"`` (default) cuts them from the first
live cache that computes a tool exactly (free, but which session ran first decides their
context); ``"compile"`` compiles every tool of a request before its first use, so a block never
depends on the order of traffic (a server's choice: each reply depends on its own conversation
only).

- ``span(tool)``: the token ids the template renders for one tool's definition: a one-message
  request is rendered with a sentinel tool, with and without ``tool``, and the interior of the
  difference is kept (its first and last tokens are dropped, since a tokenizer may merge them
  with their neighbours). None when the renderer shows no difference.
- ``key(tool)``: SHA-256 of the tool's canonical JSON, the model fingerprint and the template.
- ``harvest(cache, ids, tools, fresh)``: for each tool with no block yet whose span occurs in
  ``ids`` on rows that were just computed in context (``fresh``), cut those rows out of the live
  cache as its block (free: no extra forward pass).
- ``compile(tools)``: prefill the sentinel request up to each missing tool's span and cut it (for
  servers that compile their tools before the first request).
- ``occurrences(ids, tools, allowed)``: where blocks of ``tools`` occur in ``ids`` on allowed
  rows, non-overlapping, in position order: each ``(start, block)``.

Blocks keep the cache's dtype and are evicted least recently used beyond ``max_bytes``; the
rendered spans, beyond :data:`MAX_SPANS` tools. They are
valid only for this model (checked when built: a session with another model is refused). It
neither splices nor repairs; the session writes a block's rows re-anchored to where its span
occurs and treats them as stale (computed after another context).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from nexus_mlx.blocks.block import CompiledBlock, block_from_cache
from nexus_mlx.errors import ArgumentError
from nexus_mlx.kv.cache import NexusCache
from nexus_mlx.models.fingerprint import model_fingerprint
from nexus_mlx.models.forward import forward, make_cache

Render = Callable[[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]] | None], list[int]]
PROBE = [{"role": "user", "content": "Which tool fits?"}]
SENTINEL = {"type": "function", "function": {
    "name": "nexus_sentinel", "description": "A placeholder tool that is never called.",
    "parameters": {"type": "object", "properties": {}}}}
MIN_SPAN = 8  # shorter spans are not worth a block
MAX_SPANS = 1024  # rendered spans remembered (least recently used forgotten first)
SOURCES = ("harvest", "compile")


def _canonical(tool: Mapping[str, Any]) -> str:
    return json.dumps(tool, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _find(haystack: bytes, needle: bytes, start: int = 0) -> int:
    """Token index of the first int32-aligned occurrence of ``needle`` at or after ``start``."""
    at = haystack.find(needle, start * 4)
    while at != -1 and at % 4:
        at = haystack.find(needle, at + 1)
    return -1 if at == -1 else at // 4


class ToolBlocks:
    """See the module docstring."""

    def __init__(self, model: nn.Module, render: Render, template: str = "", *,
                 source: str = "harvest", max_bytes: int = 256 << 20) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ArgumentError(f"max_bytes must be a byte count >= 0, got {max_bytes!r}")
        if source not in SOURCES:
            raise ArgumentError(f"source {source!r} is not one of {SOURCES}")
        self.model, self.render, self.max_bytes = model, render, max_bytes
        self.source = source
        self._salt = model_fingerprint(model).weights_digest + hashlib.sha256(
            template.encode()).hexdigest()
        self._spans: OrderedDict[str, tuple[int, ...] | None] = OrderedDict()
        self._blocks: OrderedDict[str, CompiledBlock] = OrderedDict()
        self._lock = threading.RLock()

    # ---- identity -----------------------------------------------------------------------
    def key(self, tool: Mapping[str, Any]) -> str:
        return hashlib.sha256((_canonical(tool) + self._salt).encode()).hexdigest()

    def span(self, tool: Mapping[str, Any]) -> tuple[int, ...] | None:
        key = self.key(tool)
        with self._lock:
            if key not in self._spans:
                self._spans[key] = self._rendered_span(tool)[0]
                if len(self._spans) > MAX_SPANS:  # tools that change per request: stay bounded
                    self._spans.popitem(last=False)
            self._spans.move_to_end(key)
            return self._spans[key]

    def _rendered_span(self, tool: Mapping[str, Any]) -> tuple[tuple[int, ...] | None, list[int]]:
        """(span, the sentinel request with the tool) — see ``span`` in the module docstring."""
        without = np.array(self.render(PROBE, [SENTINEL]), np.int64)
        ids = self.render(PROBE, [SENTINEL, dict(tool)])
        with_tool = np.array(ids, np.int64)
        n = min(without.size, with_tool.size)
        head = int(np.argmax(without[:n] != with_tool[:n])) if (without[:n] != with_tool[:n]).any() else n
        tail = 0
        while tail < n - head and without[-1 - tail] == with_tool[-1 - tail]:
            tail += 1
        interior = with_tool[head + 1 : with_tool.size - tail - 1]
        return (tuple(int(t) for t in interior) if interior.size >= MIN_SPAN else None), ids

    # ---- the store ----------------------------------------------------------------------
    def block(self, tool: Mapping[str, Any]) -> CompiledBlock | None:
        with self._lock:
            found = self._blocks.get(self.key(tool))
            if found is not None:
                self._blocks.move_to_end(self.key(tool))
            return found

    def __len__(self) -> int:
        return len(self._blocks)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(b.k.nbytes + b.v.nbytes for b in self._blocks.values())

    def _store(self, key: str, block: CompiledBlock) -> None:
        mx.eval(block.k, block.v)
        with self._lock:
            self._blocks[key] = block
            self._blocks.move_to_end(key)
            total = self.nbytes
            while total > self.max_bytes and self._blocks:
                _, old = self._blocks.popitem(last=False)
                total -= old.k.nbytes + old.v.nbytes

    def check_model(self, model: nn.Module) -> None:
        if model is not self.model:
            raise ArgumentError("these tool blocks were built for another loaded model")

    # ---- filling ------------------------------------------------------------------------
    def prepare(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """Before a request uses ``tools``: compile the missing blocks (source ``"compile"``)."""
        return self.compile(tools) if self.source == "compile" else 0

    def harvest(self, cache: NexusCache, ids: np.ndarray, tools: Sequence[Mapping[str, Any]],
                fresh: np.ndarray) -> int:
        """Blocks cut from ``cache`` for tools whose span sits on fresh rows (source
        ``"harvest"``; nothing otherwise); returns how many."""
        if self.source != "harvest":
            return 0
        haystack = np.asarray(ids, np.int32).tobytes()
        made = 0
        for tool in tools:
            span = self.span(tool)
            if span is None or self.block(tool) is not None:
                continue
            start = _find(haystack, np.asarray(span, np.int32).tobytes())
            stop = start + len(span)
            if start < 0 or stop > cache.n_past or not fresh[start:stop].all():
                continue
            self._store(self.key(tool), block_from_cache(self.model, cache, start, stop,
                                                         dtype=_dtype(cache)))
            made += 1
        return made

    def compile(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """Prefill and store every missing block of ``tools``; returns how many were made."""
        made = 0
        for tool in tools:
            if self.block(tool) is not None:
                continue
            span, ids = self._rendered_span(tool)
            if span is None:
                continue
            start = _find(np.asarray(ids, np.int32).tobytes(), np.asarray(span, np.int32).tobytes())
            cache = make_cache(self.model)
            forward(self.model, ids[: start + len(span)], cache)
            cache.evaluate()
            self._store(self.key(tool), block_from_cache(self.model, cache, start,
                                                         start + len(span), dtype=_dtype(cache)))
            made += 1
        return made

    # ---- finding ------------------------------------------------------------------------
    def occurrences(self, ids: np.ndarray, tools: Sequence[Mapping[str, Any]],
                    allowed: np.ndarray) -> list[tuple[int, CompiledBlock]]:
        haystack = np.asarray(ids, np.int32).tobytes()
        taken = np.zeros(len(ids), bool)
        found: list[tuple[int, CompiledBlock]] = []
        for tool in tools:
            block = self.block(tool)
            if block is None:
                continue
            needle = np.asarray(block.tokens, np.int32).tobytes()
            start = _find(haystack, needle)
            while start >= 0:
                stop = start + block.num_tokens
                if allowed[start:stop].all() and not taken[start:stop].any():
                    taken[start:stop] = True
                    found.append((start, block))
                    break
                start = _find(haystack, needle, start + 1)
        return sorted(found, key=lambda item: item[0])


def _dtype(cache: NexusCache) -> str:
    return "float32" if cache.dtype == mx.float32 else "float16"
