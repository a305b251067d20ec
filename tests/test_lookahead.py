"""Copy drafting (decode/lookahead.py): proposals, verification against one-id steps, the cache
left as without drafts; and on a real architecture, calls and session replies equal with and
without drafts."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from nexus_mlx.decode.lookahead import Lookahead, propose
from nexus_mlx.errors import ArgumentError

VOCAB = 7


def test_propose_takes_the_most_recent_longest_match() -> None:
    ctx = [5, 1, 2, 3, 9, 1, 2, 4, 8, 1, 2]
    assert propose(ctx, 3, min_match=2) == [4, 8, 1]  # [1, 2] last seen before 4
    assert propose([7, 1, 2, 3, 6, 0, 2, 5, 1, 2], 2, min_match=2) == [3, 6]
    assert propose(ctx, 3, min_match=3) == []  # [4, 1, 2]... no earlier [8, 1, 2]
    assert propose([1, 2, 3, 1, 2, 3], 10, min_match=3) == [1, 2, 3]  # runs into the tail
    assert propose([1, 2], 4, min_match=1) == []
    assert propose([], 4) == [] and propose([1, 1, 1], 0, min_match=1) == []


class Toy:
    """A 'model' whose next id is (a + 2b) % 7 of the last two ids: it cycles, so its output
    repeats and drafts get confirmed; ``rows`` is its cache."""

    def __init__(self, prompt: list[int]) -> None:
        self.rows = list(prompt)
        self.dropped = 0

    def logits_after(self, upto: int) -> mx.array:
        a, b = self.rows[upto - 2], self.rows[upto - 1]
        return mx.array(np.eye(VOCAB, dtype=np.float32)[(a + 2 * b) % VOCAB])

    def run(self, ids: list[int], tail: int) -> mx.array:
        self.rows.extend(ids)
        n = len(self.rows)
        return mx.stack([self.logits_after(n - tail + i + 1) for i in range(tail)])

    def drop(self, n: int, logits: mx.array) -> None:
        del self.rows[len(self.rows) - n:]
        self.dropped += n
        assert mx.array_equal(logits, self.logits_after(len(self.rows)))


def decode(prompt: list[int], steps: int, max_draft: int, prediction: Any = None
           ) -> tuple[list[int], Toy, Lookahead]:
    toy = Toy(prompt[:-1])
    look = Lookahead(toy.run, toy.drop, prompt[:-1], max_draft=max_draft, min_match=2,
                     prediction=prediction)
    logits = look.feed([prompt[-1]])
    out = []
    for _ in range(steps):
        token = int(mx.argmax(logits).item())
        out.append(token)
        logits = look.feed([token])
    look.close()
    return out, toy, look


@pytest.mark.parametrize("max_draft", [1, 3, 8])
def test_drafted_decoding_equals_one_id_steps(max_draft: int) -> None:
    prompt = [3, 1, 4, 1, 5]
    plain, plain_toy, plain_look = decode(prompt, 40, 0)
    out, toy, look = decode(prompt, 40, max_draft)
    assert out == plain
    assert toy.rows == plain_toy.rows == prompt + plain  # the cache ends at the last id fed
    assert plain_look.stats.passes == 41 and plain_look.stats.drafted == 0
    assert look.stats.accepted > 10 and look.stats.passes == 41 - look.stats.accepted
    assert look.stats.drafted - look.stats.accepted == toy.dropped


def test_a_wrong_draft_is_dropped_and_the_chosen_id_fed() -> None:
    toy = Toy([1, 2, 3, 1, 2])
    look = Lookahead(toy.run, toy.drop, toy.rows, max_draft=2, min_match=2)
    look.feed([3])  # context ...1, 2, 3 after 1, 2, 3: drafts [1, 2]
    assert look.ahead == 2 and toy.rows[-3:] == [3, 1, 2]
    logits = look.feed([6])  # the decoder chose otherwise
    assert toy.rows[:6] == [1, 2, 3, 1, 2, 3] and toy.rows[6] == 6
    assert mx.array_equal(logits, toy.logits_after(7))
    assert look.context.tolist() == [1, 2, 3, 1, 2, 3, 6]


def test_room_bounds_the_draft_and_bad_settings_are_refused() -> None:
    toy = Toy([1, 2, 3, 1, 2])
    look = Lookahead(toy.run, toy.drop, toy.rows, max_draft=8, min_match=2, room=lambda: 2)
    look.feed([3])
    assert look.ahead == 1  # 2 rows: the id fed and one draft
    with pytest.raises(ArgumentError):
        look.feed([])
    for bad in (-1, True, 1.5):
        with pytest.raises(ArgumentError):
            Lookahead(toy.run, toy.drop, [], max_draft=bad)
    with pytest.raises(ArgumentError):
        Lookahead(toy.run, toy.drop, [], min_match=0)


def test_tool_calls_are_the_same_with_and_without_drafts(tiny, default_tokenizer) -> None:
    from nexus_mlx.decode.tool_call import call_tool
    from nexus_mlx.tools.tool import Tool

    tool = Tool(name="create_issue", description="Open an issue", input_schema={
        "type": "object", "properties": {"title": {"type": "string"}, "body": {"type": "string"}},
        "required": ["title", "body"]})
    request = "Open an issue titled crash on start crash on start crash on start"
    plain = call_tool(tiny, default_tokenizer, request, [tool], draft_tokens=0,
                      max_argument_tokens=48)
    drafted = call_tool(tiny, default_tokenizer, request, [tool], draft_tokens=3,
                        max_argument_tokens=48)
    assert drafted.tokens == plain.tokens and drafted.text == plain.text
    assert plain.drafted_tokens == 0
    assert drafted.accepted_tokens > 0  # the path was exercised


def test_session_replies_are_the_same_with_and_without_drafts(tiny, default_tokenizer) -> None:
    from nexus_mlx.agent.session import Session

    messages = [{"role": "user", "content": "repeat after me: the quick brown fox " * 6}]
    replies, sessions = [], []
    for draft in (0, 3):
        session = Session(tiny, default_tokenizer, draft_tokens=draft)
        replies.append(session.generate(messages, max_tokens=40))
        sessions.append(session)
    plain, drafted = replies
    assert drafted.tokens == plain.tokens and drafted.text == plain.text
    assert np.array_equal(sessions[0].tokens, sessions[1].tokens)  # same rows kept
    assert mx.allclose(sessions[0].next_token_logits(), sessions[1].next_token_logits(),
                       atol=1e-4)
    with pytest.raises(ArgumentError):
        Session(tiny, default_tokenizer, draft_tokens=-1)


def test_plain_generation_with_drafts_equals_the_pipelined_loop(tiny) -> None:
    from nexus_mlx.decode.generate import GenerationStats, generate_tokens
    from nexus_mlx.models.forward import make_cache

    prompt = [11, 12, 13, 14] * 6
    runs = []
    for draft in (0, 3):
        cache, stats = make_cache(tiny), GenerationStats()
        ids = list(generate_tokens(tiny, prompt, cache, max_tokens=30, stats=stats,
                                   draft_tokens=draft))
        runs.append((ids, cache, stats))
    (plain, plain_cache, _), (drafted, cache, stats) = runs
    assert drafted == plain and len(plain) == 30
    assert cache.n_past == plain_cache.n_past == len(prompt) + 29  # all but the last id
    assert np.array_equal(cache.tokens[: cache.n_past], plain_cache.tokens[: cache.n_past])
    assert stats.accepted_tokens > 0 and stats.drafted_tokens >= stats.accepted_tokens
