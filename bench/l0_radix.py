"""Benchmark: L0 radix arena, warm-prefix checkout latency and warm-hit rate (paper 1, L0).

Contract: ``python bench/l0_radix.py [--quick] [--model M] [--tag T]`` on the default model
(SmolLM2-135M, fp32 on CPU) unless ``--model`` names another ``nexus_mlx.load`` spec (the result
records the model run and goes to ``results/l0_radix[_<tag>].json``):
1. Correctness first, on real prefills: a system prompt + user turn is prefilled and committed;
   a follow-up request checked out warm, with only its remainder prefilled, must give logits
   bit-identical to prefilling prefix then remainder into one cache, and within 1e-4 of a cold
   prefill of the whole request. The script exits otherwise.
2. Workload: seeded multi-turn traffic on a 32-slot arena with the model's cache geometry:
   conversations sharing two system prompts, served round robin in shuffled order; each turn
   checks out history + user message into one reused working cache (``into=``), writes the
   remainder and the assistant reply as synthetic K/V rows (random values of the right shapes:
   copy cost does not depend on them) and commits. Scenario "8 conversations" fits the arena;
   "40 conversations" overflows it (LRU eviction). Reported: checkout latency p50/p90 over warm
   hits (ms, copy included), commit and lookup latency, hit rate (checkouts reusing >= 1 row),
   token hit rate, evictions, commits that were truncated to ``slot_tokens``.
3. Copy vs prefill: per prefix length L, the latency of a warm checkout of L rows (into a fresh
   working cache, and into a reused one) against a cold prefill of the same L tokens through
   the model, interleaved round by round (5 checkouts of each kind, then one prefill);
   ratio = prefill / checkout with a bootstrap CI.
Writes ``results/l0_radix.json`` (``results/quick/`` with ``--quick``), a PNG beside it, and
prints the JSON as its last stdout line.
"""

from common import (  # first: loads nexus_mlx + fast BLAS
    add_model_argument,
    add_tag_argument,
    arg_parser,
    emit,
    median_ci,
    model_record,
    ratio_ci,
    tagged_name,
)

import time

import mlx.core as mx
import numpy as np

from nexus_mlx import forward, load, make_cache
from nexus_mlx.kv.cache import NexusCache
from nexus_mlx.agent.radix_arena import RadixArena

NAME = "l0_radix"
TOL = 1e-4
CHECKOUTS_PER_ROUND = 5
SYSTEM = (
    "You are a coding agent with access to GitHub, a shell and a clock. Think step by step, "
    "call a tool when it helps, and answer briefly."
)
TURNS = ("List my open pull requests.", "Which of them touch the cache module?")


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1e3


def check_real_prefill(model, tokenizer, arena: RadixArena) -> dict[str, object]:
    """Warm checkout + remainder prefill vs chunked and cold prefills of real text."""
    history = np.array(tokenizer.encode(SYSTEM + " User: " + TURNS[0]))
    request = np.concatenate([history, tokenizer.encode(" Assistant: ok. User: " + TURNS[1])])
    cache, reuse = arena.checkout(history)
    forward(model, history, cache)
    arena.commit(cache)
    warm, reuse = arena.checkout(request)
    if reuse != history.size:
        raise SystemExit(f"expected {history.size} warm rows, got {reuse}")
    warm_logits = np.array(forward(model, request[reuse:], warm))
    chunked = make_cache(model)
    forward(model, history, chunked)
    chunked_logits = np.array(forward(model, request[reuse:], chunked))
    cold_logits = np.array(forward(model, request, make_cache(model))[:, reuse:])
    cold_diff = float(np.abs(warm_logits - cold_logits).max())
    exact = bool(np.array_equal(warm_logits, chunked_logits))
    if not exact or not cold_diff <= TOL:
        raise SystemExit(f"warm checkout is wrong: exact={exact}, cold max diff {cold_diff:.3g}")
    arena.clear()
    return {"history_tokens": int(history.size), "request_tokens": int(request.size),
            "bit_identical_to_chunked_prefill": exact, "max_abs_logit_diff_vs_cold": cold_diff}


