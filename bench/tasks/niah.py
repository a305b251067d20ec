"""Erasing-NIAH: seeded needle-in-a-haystack cases whose answer changes when a span is deleted.

Contract: ``niah_cases(tokenizer, NiahSpec(...))`` returns :class:`NiahCase` objects, the same
ones for the same spec and tokenizer (all randomness comes from ``numpy`` generators seeded
with ``(spec.seed, case index)``, so case ``i`` does not depend on ``n_cases``). ``score``
parses a greedy answer and compares it with the gold value(s).

The construction (one case):

- A haystack of templated filler sentences (no digits, no key words) of about
  ``spec.lengths[i % len(lengths)]`` tokens, inside one user message of the tokenizer's chat
  template (plain text when ``spec.chat`` is False or the tokenizer has none).
- A *target key* (e.g. ``harbor``) stated ``spec.n_updates`` times with distinct values, in
  order: first ``"The secret number for harbor is 4821."``, then corrections
  ``"Update: the secret number for harbor is now 7730."``. The intro tells the reader that the
  latest update counts. The **last correction is the deleted span** ``e`` (wrapped in
  ``spec.edit_filler`` filler sentences on each side, which are deleted with it), so with ``e``
  present the answer is the last value (``deleted_answer``) and after the deletion it reverts
  to the one before (``answer``). ``e`` sits at a seeded depth in ``spec.edit_depth`` (a
  fraction of the haystack), the earlier statements before it.
- ``spec.n_distractors`` other keys (default 0), each stated once, at seeded depths *before* the
  target's last surviving statement; the suffix holds no numbers, so after the deletion the most
  recent surviving number is the gold. Why 0 with the default model (SmolLM2-135M), measured
  with Re-prefill on 4K-token cases: with four distractor keys placed anywhere it answered a
  distractor's value (asked for each of the five keys of one context it gave the same number
  for all five); with one distractor it was right on 2 of 3 cases; with none, 3 of 3 at 4K and
  1 of 1 at 8K. Larger models can take distractors (they are kept as an option).
- ``spec.echoes`` sentences right after ``e`` (in the suffix) that refer back to the deleted
  update without repeating its value ("That new number for harbor replaces the older one."):
  after the deletion they are stale, which is what a repair has to fix.
- Every value in a case has a distinct leading digit, so the first answer token decides it.

Token layout: ``tokens = p + e + s`` with ``edit = Edit(p0, p1)`` the rows of ``e``; each text
segment (template head, sentences, paragraph breaks) is tokenized on its own and concatenated,
so ``decode(tokens[p0:p1]) == e_text`` exactly. The *query* (not in the cache) is the question,
the template's end-of-turn and assistant header, and the answer prefix
``"The latest secret number for harbor is "`` (its trailing space is the tokenizer's own
separate token before digits), so greedy continuation starts at the number.

It does not run a model; benchmarks prefill ``tokens``, apply an edit operator, feed ``query``
and score the greedy continuation.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nexus_mlx.refresh.edit import Edit
from tasks.prompting import chat_template_parts, encode_plain

KEYS: tuple[str, ...] = (
    "harbor", "meadow", "lantern", "glacier", "canyon", "falcon", "ember", "quartz", "willow",
    "compass", "saffron", "tundra", "marble", "cobalt", "juniper", "violet", "beacon", "copper",
    "thistle", "summit", "prairie", "anchor", "walnut", "zephyr", "orchid", "basalt", "heron",
    "cedar", "magnet", "pepper", "raven", "tulip",
)
_SUBJECTS = (
    "The old ferryman", "A quiet librarian", "The village baker", "A tired courier",
    "The museum guard", "A young painter", "The night porter", "A patient gardener",
    "The river pilot", "A travelling fiddler", "The school teacher", "A careful surveyor",
    "The town clerk", "A retired sailor", "The shy apprentice", "A cheerful weaver",
)
_ACTIONS = (
    "waited near", "walked past", "looked across", "paused beside", "drifted toward",
    "talked about", "sketched", "swept", "mended", "remembered", "circled", "photographed",
)
_PLACES = (
    "the stone bridge", "the empty market", "the foggy pier", "the garden wall",
    "the lighthouse steps", "the wooden gate", "the chapel square", "the railway yard",
    "the old mill", "the narrow lane", "the fountain", "the bakery window",
)
_TAILS = (
    "before the rain began.", "while bells rang in the distance.", "as the lamps were lit.",
    "after the long winter.", "and nobody noticed.", "in the pale afternoon light.",
    "on a windy morning.", "without saying a word.", "while the kettle cooled.",
    "as the tide went out.", "before supper.", "under a grey sky.",
)
_ECHOES = (
    " That new number for {key} replaces the older one.",
    " Everyone agreed to use the updated number for {key} from then on.",
    " The previous number for {key} was no longer valid after that update.",
)
INTRO = (
    "Below are some notes. Each key has a secret number. A number can be changed by a later "
    "update; the most recent update always replaces the earlier number.\n\n"
)
_PARAGRAPH = "\n\n"


@dataclass(frozen=True)
class NiahSpec:
    """How to build the cases (frozen; the defaults are the benchmark's)."""

    n_cases: int = 96
    lengths: tuple[int, ...] = (1024, 2048, 4096, 8000)  # context tokens (p + e + s), approx.
    n_updates: int = 3  # statements of the target key; the last one is deleted
    n_distractors: int = 0  # other keys (see the module docstring for why 0 by default)
    echoes: int = 2  # suffix sentences referring back to the deleted update
    edit_filler: int = 1  # filler sentences deleted with the update, on each side
    edit_depth: tuple[float, float] = (0.3, 0.7)  # where e sits, as a haystack fraction
    seed: int = 0
    chat: bool = True

    def __post_init__(self) -> None:
        if self.n_cases < 0 or not self.lengths or min(self.lengths) < 256:
            raise ValueError(f"need n_cases >= 0 and lengths >= 256, got {self}")
        if not 2 <= self.n_updates <= 5 or self.n_updates + self.n_distractors > 9:
            raise ValueError(
                f"need 2 <= n_updates <= 5 and n_updates + n_distractors <= 9 (distinct leading "
                f"digits), got {self.n_updates} and {self.n_distractors}"
            )
        lo, hi = self.edit_depth
        if not 0.0 < lo <= hi < 1.0:
            raise ValueError(f"edit_depth must satisfy 0 < lo <= hi < 1, got {self.edit_depth}")


@dataclass(frozen=True)
class NiahCase:
    """One case: cached tokens ``p + e + s``, the edit, the query and the answers."""

    index: int
    tokens: np.ndarray  # (N,) token ids of p + e + s
    edit: Edit  # rows [p0, p1) of e
    query: np.ndarray  # (Q,) question + assistant header + answer prefix, appended after repair
    question: str  # the question text (what relevance-based allocators score against)
    answer: str  # gold after deleting e
    deleted_answer: str  # gold with e present (the deleted value)
    key: str
    values: tuple[str, ...]  # the target key's values in order; the last is in e
    p_text: str
    e_text: str
    s_text: str

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.size)

    @property
    def suffix_length(self) -> int:
        return self.n_tokens - self.edit.p1


