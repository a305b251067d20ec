"""RadixArena: warm checkout + remainder prefill equals a cold prefill, exact longest-common-prefix
matching (hypothesis oracle), LRU eviction, 32-slot capacity, storage that is never reallocated,
and rejected calls that leave the arena exactly as it was."""

from __future__ import annotations

import functools

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_models import VOCAB, tiny_model

from nexus_mlx.agent.radix_arena import Match, RadixArena
from nexus_mlx.errors import CacheError, TokenError
from nexus_mlx.kv.cache import NexusCache
from nexus_mlx.models.forward import forward, make_cache

TOL = 1e-4


@functools.cache
def _model(name: str = "llama"):
    return tiny_model(name)


def _tokens(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, size=n)


def _synthetic(model, tokens, seed: int = 0) -> NexusCache:
    """A cache holding random K/V for ``tokens`` at positions 0..n-1 (no forward pass)."""
    cache = make_cache(model)
    n = len(tokens)
    shape = (1, cache.n_kv_heads, n, cache.head_dim)
    rng = np.random.default_rng(seed)
    keys = [mx.array(rng.standard_normal(shape, dtype=np.float32)) for _ in range(cache.num_layers)]
    vals = [mx.array(rng.standard_normal(shape, dtype=np.float32)) for _ in range(cache.num_layers)]
    cache.write(np.arange(n), keys, vals, tokens=np.asarray(tokens))
    return cache


def _prefilled(model, tokens) -> NexusCache:
    cache = make_cache(model)
    forward(model, tokens, cache)
    return cache


def _lcp(a, b) -> int:
    n = min(len(a), len(b))
    neq = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(neq[0]) if neq.size else n


def _snapshot(arena: RadixArena):
    mx.eval(arena._keys, arena._values)
    return (
        arena.lengths.tobytes(),
        arena._tokens.tobytes(),
        arena._last_used.tobytes(),
        arena._clock,
        arena.stats,
        [np.array(k).tobytes() for k in arena._keys],
        [np.array(v).tobytes() for v in arena._values],
    )


def _buffer_address(a: mx.array) -> int:
    view = np.asarray(a)  # zero-copy on CPU; dropped at once so donation stays possible
    address: int = view.__array_interface__["data"][0]
    del view
    return address


@pytest.mark.parametrize("name", ["llama", "gemma2"])  # row-major and transposed V
def test_warm_checkout_then_remainder_equals_cold_prefill(name):
    model = _model(name)
    arena = RadixArena(model, slots=4, slot_tokens=64)
    history = _tokens(24, seed=1)
    request = np.concatenate([history, _tokens(9, seed=2)])

    cache, reuse = arena.checkout(history)
    assert reuse == 0 and cache.n_past == 0
    forward(model, history, cache)
    arena.commit(cache)

    warm, reuse = arena.checkout(request)
    assert reuse == history.size
    assert np.array_equal(warm.positions, np.arange(reuse))
    assert np.array_equal(warm.tokens, history)
    warm_logits = forward(model, request[reuse:], warm)
    cold = make_cache(model)
    cold_logits = forward(model, request, cold)
    chunked = _prefilled(model, history)
    chunked_logits = forward(model, request[reuse:], chunked)
    # The copy is exact: bit-identical to prefilling the prefix and then the remainder ...
    assert np.array_equal(np.array(warm_logits), np.array(chunked_logits))
    # ... and within float tolerance of one cold prefill of the whole request.
    diff = np.abs(np.array(warm_logits) - np.array(cold_logits[:, reuse:])).max()
    assert diff <= TOL
    for layer in range(warm.num_layers):
        assert np.abs(np.array(warm.values(layer)) - np.array(cold.values(layer))).max() <= TOL

    # A request equal to a stored sequence still leaves its last token to prefill.
    full, reuse = arena.checkout(history)
    assert reuse == history.size - 1
    last = forward(model, history[reuse:], full)
    assert np.abs(np.array(last[0, -1]) - np.array(cold_logits[0, history.size - 1])).max() <= TOL
    assert arena.stats.hits == 2 and arena.stats.misses == 1
    assert arena.stats.warm_tokens == 2 * history.size - 1


