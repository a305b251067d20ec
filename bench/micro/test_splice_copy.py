"""Bare splice of a compiled 235-token block into a live cache at depth 256 (copy + re-anchor of
every layer's keys, values copied), SmolLM2-135M's K/V geometry (10.8 MB of K/V per block).

References, before timing: the anchored splice is output-exact (logits after a query equal a
text prefill of block + query), and the bare splice's rows equal the block's keys re-anchored
from scratch (``reanchor``) and its values unchanged, in every layer.
"""

import numpy as np

from nexus_mlx.kv.rope import reanchor
from nexus_mlx.models.forward import forward, make_cache
from nexus_mlx.blocks.compile import compile_block
from nexus_mlx.blocks.splicing import splice

PREFIX, BLOCK, QUERY = 256, 235, 8


def _tokens(model, n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, model.args.vocab_size, size=n).tolist()


def test_splice_copy(benchmark, copy_model):
    model = copy_model
    block = compile_block(model, None, _tokens(model, BLOCK, 1))  # anchored at 0, no context
    query = _tokens(model, QUERY, 2)

    anchored = make_cache(model)
    assert splice(model, anchored, block, curve=None).path == "anchored"
    spliced = forward(model, query, anchored, logits="all")
    reference = forward(model, list(block.tokens) + query, make_cache(model), logits="all")
    np.testing.assert_allclose(np.array(spliced[0]), np.array(reference[0, BLOCK:]), atol=1e-4)

    prefix = make_cache(model)
    forward(model, _tokens(model, PREFIX, 3), prefix, logits="last")
    prefix.evaluate()

    def fresh():
        cache = prefix.fork()
        cache.reserve(PREFIX + BLOCK)
        cache.evaluate()
        return (model, cache, block), {"curve": None}

    (_, cache, _), kwargs = fresh()
    result = splice(model, cache, block, **kwargs)
    assert result.path == "bare" and result.delta == PREFIX
    for layer, spec in enumerate(cache.rope_specs):
        got_k = np.array(cache.keys(layer))[..., PREFIX:, :]
        want_k = np.array(reanchor(block.keys(layer), PREFIX, spec))
        np.testing.assert_allclose(got_k.reshape(want_k.shape), want_k, atol=2e-5)
        got_v = np.array(cache.values(layer))[..., PREFIX:, :]
        want_v = np.array(block.values(layer))
        np.testing.assert_array_equal(got_v.reshape(want_v.shape), want_v)

    nbytes = sum(block.keys(i).nbytes + block.values(i).nbytes for i in range(cache.num_layers))
    benchmark.extra_info.update({"n_past": PREFIX, "block_tokens": BLOCK, "kv_bytes": nbytes})
    benchmark.pedantic(splice, setup=fresh, rounds=15, warmup_rounds=2)
