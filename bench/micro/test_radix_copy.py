"""L0 radix arena: checkout of a 490-token warm prefix into a reused working cache (a copy out of
the pre-reserved arena, every layer's K and V), SmolLM2-135M's K/V geometry.

Reference, before timing: the working cache holds exactly (bit for bit) the committed rows and
positions, and the match leaves the requested remainder to prefill.
"""

import mlx.core as mx
import numpy as np

from nexus_mlx.agent.radix_arena import RadixArena
from nexus_mlx.models.forward import make_cache

TOKENS = 491  # a 256-token history and a 235-token schema


def test_radix_copy(benchmark, copy_model):
    model = copy_model
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, model.args.vocab_size, size=TOKENS)
    committed = make_cache(model)
    shape = (1, committed.n_kv_heads, TOKENS, committed.head_dim)  # (1, H, T, D)
    keys = [mx.array(rng.standard_normal(shape, dtype=np.float32))
            for _ in range(committed.num_layers)]
    values = [mx.array(rng.standard_normal(shape, dtype=np.float32))
              for _ in range(committed.num_layers)]
    committed.write(np.arange(TOKENS), keys, values, tokens=tokens)
    committed.evaluate()

    arena = RadixArena(model, slots=2, slot_tokens=512)
    arena.commit(committed)
    work, reuse = arena.checkout(tokens)
    assert reuse == TOKENS - 1  # one token left to prefill (min_remainder=1)
    np.testing.assert_array_equal(work.positions, np.arange(reuse))
    for layer in range(committed.num_layers):
        np.testing.assert_array_equal(np.array(work.keys(layer)),
                                      np.array(keys[layer][:, :, :reuse]))
        np.testing.assert_array_equal(np.array(work.values(layer)),
                                      np.array(values[layer][:, :, :reuse]))

    copied = 2 * committed.num_layers * committed.n_kv_heads * committed.head_dim * reuse * 4
    benchmark.extra_info.update({"warm_tokens": reuse, "copied_bytes": copied})
    benchmark(arena.checkout, tokens, into=work)
