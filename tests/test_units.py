"""Semantic units: text boundaries (messages, code, JSON, lists, paragraphs, sentences), the
midpoint mapping to tokens, merge / split rules, and an exact partition for any suffix."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from nexus_mlx.sur.units import (
    MAX_UNIT,
    MIN_UNIT,
    Units,
    is_partition,
    merge_short,
    segments_to_tokens,
    semantic_units,
    split_long,
    text_segments,
    units_from_text,
)

CHAT = """The seam starts mid sentence here. Then a new one! And?
<|im_start|>user
Hello there. How are you? I'm fine e.g. ok.

# Heading
New paragraph. Another one.<|im_end|>
<|im_start|>tool
{"results": [{"a": 1, "b": "x, y"}, {"a": 2}], "n": 2}
- item one
  continued
- item two

After list.
```python
def f():
    return 1

def g():
    pass
```
[1] citation here.
[{"truncated": "yes", "more": [1,2
"""

EXPECTED = [
    (0, "The seam starts mid sentence here. "), (0, "Then a new one! "), (0, "And?\n"),
    (1, "<|im_start|>user\nHello there. "), (1, "How are you? "),
    (1, "I'm fine e.g. ok.\n\n"), (1, "# Heading\n"), (1, "New paragraph. "),
    (1, "Another one.<|im_end|>\n"),
    (2, "<|im_start|>tool\n"),
    (3, '{"results": [{"a": 1, "b": "x, y"}, {"a": 2}], '), (3, '"n": 2}\n'),
    (4, "- item one\n  continued\n"), (4, "- item two\n\n"),
    (2, "After list.\n"),
    (5, "```python\ndef f():\n    return 1\n\n"), (5, "def g():\n    pass\n```\n"),
    (2, "[1] citation here.\n"),
    (6, '[{"truncated": "yes", '), (6, '"more": [1,2\n'),
]


def segment_texts(text: str) -> list[tuple[int, str]]:
    segs = text_segments(text)
    ends = [x for x, _ in segs[1:]] + [len(text)]
    return [(box, text[x:end]) for (x, box), end in zip(segs, ends, strict=True)]


def test_text_boundaries():
    assert segment_texts(CHAT) == EXPECTED
    assert text_segments("") == []
    assert segment_texts("no structure at all") == [(0, "no structure at all")]


def test_json_array_members_and_unclosed_fence():
    text = '[\n  {"id": 1},\n  {"id": 2}\n]\ntail ```\nnot a fence\n```js\nx\n'
    assert segment_texts(text) == [
        (1, '[\n  {"id": 1},\n  '), (1, '{"id": 2}\n]\n'), (0, "tail ```\nnot a fence\n"),
        (2, "```js\nx\n"),
    ]


def test_merge_short_into_shorter_neighbour_same_container():
    r = [(0, 10), (10, 13), (13, 18), (18, 40)]
    assert merge_short(r, [0, 0, 0, 0]) == ([(0, 10), (10, 18), (18, 40)], [0, 0, 0])
    # tie (both neighbours 10): the preceding one
    assert merge_short([(0, 10), (10, 12), (12, 22)], [0] * 3) == ([(0, 12), (12, 22)], [0, 0])
    # a neighbour in another container is never merged into
    assert merge_short([(0, 10), (10, 12), (12, 22)], [0, 1, 1]) == ([(0, 10), (10, 22)], [0, 1])
    assert merge_short([(0, 3), (3, 5)], [0, 1]) == ([(0, 3), (3, 5)], [0, 1])
    # a short chain collapses until it reaches MIN_UNIT
    merged, _ = merge_short([(i, i + 1) for i in range(20)], [0] * 20)
    assert is_partition(merged, 20) and all(b - a >= MIN_UNIT for a, b in merged)


def test_split_long_balanced():
    assert split_long([(0, 300)], [7]) == ([(0, 100), (100, 200), (200, 300)], [7, 7, 7])
    assert split_long([(5, 262)], [0])[0] == [(5, 91), (91, 177), (177, 262)]  # 86, 86, 85
    assert split_long([(0, MAX_UNIT)], [0])[0] == [(0, MAX_UNIT)]


def test_units_of_a_chat(default_tokenizer):
    ids = np.array(default_tokenizer.encode(CHAT, add_special_tokens=False))
    units = semantic_units(default_tokenizer, ids)
    assert is_partition(units.ranges, len(ids)) and len(units.containers) == len(units)
    pieces = [default_tokenizer.decode(ids[a:b].tolist()) for a, b in units]
    assert "".join(pieces) == CHAT
    assert pieces[0] == "The seam starts mid sentence here. Then a new one! And?\n"  # merged
    assert any(p.startswith("```python") for p in pieces)
    assert units == semantic_units(default_tokenizer, ids)  # deterministic


def test_edge_cases(default_tokenizer):
    assert semantic_units(default_tokenizer, np.zeros(0, np.int64)) == Units([], [])
    short = np.array(default_tokenizer.encode("Hi.", add_special_tokens=False))
    assert semantic_units(default_tokenizer, short).ranges == [(0, len(short))]
    flat = np.array(default_tokenizer.encode(" word" * 300, add_special_tokens=False))  # no structure
    units = semantic_units(default_tokenizer, flat)
    assert units.lengths().tolist() == [100, 100, 100]
    # a suffix starting mid-sentence: its first unit is that sentence's tail
    ids = default_tokenizer.encode("We went home very late after the long party at the lake. The next day "
                      "was long and very sunny outside.", add_special_tokens=False)
    units = semantic_units(default_tokenizer, np.array(ids[2:]))
    first = default_tokenizer.decode(ids[2:][: units.ranges[0][1]])
    assert first == " home very late after the long party at the lake." and len(units) == 2


def test_midpoints_decide_which_unit_a_token_joins():
    text = "Aa. Bb."
    spans = np.array([[0, 2], [2, 4], [4, 7]])  # "Aa", ". ", "Bb."
    assert units_from_text(text, spans).ranges == [(0, 3)]  # one short unit, nothing to merge
    segs = text_segments(text)
    assert [x for x, _ in segs] == [0, 4]
    spans = np.array([[0, 3], [3, 5], [5, 7]])  # "Aa.", " B" (midpoint 4 -> 2nd), "b."
    assert segments_to_tokens(spans, segs)[0] == [(0, 1), (1, 3)]


@settings(max_examples=40, deadline=None)
@given(parts=st.lists(st.sampled_from([
    "A sentence. ", "Another one!\n", "\n\n", "<|im_start|>user\n", "<|im_end|>\n", "```\n",
    '{"k": [1, 2], "v": "s, t"}\n', "- item\n", "1. first\n", "# Title\n", "日本語。", "😀 ",
    "[", "]", "}", "word " * 40, "x",
]), max_size=25), cut=st.integers(0, 400))
def test_units_partition_any_suffix(default_tokenizer, parts, cut):
    ids = np.array(default_tokenizer.encode("".join(parts), add_special_tokens=False), dtype=np.int64)
    ids = ids[min(cut, len(ids)):]  # any seam, even inside a character
    units = semantic_units(default_tokenizer, ids)
    assert is_partition(units.ranges, len(ids))
    assert all(b - a <= MAX_UNIT for a, b in units)
    for k in range(len(units)):  # a short unit survives only without a same-container neighbour
        if units.lengths()[k] < MIN_UNIT:
            assert units.containers[k] not in units.containers[max(0, k - 1): k] + units.containers[k + 1: k + 2]
