"""Tool-name FSM masks over the default model's 49,152-token vocabulary, 117 GitHub tool names:
one walk = a mask and an accepted token at every step of 8 names' canonical tokenizations.

Reference, before timing: at every state of those walks the mask equals a brute-force one
(token ``t`` allowed iff it is not special, has bytes, and the bytes so far plus ``t``'s bytes
are a prefix of some ``name + '"'``). Cold: a fresh FSM each round (masks computed; the FSM is
built in the untimed setup); warm: one FSM whose per-state masks are cached.
"""

import numpy as np
import pytest

from nexus_mlx.decode.name_fsm import NameFSM, vocab_of

TERMINATOR = '"'
N_NAMES = 8


@pytest.fixture(scope="module")
def setup(tokenizer, github_tools):
    names = github_tools.names()
    picked = names[:: len(names) // N_NAMES][:N_NAMES]
    walks = [list(tokenizer.encode(n + TERMINATOR, add_special_tokens=False)) for n in picked]
    return names, walks, vocab_of(tokenizer)


def _brute_force(vocab, prefixes: set[bytes], so_far: bytes) -> np.ndarray:
    return np.array([bool(data) and i not in vocab.special_ids and so_far + data in prefixes
                     for i, data in enumerate(vocab.token_bytes)])


def _walk_all(fsm: NameFSM, walks: list[list[int]]) -> int:
    steps = 0
    for walk in walks:
        fsm.reset()
        for token in walk:
            fsm.allowed_mask()
            fsm.accept_token(token)
            steps += 1
    return steps


@pytest.fixture(scope="module")
def steps(setup) -> int:
    """Check every walk state against the brute-force mask; the number of steps per walk."""
    names, walks, vocab = setup
    targets = [(n + TERMINATOR).encode() for n in names]
    prefixes = {t[:k] for t in targets for k in range(len(t) + 1)}
    fsm = NameFSM(names, vocab, terminator=TERMINATOR)
    for walk in walks:
        fsm.reset()
        for token in walk:
            np.testing.assert_array_equal(fsm.allowed_mask(), _brute_force(vocab, prefixes,
                                                                           fsm.prefix))
            assert fsm.accept_token(token)
        assert fsm.is_complete() and fsm.matched_name() in names
    return sum(map(len, walks))


def test_fsm_mask_cold(benchmark, setup, steps):
    names, walks, vocab = setup
    benchmark.extra_info.update({"vocab": vocab.size, "names": len(names), "steps": steps})
    def fresh():
        return (NameFSM(names, vocab, terminator=TERMINATOR), walks), {}

    benchmark.pedantic(_walk_all, setup=fresh, rounds=10, warmup_rounds=1)


def test_fsm_mask_warm(benchmark, setup, steps):
    names, walks, vocab = setup
    fsm = NameFSM(names, vocab, terminator=TERMINATOR)
    assert _walk_all(fsm, walks) == steps
    benchmark.extra_info.update({"vocab": vocab.size, "names": len(names), "steps": steps})
    benchmark(_walk_all, fsm, walks)