def test_checkout_copies_exact_rows_and_reuses_into():
    model = _model()
    arena = RadixArena(model, slots=4, slot_tokens=32)
    tokens = _tokens(20, seed=3)
    src = _synthetic(model, tokens, seed=4)
    arena.commit(src)
    into = make_cache(model)
    forward(model, _tokens(5, seed=5), into)  # stale contents are replaced
    cache, reuse = arena.checkout(tokens[:15], into=into, min_remainder=0)
    assert cache is into and reuse == 15 and into.n_past == 15
    for layer in range(into.num_layers):
        assert np.array_equal(np.array(into.keys(layer)), np.array(src.keys(layer)[:, :, :15]))
        assert np.array_equal(np.array(into.values(layer)), np.array(src.values(layer)[:, :, :15]))


alphabet = st.integers(0, 2)  # a tiny alphabet so that prefixes collide often


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seqs=st.lists(st.lists(alphabet, min_size=1, max_size=12), min_size=1, max_size=8),
    query=st.lists(alphabet, min_size=1, max_size=14),
)
def test_lookup_is_the_true_longest_common_prefix(seqs, query):
    """With room for every sequence, ``lookup`` returns max over committed sequences (cut to
    slot_tokens) of their LCP with the query, and the slot it names really shares it."""
    model = _model()
    arena = RadixArena(model, slots=8, slot_tokens=10)
    for i, seq in enumerate(seqs):
        arena.commit(_synthetic(model, seq, seed=i))
    match = arena.lookup(query)
    truth = max(_lcp(seq[: arena.slot_tokens], query) for seq in seqs)
    assert match.prefix_len == truth
    if truth == 0:
        assert match == Match(None, 0)
    else:
        assert match.slot is not None
        assert _lcp(arena.contents(match.slot), query) == truth
    # Radix invariant: no stored sequence is a prefix of another (distinct slots).
    stored = [arena.contents(s).tolist() for s in range(arena.slots) if arena.lengths[s]]
    for i, a in enumerate(stored):
        for j, b in enumerate(stored):
            assert i == j or b[: len(a)] != a
    # Every committed sequence is still fully findable (nothing was evicted).
    for seq in seqs:
        assert arena.lookup(seq).prefix_len == min(len(seq), arena.slot_tokens)


def test_dedup_extend_and_truncate():
    model = _model()
    arena = RadixArena(model, slots=4, slot_tokens=16)
    a = _tokens(10, seed=6)
    first = arena.commit(_synthetic(model, a[:6]))
    assert first.action == "new"
    extended = arena.commit(_synthetic(model, a))
    assert extended.action == "extend" and extended.slot == first.slot
    dedup = arena.commit(_synthetic(model, a[:4]))
    assert dedup.action == "dedup" and dedup.slot == first.slot and arena.occupied == 1
    long = np.concatenate([[(a[0] + 1) % VOCAB], _tokens(24, seed=7)])
    cut = arena.commit(_synthetic(model, long))
    assert cut.action == "new" and cut.stored_tokens == 16 and cut.truncated_tokens == 9
    assert np.array_equal(arena.contents(cut.slot), long[:16])
    _, reuse = arena.checkout(long)
    assert reuse == 16


def test_lru_eviction_order():
    model = _model()
    arena = RadixArena(model, slots=3, slot_tokens=8)
    seqs = {name: [i, 7, 7, i] for i, name in enumerate("ABCDE")}
    slot = {name: arena.commit(_synthetic(model, seqs[name])).slot for name in "ABC"}
    assert arena.lru_order() == [slot["A"], slot["B"], slot["C"]]
    arena.checkout(seqs["A"] + [9])  # a hit makes A most recently used
    assert arena.lru_order() == [slot["B"], slot["C"], slot["A"]]
    assert arena.lookup(seqs["B"]).prefix_len == 4  # lookup touches nothing
    d = arena.commit(_synthetic(model, seqs["D"]))
    assert d.action == "evict" and d.slot == slot["B"] and d.evicted_tokens == 4
    assert arena.lookup(seqs["B"]) == Match(None, 0)
    arena.commit(_synthetic(model, seqs["C"][:2]))  # dedup refreshes C
    e = arena.commit(_synthetic(model, seqs["E"]))
    assert e.slot == slot["A"]
    assert arena.lookup(seqs["C"]).prefix_len == 4 and arena.lookup(seqs["D"]).prefix_len == 4
    assert arena.stats.evictions == 2