class KVPool:
    """Random K/V rows of the arena's geometry, sliced to fake prefilled tokens."""

    def __init__(self, arena: RadixArena, rows: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        shape = (1, arena.n_kv_heads, rows, arena.head_dim)  # (1, H, T, D)
        self.keys = [mx.array(rng.standard_normal(shape, dtype=np.float32))
                     for _ in range(arena.num_layers)]
        self.values = [mx.array(rng.standard_normal(shape, dtype=np.float32))
                       for _ in range(arena.num_layers)]
        mx.eval(self.keys, self.values)

    def append(self, cache: NexusCache, tokens: np.ndarray) -> None:
        rows = self.keys[0].shape[2]
        for i in range(0, tokens.size, rows):  # chunks of at most ``rows`` rows
            chunk = tokens[i : i + rows]
            n, m = cache.n_past, chunk.size
            cache.write(np.arange(n, n + m), [k[:, :, :m] for k in self.keys],
                        [v[:, :, :m] for v in self.values], tokens=chunk)
            cache.evaluate()


def run_workload(model, arena: RadixArena, pool: KVPool, *, conversations: int, turns: int,
                 system_tokens: int, seed: int) -> dict[str, object]:
    """Round-robin multi-turn traffic; latencies of every checkout, commit and lookup."""
    arena.clear()
    rng = np.random.default_rng(seed)
    vocab = arena.vocab_size
    systems = [rng.integers(0, vocab, system_tokens) for _ in range(2)]
    history = [systems[c % 2] for c in range(conversations)]
    work = make_cache(model)  # one working cache, reused every turn (``into=``): no allocation
    work.reserve(system_tokens + turns * (64 + 128))
    hits: list[tuple[int, float]] = []  # (warm rows, ms)
    commit_ms: list[float] = []
    lookup_us: list[float] = []
    truncated = 0
    for _ in range(turns):
        for c in rng.permutation(conversations):
            request = np.concatenate([history[c], rng.integers(0, vocab, rng.integers(16, 65))])
            start = time.perf_counter()
            arena.lookup(request)
            lookup_us.append(_ms(start) * 1e3)
            start = time.perf_counter()
            cache, reuse = arena.checkout(request, into=work)
            elapsed = _ms(start)
            if reuse:
                hits.append((reuse, elapsed))
            reply = rng.integers(0, vocab, rng.integers(32, 129))
            pool.append(cache, request[reuse:])
            pool.append(cache, reply)
            start = time.perf_counter()
            done = arena.commit(cache)
            commit_ms.append(_ms(start))
            truncated += done.truncated_tokens > 0
            history[c] = np.concatenate([request, reply])
    stats = arena.stats
    hit_ms = [ms for _, ms in hits]
    warm_rows = np.array([rows for rows, _ in hits])
    return {
        "conversations": conversations, "turns": turns, "system_tokens": system_tokens,
        "checkouts": stats.checkouts, "hit_rate": stats.hit_rate,
        "token_hit_rate": stats.token_hit_rate, "warm_tokens": stats.warm_tokens,
        "requested_tokens": stats.requested_tokens, "evictions": stats.evictions,
        "truncated_commits": truncated,
        "checkout_hit_ms_p50": float(np.percentile(hit_ms, 50)) if hits else None,
        "checkout_hit_ms_p90": float(np.percentile(hit_ms, 90)) if hits else None,
        "checkout_hit_ms_ci": list(median_ci(hit_ms)[1:]) if hits else None,
        "warm_rows_p50": float(np.median(warm_rows)) if hits else None,
        "commit_ms_p50": float(np.median(commit_ms)),
        "commit_ms_p90": float(np.percentile(commit_ms, 90)),
        "lookup_us_p50": float(np.median(lookup_us)),
        "working_cache": "one reused cache (checkout into=)",
        "hits": [[int(r), round(ms, 3)] for r, ms in hits],
    }


def copy_vs_prefill(model, arena: RadixArena, pool: KVPool, lengths: list[int], trials: int,
                    seed: int) -> list[dict[str, object]]:
    """Warm checkout of L rows (fresh / reused working cache) vs a cold prefill of L tokens."""
    rng = np.random.default_rng(seed)
    vocab = arena.vocab_size
    rows = []
    into = make_cache(model)
    for n in lengths:
        arena.clear()
        tokens = rng.integers(0, vocab, n + 1)
        stored = make_cache(model)
        pool.append(stored, tokens[:n])
        arena.commit(stored)
        fresh_ms, into_ms, prefill_ms = [], [], []

        def prefill(t: np.ndarray = tokens[:n]) -> None:
            mx.eval(forward(model, t, make_cache(model), logits="last"))

        for trial in range(trials + 1):  # the first round is warm-up
            round_fresh, round_into = [], []
            for _ in range(CHECKOUTS_PER_ROUND):  # checkouts are cheap: sample them more
                start = time.perf_counter()
                _, reuse = arena.checkout(tokens)
                round_fresh.append(_ms(start))
                start = time.perf_counter()
                arena.checkout(tokens, into=into)
                round_into.append(_ms(start))
                if reuse != n:
                    raise SystemExit(f"expected {n} warm rows, got {reuse}")
            if trial:  # the model itself was warmed up by the correctness check
                start = time.perf_counter()
                prefill()
                prefill_ms.append(_ms(start))
                fresh_ms += round_fresh
                into_ms += round_into
        speedup = ratio_ci(prefill_ms, fresh_ms)
        speedup_into = ratio_ci(prefill_ms, into_ms)
        copied = n * 2 * arena.num_layers * arena.n_kv_heads * arena.head_dim * arena.dtype.size
        rows.append({
            "prefix_tokens": n, "copied_bytes": copied,
            "checkout_ms": median_ci(fresh_ms)[0], "checkout_ms_ci": list(median_ci(fresh_ms)[1:]),
            "checkout_into_ms": median_ci(into_ms)[0],
            "checkout_into_ms_ci": list(median_ci(into_ms)[1:]),
            "cold_prefill_ms": median_ci(prefill_ms)[0],
            "cold_prefill_ms_ci": list(median_ci(prefill_ms)[1:]),
            "prefill_over_checkout": speedup[0], "prefill_over_checkout_ci": list(speedup[1:]),
            "prefill_over_checkout_into": speedup_into[0],
            "prefill_over_checkout_into_ci": list(speedup_into[1:]),
            "copy_gb_s_into": copied / (float(np.median(into_ms)) * 1e6),
            "prefill_trials": trials, "checkout_trials": trials * CHECKOUTS_PER_ROUND,
        })
    return rows


def plot(payload: dict[str, object], result_name: str, quick: bool) -> str | None:
    try:
        import plots
    except ImportError:  # matplotlib missing: the JSON is the result
        return None
    fig, (ax_sweep, ax_hits) = plots.figure(2)
    sweep = payload["copy_vs_prefill"]
    assert isinstance(sweep, list)
    lengths = [r["prefix_tokens"] for r in sweep]
    for key, label in [("cold_prefill_ms", "cold prefill"), ("checkout_ms", "checkout (fresh)"),
                       ("checkout_into_ms", "checkout (into)")]:
        meds = [r[key] for r in sweep]
        ax_sweep.errorbar(lengths, meds, yerr=plots.error_bars(meds, [r[key + "_ci"] for r in sweep]),
                          marker="o", capsize=3, label=label)
    ax_sweep.set(xlabel="prefix tokens", ylabel="ms", yscale="log", title="warm copy vs prefill")
    ax_sweep.legend()
    workloads = payload["workloads"]
    assert isinstance(workloads, dict)
    for name, w in workloads.items():
        if w["hits"]:
            pts = np.array(w["hits"])
            ax_hits.scatter(pts[:, 0], pts[:, 1], s=8, label=name)
    ax_hits.set(xlabel="warm rows copied", ylabel="checkout ms", title="workload hits")
    ax_hits.legend()
    return str(plots.save(fig, result_name, quick))


def main() -> None:
    parser = arg_parser(__doc__.splitlines()[0])
    add_model_argument(parser)
    add_tag_argument(parser)
    args = parser.parse_args()
    quick = args.quick
    slot_tokens = 512 if quick else 1024
    turns = 3 if quick else 8
    system_tokens = 128 if quick else 256
    lengths = [64, 128] if quick else [64, 256, 512, 1024]
    trials = 3 if quick else 5

    model, tokenizer = load(args.model)
    start = time.perf_counter()
    arena = RadixArena(model, slots=32, slot_tokens=slot_tokens)
    alloc_ms = _ms(start)
    correctness = check_real_prefill(model, tokenizer, arena)
    pool = KVPool(arena, rows=slot_tokens, seed=0)
    workloads = {
        f"{c}_conversations": run_workload(model, arena, pool, conversations=c, turns=turns,
                                           system_tokens=system_tokens, seed=c)
        for c in (8, 40)
    }
    sweep = copy_vs_prefill(model, arena, pool, lengths, trials, seed=1)
    payload: dict[str, object] = {
        **model_record(args.model, model),
        "geometry": {"layers": arena.num_layers, "kv_heads": arena.n_kv_heads,
                     "head_dim": arena.head_dim, "v_layout": arena.v_layout,
                     "dtype": str(arena.dtype)},
        "slots": arena.slots, "slot_tokens": slot_tokens, "arena_bytes": arena.nbytes,
        "arena_alloc_ms": alloc_ms,
        "correctness": correctness,
        "workloads": workloads,
        "copy_vs_prefill": sweep,
    }
    name = tagged_name(NAME, args.tag)
    payload["png"] = plot(payload, name, quick)
    emit(name, payload, quick)


if __name__ == "__main__":
    main()
