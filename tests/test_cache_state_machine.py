"""A hypothesis state machine over every operation that mutates a :class:`NexusCache`.

Rules: append (``forward``, also into position gaps), ``remove``, ``shift``, ``trim``, ``fork`` /
``copy``, ``splice`` of compiled blocks (bare, repaired, 100% prefill, anchored), ``repair``
(budgeted, in place or not) and ``refresh``, each drawing valid and invalid arguments (ranges
outside ``[0, n_past)``, bools, floats, positions past the model's limit or already held by a
live row, overflowing capacity, unknown executors, bad budgets and curves...). The machine keeps
its own model of what the cache claims to hold — per row a token id, a position and whether the
row is *exact* — and predicts whether each call must succeed or be refused.

After every step:
- a refused call raised a ``NexusError`` and left the cache byte-identical (whole K/V storage,
  positions, token ids, n_past, capacity); an accepted call was predicted valid;
- the cache is well formed: n_past, token ids and positions equal the model's, positions are
  distinct and inside ``[0, 4096)``, every K/V entry is finite;
- against a fresh prefill of the claimed sequence (its tokens at its positions, one forward):
  every row's layer-0 K and V within 1e-4 (they depend on token and position only, so even a
  stale row must match; the keys' drift from repeated shifts, about 2**-22 * max|K| per shift,
  is far below it), and every *exact* row's K/V in every layer within 1e-4; when every row is
  exact, the next-token logits within 1e-4 too;
- each operation's exact parts: untouched rows bit for bit, moved or spliced V bit for bit,
  moved or spliced keys within 1e-5 of one re-anchor of what was there.

The envelope for inexact operations (Shift, bare / partly repaired splices, partial budgets,
removals that leave a stale suffix): nothing is claimed beyond layer 0 and the exact parts
above. A row is exact when it was computed (or spliced anchored) under exactly the rows now
before it: appending keeps it; removing or inserting a row below it, or moving it relative to
the rows below it, makes it stale; a recompute makes it exact again iff every row below it that
was not recomputed in the same pass is exact; shifting a row together with every row below it
keeps it exact (RoPE sees relative positions only).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from cache_oracle import fresh_prefill, max_diff, snapshot
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from tiny_models import VOCAB, tiny_model

from nexus_mlx.blocks.compile import compile_block
from nexus_mlx.blocks.curve import Curve
from nexus_mlx.blocks.splicing import splice
from nexus_mlx.errors import NexusError
from nexus_mlx.kv.cache import NexusCache
from nexus_mlx.kv.rope import reanchor
from nexus_mlx.models.forward import forward, make_cache
from nexus_mlx.refresh import Edit, budget_tokens, refresh, repair

TOL = 1e-4
MOVE_TOL = 1e-5
LIMIT = 4096  # the tiny model's max_position_embeddings
MAX_TOKENS = 40
STEP = 16
QUERY = [3, 4, 5]
MODEL = tiny_model("llama")
_rng = np.random.default_rng(11)
CONTEXT = _rng.integers(0, VOCAB, 4).tolist()
BLOCKS = {
    "plain": compile_block(MODEL, None, _rng.integers(0, VOCAB, 6).tolist()),  # m0 0, no context
    "context": compile_block(MODEL, None, _rng.integers(0, VOCAB, 5).tolist(), context=CONTEXT),
    "far": compile_block(MODEL, None, _rng.integers(0, VOCAB, 3).tolist(), anchor=50),
}
CURVES: dict[str, Any] = {
    "default": Curve(), "half": Curve(R_base=50.0), "full": Curve(R_base=100.0), "bare": None,
    "bogus": "trailing", "sur-no-query": "sur",
}
STATS: Counter[str] = Counter()


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _range_ok(p0: object, p1: object, n: int) -> bool:
    return _is_int(p0) and _is_int(p1) and 0 <= p0 <= p1 <= n  # type: ignore[operator]


def _bound(n: int) -> st.SearchStrategy[Any]:
    """A row bound: mostly inside ``[0, n]``, sometimes outside it or a bool."""
    return st.one_of(st.integers(0, n), st.integers(0, n), st.integers(-3, n + 3), st.booleans())


def _range(n: int, nonempty: bool = False) -> st.SearchStrategy[tuple[Any, Any]]:
    """``(p0, p1)``: three times in four a valid range of ``[0, n]`` (non-empty if asked and
    possible), else two independent, possibly invalid bounds."""
    lo = 1 if nonempty and n else 0
    valid = st.tuples(st.integers(0, n), st.integers(0, n)).map(
        lambda ab: (min(ab), max(ab)) if not lo or ab[0] != ab[1] else (max(ab[0] - 1, 0), max(ab[0], 1))
    )
    return st.one_of(valid, valid, valid, st.tuples(_bound(n), _bound(n)))


class CacheMachine(RuleBasedStateMachine):
    # ---- the model of what the cache claims ---------------------------------------------
    def _set(self, tokens: np.ndarray, positions: np.ndarray, exact: np.ndarray) -> None:
        self.tok = np.asarray(tokens, np.int64)
        self.pos = np.asarray(positions, np.int64)
        self.exact = np.asarray(exact, bool)

    def _stale_above(self, positions: np.ndarray) -> None:
        """Rows above the lowest of ``positions`` saw a different context."""
        if len(positions):
            self.exact &= self.pos < int(np.min(positions))

    def _drop(self, rows: np.ndarray) -> None:
        self._stale_above(self.pos[rows])
        keep = np.setdiff1d(np.arange(self.tok.size), rows)
        self._set(self.tok[keep], self.pos[keep], self.exact[keep])

    def _recompute(self, rows: np.ndarray) -> None:
        """Rows recomputed in one pass: exact iff every other row below them is exact."""
        others = np.setdiff1d(np.arange(self.tok.size), rows)
        for r in rows:
            below = others[self.pos[others] < self.pos[r]]
            self.exact[r] = bool(self.exact[below].all())

    def _move(self, moved: np.ndarray, delta: int) -> None:
        old = self.pos.copy()
        new = old.copy()
        new[moved] += delta
        is_moved = np.zeros(old.size, bool)
        is_moved[moved] = True
        exact = self.exact.copy()
        for r in range(old.size):
            if is_moved[r]:
                exact[r] &= bool(is_moved[old < old[r]].all() and is_moved[new < new[r]].all())
            else:
                exact[r] &= not bool((old[is_moved] < old[r]).any() or (new[is_moved] < old[r]).any())
        self._set(self.tok, new, exact)

    def _free(self, positions: np.ndarray) -> bool:
        return bool(np.all((positions >= 0) & (positions < LIMIT))) and (
            np.unique(positions).size == positions.size and not np.isin(positions, self.pos).any()
        )

    def _linear(self) -> bool:
        return bool(np.array_equal(self.pos, np.arange(self.pos.size)))

    # ---- running one call -----------------------------------------------------------------
    def _attempt(self, name: str, expect_ok: bool, call: Any) -> Any:
        before = snapshot(self.cache)
        self.before_k = [np.array(self.cache.keys(i)) for i in range(self.cache.num_layers)]
        self.before_v = [np.array(self.cache.values(i)) for i in range(self.cache.num_layers)]
        try:
            out = call()
        except NexusError as exc:
            STATS[f"{name} refused"] += 1
            assert not expect_ok, f"{name} was refused but should succeed: {exc!r}"
            assert str(exc)
            assert snapshot(self.cache) == before, f"refused {name} changed the cache"
            return None
        STATS[f"{name} ok"] += 1
        assert expect_ok, f"{name} should have been refused"
        return out if out is not None else True

    def _same_rows(self, old_rows: np.ndarray, new_rows: np.ndarray) -> None:
        """Rows ``new_rows`` now hold exactly (bit for bit) what ``old_rows`` held."""
        for i in range(self.cache.num_layers):
            k, v = np.array(self.cache.keys(i)), np.array(self.cache.values(i))
            assert np.array_equal(k[:, :, new_rows], self.before_k[i][:, :, old_rows])
            assert np.array_equal(v[:, :, new_rows], self.before_v[i][:, :, old_rows])

    # ---- rules ------------------------------------------------------------------------------
    @initialize()
    def start(self) -> None:
        STATS["examples"] += 1
        self.cache = make_cache(MODEL, max_tokens=MAX_TOKENS)
        self.cache.step = STEP
        self._set(np.zeros(0), np.zeros(0), np.zeros(0, bool))

    @rule(data=st.data())
    def append(self, data: st.DataObject) -> None:
        n = self.tok.size
        kind = data.draw(st.sampled_from(
            ["cursor"] * 6 + ["context", "gap", "into_gap", "vocab", "float", "collide", "limit",
                              "count"]))
        tokens: Any = data.draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6))
        if kind == "context":  # the "context" block's compile-time context: anchored splices
            tokens = list(CONTEXT)
        start = int(self.pos.max()) + 1 if n else 0
        positions: Any = np.arange(start, start + len(tokens))
        if kind == "gap":
            positions = positions + data.draw(st.integers(1, 5))
        elif kind == "into_gap":
            free = np.setdiff1d(np.arange(start), self.pos)
            if free.size:
                tokens, positions = tokens[:1], free[data.draw(st.integers(0, free.size - 1))][None]
        elif kind == "vocab":
            tokens = [*tokens, VOCAB]
            positions = np.arange(start, start + len(tokens))
        elif kind == "float":
            tokens = [float(t) for t in tokens]
        elif kind == "collide" and n:
            positions = np.concatenate([positions[:-1], self.pos[-1:]])
        elif kind == "limit":
            positions = np.arange(LIMIT - len(tokens) + 1, LIMIT + 1)
        elif kind == "count":
            positions = positions[:-1] if len(tokens) > 1 else np.arange(start, start + 2)
        valid_tokens = kind not in ("vocab", "float")
        expect = (valid_tokens and len(positions) == len(tokens) and self._free(positions)
                  and n + len(tokens) <= MAX_TOKENS)
        ok = self._attempt("append", expect,
                           lambda: forward(MODEL, tokens, self.cache, positions=positions))
        if ok is None:
            return
        self._same_rows(np.arange(n), np.arange(n))  # writes only new rows
        self._stale_above(positions)
        self._set(np.concatenate([self.tok, tokens]), np.concatenate([self.pos, positions]),
                  np.concatenate([self.exact, np.zeros(len(tokens), bool)]))
        self._recompute(np.arange(n, n + len(tokens)))

    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        n = self.tok.size
        p0, p1 = data.draw(_range(n))
        expect = _range_ok(p0, p1, n)
        if self._attempt("remove", expect, lambda: self.cache.remove(p0, p1)) is None:
            return
        keep = np.r_[0:p0, p1:n]
        self._same_rows(keep, np.arange(keep.size))
        self._drop(np.arange(p0, p1))

    @rule(data=st.data())
    def trim(self, data: st.DataObject) -> None:
        n = self.tok.size
        m = data.draw(_bound(n))
        expect = _is_int(m) and 0 <= m <= n
        if self._attempt("trim", expect, lambda: self.cache.trim(m)) is None:
            return
        self._same_rows(np.arange(m), np.arange(m))
        self._drop(np.arange(m, n))

    @rule(data=st.data())
    def shift(self, data: st.DataObject) -> None:
        n = self.tok.size
        p0, p1 = data.draw(_range(n, nonempty=True))
        delta = data.draw(st.one_of(st.integers(-40, 40), st.integers(-40, 40), st.booleans(),
                                    st.sampled_from([LIMIT, -LIMIT, 0.5, 2.0])))
        expect = _range_ok(p0, p1, n) and _is_int(delta)
        moved = np.arange(p0, p1) if expect else np.zeros(0, np.int64)
        if expect and moved.size and delta:
            others = np.setdiff1d(np.arange(n), moved)
            new = self.pos[moved] + delta
            expect = bool(np.all((new >= 0) & (new < LIMIT))) and not np.isin(new, self.pos[others]).any()
        if self._attempt("shift", expect, lambda: self.cache.shift(p0, p1, delta)) is None:
            return
        unmoved = np.setdiff1d(np.arange(n), moved)
        for i, spec in enumerate(self.cache.rope_specs):
            k, v = np.array(self.cache.keys(i)), np.array(self.cache.values(i))
            assert np.array_equal(v, self.before_v[i])  # V never changes
            assert np.array_equal(k[:, :, unmoved], self.before_k[i][:, :, unmoved])
            if moved.size and delta:
                want = reanchor(mx.array(self.before_k[i][:, :, moved]), int(delta), spec)
                assert max_diff(k[:, :, moved], want) <= MOVE_TOL
        if moved.size and delta:
            self._move(moved, int(delta))

    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        n = self.tok.size
        whole = data.draw(st.booleans())
        p0, p1 = (0, n) if whole else data.draw(_range(n))
        expect = _range_ok(p0, p1, n)
        before = snapshot(self.cache)
        out = self._attempt("fork", expect,
                            lambda: self.cache.copy() if whole else self.cache.fork(p0, p1))
        if out is None:
            return
        assert snapshot(self.cache) == before  # forking never touches the source
        assert isinstance(out, NexusCache) and out.n_past == p1 - p0
        assert np.array_equal(out.positions, self.pos[p0:p1])
        for i in range(out.num_layers):
            assert np.array_equal(np.array(out.keys(i)), self.before_k[i][:, :, p0:p1])
            assert np.array_equal(np.array(out.values(i)), self.before_v[i][:, :, p0:p1])
        if out.n_past < MAX_TOKENS:  # the copy is independent: writing it leaves the source alone
            free = np.setdiff1d(np.arange(LIMIT - 8, LIMIT), out.positions)
            forward(MODEL, [1], out.fork(), positions=free[-1:])
            assert snapshot(self.cache) == before
        if data.draw(st.booleans()):  # carry on with the fork
            self.cache = out
            self._drop(np.r_[0:p0, p1:n])

    @rule(data=st.data())
    def do_splice(self, data: st.DataObject) -> None:
        n = self.tok.size
        name = data.draw(st.sampled_from(sorted(BLOCKS)))
        block = BLOCKS[name]
        s = block.num_tokens
        curve_name = data.draw(st.sampled_from(
            ["default", "default", "half", "full", "bare", "bare", "bogus", "sur-no-query"]))
        curve = CURVES[curve_name]
        nxt = int(self.pos.max()) + 1 if n else 0
        at: Any = data.draw(st.one_of(
            st.none(), st.none(), st.none(), st.integers(0, 60), st.just(block.m0),
            st.sampled_from([True, -1, 2.0, LIMIT - s, LIMIT - s + 1, 10**6])))
        at_value = nxt if at is None else at
        positions = np.arange(at_value, at_value + s) if _is_int(at_value) else np.zeros(0)
        expect = (
            _is_int(at_value) and at_value >= 0 and self._free(positions)
            and n + s <= MAX_TOKENS and curve_name not in ("bogus", "sur-no-query")
        )
        anchored = bool(
            expect and at_value == block.m0 and n == block.m0 == len(block.header.context)
            and self._linear() and np.array_equal(self.tok, block.header.context)
        )
        result = self._attempt("splice", expect,
                               lambda: splice(MODEL, self.cache, block, at=at, curve=curve))
        if result is None:
            return
        STATS[f"splice {result.path}"] += 1
        self._same_rows(np.arange(n), np.arange(n))  # rows before the block are untouched
        assert result.rows == (n, n + s) and result.at == at_value
        assert np.array_equal(self.cache.positions[n:], positions)
        assert np.array_equal(self.cache.tokens[n:], block.tokens)
        if anchored:
            want_path, picked = "anchored", np.zeros(0, np.int64)
        elif curve is None:
            want_path, picked = "bare", np.zeros(0, np.int64)
        else:
            count = curve.tokens(s, n)
            want_path = "prefill" if count == s else "repaired"
            picked = np.arange(s - count, s)
        assert result.path == want_path and result.recomputed == picked.size
        kept = np.setdiff1d(np.arange(s), picked)  # block rows left as spliced
        for i, spec in enumerate(self.cache.rope_specs):
            k = np.array(self.cache.keys(i))[:, :, n + kept]
            v = np.array(self.cache.values(i))[:, :, n + kept]
            want_k = reanchor(block.keys(i), result.delta, spec)
            assert max_diff(k, np.array(want_k)[:, :, kept]) <= MOVE_TOL
            assert np.array_equal(v, np.array(block.values(i))[:, :, kept])
        self._stale_above(positions)
        self._set(np.concatenate([self.tok, block.tokens]), np.concatenate([self.pos, positions]),
                  np.concatenate([self.exact, np.full(s, anchored)]))
        self._recompute(n + picked)

    @rule(data=st.data())
    def do_repair(self, data: st.DataObject) -> None:
        self._repair(data, valid=False)

    @precondition(lambda self: self.tok.size > 0 and self._linear())
    @rule(data=st.data())
    def repair_one_context(self, data: st.DataObject) -> None:
        """The same rule where an edit applies (one linear context) with valid arguments, so
        that repairs are accepted often enough."""
        self._repair(data, valid=True)

    def _repair(self, data: st.DataObject, valid: bool) -> None:
        n = self.tok.size
        bad_budgets = st.sampled_from([True, False, 120, -1, math.nan, "5"])
        if valid:
            p0 = data.draw(st.integers(0, n - 1))
            p1 = data.draw(st.integers(p0 + 1, n))
        else:
            p0, p1 = data.draw(_range(n, nonempty=True))
        budget: Any = data.draw(st.one_of(
            st.sampled_from([0, 5, 50, 100]), st.floats(0, 100),
            *([] if valid else [bad_budgets])))
        executor = data.draw(st.sampled_from(["packed", "sequential"] + ([] if valid else ["turbo"])))
        in_place = data.draw(st.booleans())
        query = QUERY if valid else data.draw(st.sampled_from([QUERY, QUERY, []]))
        valid_budget = (isinstance(budget, int | float) and not isinstance(budget, bool)
                        and 0 <= budget <= 100)
        expect = (_is_int(p0) and _is_int(p1) and 0 <= p0 < p1 <= n and self._linear()
                  and valid_budget and executor != "turbo" and len(query) > 0)
        before = snapshot(self.cache)
        result = self._attempt("repair", expect, lambda: repair(
            MODEL, self.cache, Edit(p0, p1), query, budget=budget, allocator="legolink",
            executor=executor, in_place=in_place))
        if result is None:
            return
        size, suffix = p1 - p0, n - p1
        assert result.suffix_length == suffix
        assert result.budget_tokens == budget_tokens(suffix, budget) == result.rows.size
        assert np.array_equal(result.rows, result.selected + p0)
        if in_place:
            assert result.cache is self.cache
        else:
            assert snapshot(self.cache) == before  # not in place: the input is untouched
            self.cache = result.cache
        self._same_rows(np.arange(p0), np.arange(p0))  # the prefix never changes
        stale = np.setdiff1d(np.arange(p0, n - size), result.rows)  # shifted, not recomputed
        for i, spec in enumerate(self.cache.rope_specs):
            k = np.array(self.cache.keys(i))[:, :, stale]
            v = np.array(self.cache.values(i))[:, :, stale]
            assert np.array_equal(v, self.before_v[i][:, :, stale + size])
            want = reanchor(mx.array(self.before_k[i][:, :, stale + size]), -size, spec)
            assert max_diff(k, want) <= MOVE_TOL
        self._drop(np.arange(p0, p1))
        self._move(np.arange(p0, n - size), -size)
        self._recompute(result.rows)

    @rule(data=st.data())
    def do_refresh(self, data: st.DataObject) -> None:
        n = self.tok.size
        rows: Any = sorted(data.draw(st.sets(st.integers(0, max(n - 1, 0)), max_size=4)))
        kind = data.draw(st.sampled_from(["ok", "ok", "unsorted", "outside", "float", "turbo"]))
        executor = "turbo" if kind == "turbo" else data.draw(st.sampled_from(["packed", "sequential"]))
        if kind == "unsorted" and len(rows) > 1:
            rows = rows[::-1]
        elif kind == "outside":
            rows = [*rows, n]
        elif kind == "float":
            rows = [float(r) for r in rows] or [0.5]
        expect = kind == "ok" or (kind == "unsorted" and len(rows) <= 1)
        expect = expect and all(0 <= r < n for r in rows)
        if self._attempt("refresh", expect, lambda: refresh(MODEL, self.cache, rows, executor)) is None:
            return
        arr = np.asarray(rows, np.int64)
        untouched = np.setdiff1d(np.arange(n), arr)
        self._same_rows(untouched, untouched)
        self._recompute(arr)

    # ---- invariants ---------------------------------------------------------------------
    @invariant()
    def matches_a_fresh_prefill(self) -> None:
        cache = self.cache
        assert cache.n_past == self.tok.size
        assert np.array_equal(cache.tokens, self.tok)
        assert np.array_equal(cache.positions, self.pos)
        assert np.unique(self.pos).size == self.pos.size
        assert self.pos.size == 0 or (self.pos.min() >= 0 and self.pos.max() < LIMIT)
        if cache.n_past == 0:
            return
        fresh, match = fresh_prefill(MODEL, cache)
        rows = np.flatnonzero(self.exact)
        for i in range(cache.num_layers):
            k, v = np.array(cache.keys(i)), np.array(cache.values(i))
            assert np.isfinite(k).all() and np.isfinite(v).all()
            fk, fv = np.array(fresh.keys(i))[:, :, match], np.array(fresh.values(i))[:, :, match]
            if i == 0:  # token and position only: every row, stale or not
                assert max_diff(k, fk) <= TOL and max_diff(v, fv) <= TOL
            assert max_diff(k[:, :, rows], fk[:, :, rows]) <= TOL, f"layer {i} exact rows"
            assert max_diff(v[:, :, rows], fv[:, :, rows]) <= TOL, f"layer {i} exact rows"
        STATS["exact rows checked"] += int(rows.size)
        STATS["stale rows checked"] += int(self.exact.size - rows.size)
        nxt = int(self.pos.max()) + 1
        if self.exact.all() and cache.n_past < MAX_TOKENS and nxt < LIMIT:
            a = forward(MODEL, [7], cache.fork(), positions=[nxt])
            b = forward(MODEL, [7], fresh, positions=[nxt])
            assert max_diff(a, b) <= TOL
            STATS["logit checks"] += 1


def _run(examples: int, steps: int, **extra: Any) -> Counter[str]:
    STATS.clear()
    t0 = time.perf_counter()
    run_state_machine_as_test(CacheMachine, settings=settings(
        max_examples=examples, stateful_step_count=steps, deadline=None, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], **extra))
    stats = Counter(STATS)
    stats["seconds"] = round(time.perf_counter() - t0)
    print(dict(sorted(stats.items())))
    return stats


def test_cache_state_machine() -> None:
    stats = _run(200, 10, derandomize=True)
    assert stats["examples"] >= 200
    for name in ("append", "remove", "trim", "shift", "fork", "splice", "repair", "refresh"):
        assert stats[f"{name} ok"] and stats[f"{name} refused"], name
    assert stats["exact rows checked"] and stats["stale rows checked"]


@pytest.mark.slow
def test_cache_state_machine_long() -> None:
    stats = _run(5000, 12)
    assert stats["examples"] >= 5000