def _filler(rng: np.random.Generator) -> str:
    words = [bank[rng.integers(len(bank))] for bank in (_SUBJECTS, _ACTIONS, _PLACES, _TAILS)]
    return " " + " ".join(words)


def _values(rng: np.random.Generator, n: int) -> list[str]:
    """``n`` four-digit numbers with distinct leading digits (1-9)."""
    leads = rng.permutation(np.arange(1, 10))[:n]
    return [f"{lead}{rng.integers(0, 1000):03d}" for lead in leads]


def fact(key: str, value: str, update: bool) -> str:
    """The sentence stating ``key``'s value (with a leading space)."""
    if update:
        return f" Update: the secret number for {key} is now {value}."
    return f" The secret number for {key} is {value}."


def question_text(key: str) -> str:
    return f"What is the latest secret number for {key}? Answer with the number only."


def answer_prefix(key: str) -> str:
    return f"The latest secret number for {key} is "


def make_case(tokenizer: Any, spec: NiahSpec, index: int) -> NiahCase:
    """Case ``index`` of ``spec`` (see the module docstring for the construction)."""
    rng = np.random.default_rng([spec.seed, index])
    target_len = spec.lengths[index % len(spec.lengths)]
    keys = [KEYS[i] for i in rng.permutation(len(KEYS))[: 1 + spec.n_distractors]]
    key, others = keys[0], keys[1:]
    values = _values(rng, spec.n_updates + spec.n_distractors)
    target_values, other_values = values[: spec.n_updates], values[spec.n_updates :]
    head, tail = chat_template_parts(tokenizer, spec.chat)

    # The deleted block, the echoes and the surviving statements; filler sentences around them.
    edit_block = [_filler(rng) for _ in range(spec.edit_filler)]
    edit_block += [fact(key, target_values[-1], True)]
    edit_block += [_filler(rng) for _ in range(spec.edit_filler)]
    echoes = [_ECHOES[i % len(_ECHOES)].format(key=key) for i in range(spec.echoes)]
    fixed = [fact(key, v, i > 0) for i, v in enumerate(target_values[:-1])]
    others_facts = [fact(k, v, False) for k, v in zip(others, other_values, strict=True)]
    fixed_tokens = sum(len(encode_plain(tokenizer, t)) for t in fixed + others_facts + edit_block + echoes)
    budget = target_len - len(encode_plain(tokenizer, head + INTRO)) - fixed_tokens

    fillers: list[str] = []
    used = 0
    while True:
        sentence = _filler(rng)
        n = len(encode_plain(tokenizer, sentence)) + (len(fillers) % 6 == 5)  # + paragraph break
        if used + n > budget:
            break
        fillers.append(sentence)
        used += n
    n_fill = len(fillers)
    edit_slot = int(round(rng.uniform(*spec.edit_depth) * n_fill))
    edit_slot = min(max(edit_slot, spec.n_updates), n_fill - 1)
    target_slots = np.sort(rng.choice(np.arange(1, edit_slot), spec.n_updates - 1, replace=False))
    other_slots = rng.integers(1, int(target_slots[-1]) + 1, size=len(others_facts))

    # Assemble: sentence slot j holds the facts placed there, then filler j.
    before: dict[int, list[str]] = {}
    for slot, text in zip(other_slots, others_facts, strict=True):
        before.setdefault(int(slot), []).append(text)
    for slot, text in zip(target_slots, fixed, strict=True):
        before.setdefault(int(slot), []).append(text)
    p_parts: list[str] = [head, INTRO]
    s_parts: list[str] = []
    parts = p_parts
    for j, sentence in enumerate(fillers):
        if j == edit_slot:
            parts = s_parts
            parts.extend(echoes)
        parts.extend(before.get(j, []))
        if j and j % 6 == 0:
            parts.append(_PARAGRAPH)
        parts.append(sentence.lstrip() if parts and parts[-1].endswith("\n") else sentence)
    e_parts = edit_block

    ids_p = [i for t in p_parts for i in encode_plain(tokenizer, t)]
    ids_e = [i for t in e_parts for i in encode_plain(tokenizer, t)]
    ids_s = [i for t in s_parts for i in encode_plain(tokenizer, t)]
    question = question_text(key)
    query = encode_plain(tokenizer, _PARAGRAPH + question + tail + answer_prefix(key))
    tokens = np.asarray(ids_p + ids_e + ids_s, dtype=np.int64)
    p0 = len(ids_p)
    return NiahCase(
        index=index, tokens=tokens, edit=Edit(p0, p0 + len(ids_e)),
        query=np.asarray(query, dtype=np.int64), question=question,
        answer=target_values[-2], deleted_answer=target_values[-1], key=key,
        values=tuple(target_values), p_text="".join(p_parts), e_text="".join(e_parts),
        s_text="".join(s_parts),
    )


