"""Row-level edits of a session's live cache: moves, one packed compute pass, inexact rows,
healing, and spliced tool blocks.

Contract: ``CacheEditor(model, tokenizer, allocator, certified_head=True)`` owns a
:class:`~nexus_mlx.kv.cache.NexusCache` whose row ``r`` always holds position ``r``, the logits
after its last row (``logits``; ``next_row``: the same as a
:class:`~nexus_mlx.decode.certified_head.HeadRow` after a decoded token, when the model has a
certified head and ``certified_head`` is on, so the decoder may pick a greedy id without the
full projection), and one *inexact* flag per row: a row is inexact when its K/V were computed
in another context (moved by :meth:`move`, or placed from a compiled tool block) or on top of an
inexact row (computed after one that was not recomputed in the same pass). Exact rows equal a
fresh prefill's; healing every inexact row in one pass makes the whole cache exact.

- ``trim(keep)``: drop rows ``[keep, n_past)``.
- ``move(sources)``: rebuild the rows in one copy (:func:`~nexus_mlx.kv.regather.regather`):
  new row ``r`` copies old row ``sources[r]`` re-anchored, or is blank (``-1``); every copied row
  after the leading rows that stay in place (``sources[r] == r``) is inexact;
  ``flags_after_move(sources)`` says which rows a move would leave inexact, changing nothing.
- ``fill(new, fresh, budget, tools=..., blocks=...)``: bring rows to the ids ``new`` (the full
  sequence) by computing the rows ``fresh`` (blank, appended or overwritten). Fresh spans that
  match a compiled block of one of ``tools`` are placed from it instead (re-anchored, inexact).
  Then ``budget`` percent of the inexact rows (the allocator's choice, the computed tokens as
  the query) and the last row (when it is not computed) join the fresh rows in one packed
  forward pass: all advance through each layer together, in position order, in chunks of
  :data:`PREFILL_CHUNK`, fresh K/V written before attention. Afterwards blocks are cut for
  ``tools`` whose span was computed exactly. Returns a :class:`Fill`.
- ``advance(token)``: append one decoded token's row (inexact when any row before it is);
  ``advance_many(tokens, tail)``: several (a token and its drafts), returning the ``tail`` last
  rows' next-token rows (logits, or head rows as above).
- ``heal(max_rows)``: recompute the first ``max_rows`` (default all) inexact rows and the last
  row in one pass.

It does not render, align or decode, and does not restore anything on failure: a caller that
must leave the cache as it was takes :func:`~nexus_mlx.kv.regather.snapshot` /
:meth:`state` first and puts both back (see the session).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from nexus_mlx.decode.certified_head import CertifiedHead, HeadRow, full_logits
from nexus_mlx.decode.generate import next_rows
from nexus_mlx.kv.regather import regather
from nexus_mlx.kv.rope import reanchor
from nexus_mlx.models.forward import forward, make_cache
from nexus_mlx.refresh.allocators import AllocationRequest, checked_selection, get_allocator
from nexus_mlx.refresh.budget import budget_tokens
from nexus_mlx.refresh.edit import Edit

if TYPE_CHECKING:
    from nexus_mlx.agent.tool_blocks import ToolBlocks

PREFILL_CHUNK = 512  # rows per forward call (as mlx-lm's prefill_step_size): bounded memory
QUERY_FALLBACK = 64  # tokens before the end used as the query when nothing new is computed
Tool = Mapping[str, Any]


@dataclass(frozen=True)
class Fill:
    computed: int  # fresh rows computed
    spliced: int  # fresh rows placed from compiled tool blocks
    repaired: int  # inexact rows recomputed (the budget's choice, and the last row)


class CacheEditor:
    """See the module docstring."""

    def __init__(self, model: nn.Module, tokenizer: Any, allocator: str,
                 certified_head: bool = True) -> None:
        self.model, self.tokenizer, self.allocator = model, tokenizer, allocator
        self.certified_head = certified_head
        self.cache = make_cache(model)
        self.next_row: HeadRow | mx.array | None = None  # the next token's row (see above)
        self._inexact = np.zeros(0, bool)  # per row; rows past its end are exact

    @property
    def logits(self) -> mx.array | None:
        """The next token's logits ``(V,)`` (the full projection of :attr:`next_row`)."""
        return None if self.next_row is None else full_logits(self.next_row)

    @logits.setter
    def logits(self, value: HeadRow | mx.array | None) -> None:
        self.next_row = value

    # ---- state --------------------------------------------------------------------------
    def flags(self) -> np.ndarray:
        """The inexact flag of every live row (a copy)."""
        out = np.zeros(self.cache.n_past, bool)
        k = min(self._inexact.size, out.size)
        out[:k] = self._inexact[:k]
        return out

    def set_flags(self, flags: np.ndarray) -> None:
        self._inexact = np.asarray(flags, bool).copy()

    def inexact_rows(self) -> np.ndarray:
        return np.flatnonzero(self.flags())

    def state(self) -> tuple[np.ndarray, HeadRow | mx.array | None]:
        """What besides the cache rows a failed edit must put back."""
        return self.flags(), self.next_row

    def restore_state(self, state: tuple[np.ndarray, HeadRow | mx.array | None]) -> None:
        self.set_flags(state[0])
        self.next_row = state[1]

    # ---- structure ----------------------------------------------------------------------
    def trim(self, keep: int) -> None:
        flags = self.flags()[:keep]
        self.cache.trim(keep)
        self.set_flags(flags)

    def move(self, sources: np.ndarray) -> None:
        flags = self.flags_after_move(sources)
        regather(self.cache, sources, np.arange(sources.size))  # moved keys re-anchored
        self.set_flags(flags)

    def flags_after_move(self, sources: np.ndarray) -> np.ndarray:
        """The inexact flags :meth:`move` would leave for ``sources`` (nothing is changed)."""
        moved = sources != np.arange(sources.size)
        kept = int(np.argmax(moved)) if moved.any() else sources.size  # rows left in place
        flags = _taken(self.flags(), sources)
        flags[kept:] |= sources[kept:] >= 0  # their context changed: inexact
        return flags

    # ---- computing ----------------------------------------------------------------------
    def fill(self, new: np.ndarray, fresh: np.ndarray, budget: float, *,
             tools: Sequence[Tool] = (), blocks: ToolBlocks | None = None) -> Fill:
        if blocks is not None and tools:
            blocks.prepare(tools)
        spliced = self._place_blocks(new, fresh, tools, blocks) if blocks is not None else None
        if spliced is not None and spliced.size:
            fresh = np.setdiff1d(fresh, spliced)
        chosen = self._choose(new, self.inexact_rows(), fresh, budget)
        last = new.size - 1
        if not (fresh.size and fresh.max() == last) and last not in chosen:
            chosen = np.union1d(chosen, [last]).astype(np.int64)
        self.compute(new, np.concatenate([fresh, chosen]))
        if blocks is not None and tools:
            exact = ~self.flags()
            exact &= np.cumsum(~exact) == 0  # no inexact row before
            computed = np.zeros(new.size, bool)
            computed[fresh] = True
            blocks.harvest(self.cache, new, tools, exact & computed)
        return Fill(int(fresh.size), 0 if spliced is None else int(spliced.size),
                    int(chosen.size))

    def compute(self, new: np.ndarray, rows: np.ndarray) -> None:
        """The packed pass of :meth:`fill` over exactly ``rows`` (see the module docstring)."""
        rows = np.unique(rows)
        for start in range(0, rows.size, PREFILL_CHUNK):
            chunk = rows[start:start + PREFILL_CHUNK]
            logits = forward(self.model, new[chunk], self.cache, positions=chunk, rows=chunk,
                             logits="last")
            self.cache.evaluate()
        flags = self.flags()
        flags[rows] = False
        left = np.flatnonzero(flags)
        if left.size:  # computed on top of a row that is still inexact
            flags[rows[rows > left[0]]] = True
        self.set_flags(flags)
        self.logits = logits[0, -1]
        mx.eval(self.logits)

    def advance(self, token: int) -> mx.array:
        """Append the row of one decoded ``token``; returns the next token's logits ``(V,)``.
        The row is inexact when any row before it is (it attended to them). On failure the
        cache and logits are as they were."""
        return full_logits(self.advance_many([token], 1)[0])

    def advance_many(self, tokens: Sequence[int], tail: int) -> Sequence[HeadRow | mx.array]:
        """Append the rows of ``tokens`` (a decoded token and drafts after it,
        :mod:`~nexus_mlx.decode.lookahead`); returns the next-token rows of the last ``tail``
        of them (logits ``(V,)``, or head rows where the model has a certified head), the last
        as :attr:`next_row`. Rows are flagged as :meth:`advance` flags one; on failure the
        cache and logits are as they were."""
        keep, on_inexact = self.cache.n_past, bool(self._inexact.any())
        head = CertifiedHead.of(self.model) if self.certified_head else None
        try:
            rows = next_rows(self.model, list(tokens), self.cache, tail, head)
        except BaseException:
            self.cache.trim(min(keep, self.cache.n_past))
            raise
        if on_inexact:
            flags = self.flags()
            flags[keep:] = True
            self.set_flags(flags)
        self.next_row = rows[-1]
        return rows

    def drop(self, n: int, row: HeadRow | mx.array) -> None:
        """Remove the last ``n`` rows; ``row`` is the next-token row of the row then last."""
        self.trim(self.cache.n_past - n)
        self.next_row = row

    def heal_rows(self, max_rows: int | None = None) -> np.ndarray:
        """The rows :meth:`heal` recomputes: the first ``max_rows`` inexact rows and the last
        row (none when no row is inexact)."""
        rows = self.inexact_rows()[:max_rows]
        return np.union1d(rows, [self.cache.n_past - 1]) if rows.size else rows

    def heal(self, max_rows: int | None = None) -> int:
        healed = int(self.inexact_rows()[:max_rows].size)
        if healed:
            self.compute(self.cache.tokens[: self.cache.n_past], self.heal_rows(max_rows))
        return healed

    def _choose(self, new: np.ndarray, inexact: np.ndarray, computed: np.ndarray,
                budget: float) -> np.ndarray:
        """``budget`` percent of the inexact rows, the allocator's choice for the computed
        tokens (or the last tokens) as the query."""
        b = budget_tokens(inexact.size, budget) if inexact.size else 0
        query = new[computed] if computed.size else new[max(0, new.size - QUERY_FALLBACK):]
        if not b or not query.size:
            return np.zeros(0, np.int64)
        request = AllocationRequest(self.model, self.cache, self.cache,
                                    Edit(int(inexact[0]), int(inexact[0])), query, b,
                                    self.tokenizer, suffix=new[inexact])
        picked = checked_selection(get_allocator(self.allocator)(request), inexact.size, b,
                                   self.allocator)
        return inexact[picked].astype(np.int64)

    # ---- tool blocks --------------------------------------------------------------------
    def _place_blocks(self, new: np.ndarray, fresh: np.ndarray, tools: Sequence[Tool],
                      blocks: ToolBlocks) -> np.ndarray:
        """Write the blocks of ``tools`` that occur on fresh rows; returns the rows placed."""
        allowed = np.zeros(new.size, bool)
        allowed[fresh] = True
        found = blocks.occurrences(new, tools, allowed)
        if not found:
            return np.zeros(0, np.int64)
        end = max(start + block.num_tokens for start, block in found)
        if end > self.cache.n_past:  # room for them: placeholder rows the pass overwrites
            self._reserve(new, end)
        placed = []
        for start, block in found:
            rows = np.arange(start, start + block.num_tokens)
            delta = start - block.m0
            keys = [reanchor(block.keys(layer), delta, spec)
                    for layer, spec in enumerate(self.cache.rope_specs)]
            values = [block.values(layer) for layer in range(self.cache.num_layers)]
            self.cache.write(rows, keys, values, rows=rows, tokens=np.array(block.tokens))
            placed.append(rows)
        self.cache.evaluate()
        rows = np.concatenate(placed)
        flags = self.flags()
        flags[rows] = True
        self.set_flags(flags)
        return rows

    def _reserve(self, new: np.ndarray, end: int) -> None:
        """Extend the cache to ``end`` rows of zero K/V (every one is overwritten before any
        query reads it: they are fresh rows of the coming pass or placed block rows)."""
        n = self.cache.n_past
        shape = (1, self.cache.n_kv_heads, end - n, self.cache.head_dim)
        zeros = mx.zeros(shape, self.cache.dtype)
        self.cache.write(np.arange(n, end), [zeros] * self.cache.num_layers,
                         [zeros] * self.cache.num_layers, tokens=new[n:end])


def _taken(old: np.ndarray, sources: np.ndarray) -> np.ndarray:
    """The old flags of the rows ``sources`` copies (False for blanks)."""
    out = np.zeros(sources.size, bool)
    copied = sources >= 0
    out[copied] = old[sources[copied]]
    return out