def test_32_slots_and_storage_is_never_reallocated():
    model = _model()
    arena = RadixArena(model, slot_tokens=24)
    assert arena.slots == 32
    ids = [id(a) for a in arena._keys + arena._values]
    shapes = [a.shape for a in arena._keys + arena._values]
    nbytes = arena.nbytes
    on_cpu = mx.default_device() == mx.cpu
    addresses = [_buffer_address(a) for a in arena._keys + arena._values]
    seqs = [[s % VOCAB, *_tokens(12 + s % 8, seed=100 + s)] for s in range(33)]
    for s, seq in enumerate(seqs[:32]):
        assert arena.commit(_synthetic(model, seq, seed=s)).action == "new"
    assert arena.occupied == 32 and arena.stats.evictions == 0
    for seq in seqs[:32]:
        assert arena.lookup(seq).prefix_len == len(seq)
    assert arena.commit(_synthetic(model, seqs[32])).action == "evict"
    assert arena.lookup(seqs[0]) == Match(None, 0)  # the first committed went first
    for seq in seqs[1:]:
        cache, reuse = arena.checkout([*seq, 1])
        forward(model, [1], cache)
        arena.commit(cache)
    arena.clear()
    assert arena.occupied == 0 and arena.stats.commits == 0
    assert [id(a) for a in arena._keys + arena._values] == ids
    assert [a.shape for a in arena._keys + arena._values] == shapes and arena.nbytes == nbytes
    if on_cpu:  # donated in place: the very same buffers
        assert [_buffer_address(a) for a in arena._keys + arena._values] == addresses


def test_rejected_calls_leave_the_arena_unchanged():
    model = _model()
    arena = RadixArena(model, slots=2, slot_tokens=16)
    arena.commit(_synthetic(model, _tokens(8, seed=8)))
    arena.commit(_synthetic(model, _tokens(8, seed=9)))
    before = _snapshot(arena)

    shifted = make_cache(model)
    forward(model, _tokens(6), shifted, positions=np.arange(3, 9))
    unknown = make_cache(model)
    shape = (1, unknown.n_kv_heads, 4, unknown.head_dim)
    unknown.write(np.arange(4), [mx.zeros(shape)] * 2, [mx.zeros(shape)] * 2)  # ids -1
    other_layout = make_cache(model, v_layout="transposed")
    forward(model, _tokens(4), other_layout)
    other_dtype = NexusCache(arena.rope_specs, arena.n_kv_heads, arena.head_dim, dtype=mx.float16)
    other_dtype.write(np.arange(4), [mx.zeros(shape, mx.float16)] * 2,
                      [mx.zeros(shape, mx.float16)] * 2, tokens=[1, 2, 3, 4])
    for bad, words in [
        (make_cache(model), "empty"),
        (shifted, "row 0 has position 3"),
        (unknown, "no token id"),
        (other_layout, "v_layout"),
        (other_dtype, "dtype"),
        ("not a cache", "NexusCache"),
    ]:
        with pytest.raises(CacheError, match=words):
            arena.commit(bad)  # type: ignore[arg-type]
        assert _snapshot(arena) == before

    into = _prefilled(model, _tokens(5))
    into_before = (into.n_past, into.tokens.tobytes(), np.array(into.keys(0)).tobytes())
    for tokens, kwargs, err in [
        ([], {}, TokenError),
        ([-1, 2], {}, TokenError),
        ([VOCAB], {}, TokenError),
        ([1.5, 2.0], {}, TokenError),
        (_tokens(8, seed=8), {"min_remainder": -1}, CacheError),
        (_tokens(8, seed=8), {"into": other_layout}, CacheError),
    ]:
        with pytest.raises(err):
            arena.checkout(tokens, into=kwargs.get("into", into),
                           min_remainder=kwargs.get("min_remainder", 1))
        assert _snapshot(arena) == before
    assert (into.n_past, into.tokens.tobytes(), np.array(into.keys(0)).tobytes()) == into_before
    for bad_args in [{"slots": 0}, {"slot_tokens": 0}, {"slot_tokens": 10**6}]:
        with pytest.raises(CacheError):
            RadixArena(model, **{"slot_tokens": 8, **bad_args})