def niah_cases(tokenizer: Any, spec: NiahSpec | None = None) -> list[NiahCase]:
    """``spec.n_cases`` cases, deterministic in ``spec`` and the tokenizer."""
    spec = spec or NiahSpec()
    return [make_case(tokenizer, spec, i) for i in range(spec.n_cases)]


# ---- scoring ------------------------------------------------------------------------------
_NUMBER = re.compile(r"\d(?:[\d,]*\d)?")
RESPONSE_MARKERS = ("<|im_start|>assistant\n", "<start_of_turn>model\n")


def response_text(text: str, prefix: str | None = None) -> str:
    """The part of ``text`` after the response boundary: after the last answer ``prefix`` if
    given and present, else after the last assistant marker, else all of it; first line only."""
    cut = -1
    if prefix and prefix.strip() and prefix.strip() in text:
        cut = text.rindex(prefix.strip()) + len(prefix.strip())
    else:
        for marker in RESPONSE_MARKERS:
            if marker in text:
                cut = max(cut, text.rindex(marker) + len(marker))
    body = text[cut:] if cut >= 0 else text
    body = body.lstrip()
    return body.split("\n", 1)[0]


def parse_numbers(text: str, prefix: str | None = None) -> list[str]:
    """Numbers in the response, in order and with repeats (``"4,821"`` reads as ``4821``)."""
    return [m.replace(",", "") for m in _NUMBER.findall(response_text(text, prefix))]


def score(text: str, gold: str | Sequence[str], prefix: str | None = None) -> bool:
    """Exact match: the response's numbers equal ``gold`` (one value or a list), in order and
    multiplicity; leading zeros are kept (``"0482" != "482"``)."""
    want = [gold] if isinstance(gold, str) else list(gold)
    if not want:
        raise ValueError("gold must name at least one value")
    return parse_numbers(text, prefix) == [w.replace(",", "") for w in want]
