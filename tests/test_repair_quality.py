"""Quality oracle for budgeted repair on the real default model (SmolLM2-135M-Instruct).

A 336-token note states a secret number, then a correction (the span ``e``) that the suffix
refers back to. Deleting the correction changes the answer. Re-prefill of ``p + s`` is the gold;
Shift (budget 0) keeps the suffix's stale K/V; ``nx.repair`` with a 10% SUR budget must land
strictly closer to the gold than Shift, both in the next-token distribution after the question
(KL from the gold) and in the suffix's K/V over layers >= 1 (layer 0 depends only on token and
position, so Shift's exact re-rotation already makes it equal to the gold there), by a margin,
and leave the rows it did not buy exactly as Shift left them. About 10 s on 2 idle cores.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import nexus_mlx as nx
from nexus_mlx.metrics import next_token_kl, top1_agreement
from nexus_mlx.refresh import reprefill, shift

BUDGET = 10.0  # percent of the suffix
FILLER = (
    "The tide came in slowly over the grey stones of the old quay.",
    "Gulls circled above the fishing boats while the nets were mended.",
    "A bell rang twice from the chapel on the hill behind the village.",
    "Children ran along the sea wall chasing the last light of the evening.",
    "The baker closed his shutters and swept the flour from the step.",
    "Somewhere a radio played an old song about the northern lights.",
    "The ferry horn sounded across the bay as the lamps were lit.",
    "Rain clouds gathered over the cliffs but the wind kept them away.",
)


def _encode(tokenizer, *texts: str) -> list[int]:
    """Each piece tokenized on its own, so the edit's rows are exactly the deleted text."""
    return [t for text in texts for t in tokenizer.encode(text, add_special_tokens=False)]


@pytest.fixture(scope="module")
def case(default_model):
    model, tokenizer = default_model
    p = _encode(tokenizer,
                "<|im_start|>user\nRead the notes. If a number is updated, the latest update counts.\n",
                " The secret number for harbor is 4821.", *(" " + f for f in FILLER[:4]))
    e = _encode(tokenizer, " Update: the secret number for harbor is now 7730.")
    s = _encode(tokenizer, " That new number for harbor replaces the older one.",
                *(" " + f for f in FILLER * 2))
    query = _encode(tokenizer, " Question: what is the latest secret number for harbor?<|im_end|>\n"
                    "<|im_start|>assistant\nThe latest secret number for harbor is ")
    cache = nx.make_cache(model)
    mx.eval(nx.forward(model, p + e + s, cache, logits="last"))
    cache.evaluate()
    return model, tokenizer, cache, nx.Edit(len(p), len(p) + len(e)), query


def _next_logits(model, cache, query) -> np.ndarray:
    out = nx.forward(model, query, cache.copy(), logits="last")  # the cache itself is kept
    return np.array(out[0, -1])


def _suffix_kv_deviation(cache, gold, start: int) -> float:
    """Squared K/V distance of the suffix rows to the gold over layers >= 1, float64."""
    total = 0.0
    for layer in range(1, gold.num_layers):
        for a, b in ((cache.keys(layer), gold.keys(layer)), (cache.values(layer), gold.values(layer))):
            d = np.asarray(a, np.float64)[0, :, start:] - np.asarray(b, np.float64)[0, :, start:]
            total += float((d * d).sum())
    return total


def test_sur_repair_lands_closer_to_reprefill_than_shift(case):
    model, tokenizer, cache, edit, query = case
    assert 300 <= cache.n_past <= 400
    gold, shifted = reprefill(model, cache, edit), shift(cache, edit)
    result = nx.repair(model, cache, edit, query, budget=BUDGET, allocator="sur",
                       tokenizer=tokenizer)
    assert 0 < result.budget_tokens == int(np.ceil(result.suffix_length * BUDGET / 100))

    # the deleted span matters: with it the answer starts with 7, without it with 4
    digit = tokenizer.encode("4", add_special_tokens=False)
    want = _next_logits(model, gold, query)
    dirty = _next_logits(model, cache, query)
    assert int(np.argmax(want)) == digit[0]
    assert tokenizer.decode([int(np.argmax(dirty))]) == "7"

    kl_shift = next_token_kl(want, _next_logits(model, shifted, query))
    repaired = _next_logits(model, result.cache, query)
    kl_repair = next_token_kl(want, repaired)
    kv_shift = _suffix_kv_deviation(shifted, gold, edit.p0)
    kv_repair = _suffix_kv_deviation(result.cache, gold, edit.p0)
    print(f"KL shift {kl_shift:.3g} repair {kl_repair:.3g}; K/V shift {kv_shift:.4g} "
          f"repair {kv_repair:.4g}; B = {result.budget_tokens} of {result.suffix_length}")
    assert kl_repair < kl_shift, (kl_repair, kl_shift)
    assert kv_repair < kv_shift, (kv_repair, kv_shift)
    # and by a margin that the same budget spent on the wrong rows does not reach (recomputing
    # the last B suffix rows instead measured KL 0.94x and K/V 0.99x of Shift's; SUR 0.09x, 0.58x)
    assert kl_repair < 0.5 * kl_shift and kv_repair < 0.8 * kv_shift
    assert top1_agreement(want, repaired)

    # rows the budget did not buy are Shift's, bit for bit
    kept = np.setdiff1d(np.arange(edit.p0, gold.n_past), result.rows)
    for layer in range(gold.num_layers):
        assert np.array_equal(np.array(result.cache.keys(layer))[:, :, kept],
                              np.array(shifted.keys(layer))[:, :, kept])
