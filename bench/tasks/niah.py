"""Erasing-NIAH: seeded needle-in-a-haystack cases whose gold answer changes when a fact is deleted.

Contract: ``niah_cases(tokenizer, NiahSpec(...), haystack=None)`` returns :class:`NiahCase`
objects, the same ones for the same spec, haystack and tokenizer (all randomness comes from
``numpy`` generators seeded with ``(spec.seed, case index)``, so case ``i`` does not depend on
``n_cases``). ``haystack`` is a sequence of real paragraphs; by default
:func:`haystack_paragraphs` reads them from the multi-hop QA files in ``../shared/data`` (never
copied into the repository). ``score`` parses a greedy answer and compares it with the gold.

The construction (one case), as paper 2's: two same-key facts, deleting one changes the answer.

- One user message of the tokenizer's chat template (plain text when ``spec.chat`` is False):
  an intro saying what will be asked and in which format, then real haystack paragraphs of
  about ``spec.lengths[i % len(lengths)]`` tokens in all (seeded draws from the pool; the
  context ``p + e + s``, question included, stays within that length).
- A *target key* (``"the harbor vault"``) whose access code is stated ``spec.n_values`` times
  (``"The access code for the harbor vault is 4821."``), each fact its own paragraph between
  haystack paragraphs, and ``spec.n_distractors`` other keys stated once each, anywhere.
- One target fact is the deleted span ``e`` (the last one by default; ``spec.deleted="any"``
  picks a seeded one in "list" mode), at the paragraph break nearest to a seeded fraction in
  ``spec.edit_depth`` of the haystack's tokens (``1.0``: right before the question); the
  surviving target facts come before it (``"last"``) or anywhere (``"any"``).
- The question asks for the target's codes: ``spec.answer="list"`` all of them in order
  (gold with ``e``: every value; after the deletion: the others), ``"latest"`` the most recent
  one (``e`` is then always the last fact: gold with ``e`` its value, after the deletion the one
  before).
- ``spec.question_in_cache`` (default True) ends the cached user message with the question, so
  ``s`` holds it and the query is only the template's end-of-turn and assistant header; with
  False the question is part of the query (not cached). Why the default, measured on
  Qwen2.5-Coder-0.5B-Instruct (about 400-1,300-token contexts, 3 cases each): with the question
  in the query, Shift answered like Re-prefill on every case, in both modes and with the deleted
  fact in the middle or right before the question (the deleted digits are gone and the model
  reads the surviving ones again); so did a suffix sentence naming the deleted value, a pronoun
  re-bound by the deletion, and an alias ("the shed's code is the same as the vault's"). With
  the question in the cache and "list", Shift answered two codes where one survived ("3941,
  3941", "1442, 1711") on 5 of 5 cases: the question's states, computed with ``e`` visible, still
  count it. Recomputing all of the question's rows fixed it; its first or last 8 did not. In
  "latest" mode Shift stayed right even with the question in the cache.
- Every value has four digits and a distinct leading digit, and none occurs in the case's
  haystack text.

Token layout: ``tokens = p + e + s`` with ``edit = Edit(p0, p1)`` the rows of ``e``; each text
segment (template head, intro, paragraphs, facts, question) is tokenized on its own and
concatenated, so ``decode(tokens[p0:p1]) == e_text`` exactly and ``e`` is a whole paragraph.

It does not run a model; benchmarks prefill ``tokens``, apply an edit operator, feed ``query``
and score the greedy continuation.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
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
ANSWERS = ("list", "latest")
DELETED = ("last", "any")
_PARAGRAPH = "\n\n"
_SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "multihop"
HAYSTACK_FILES: tuple[Path, ...] = (_SHARED / "hotpotqa_dev50.json", _SHARED / "musique_dev50.json")
MIN_PARAGRAPH_CHARS = 80
_INTRO = {
    "list": ("Below are some documents. Some of them state access codes for vaults. At the end "
             "there is a question about one vault: answer with its access codes only, in the "
             "order they appear, separated by commas. If only one code is stated for that vault, "
             "give just that one."),
    "latest": ("Below are some documents. Some of them state access codes for vaults; a code "
               "stated later replaces an earlier one. At the end there is a question about one "
               "vault: answer with its latest access code only."),
}


@dataclass(frozen=True)
class NiahSpec:
    """How to build the cases (frozen; the defaults are the benchmark's)."""

    n_cases: int = 48
    lengths: tuple[int, ...] = (1024, 2048, 4096)  # context tokens (p + e + s), at most
    n_values: int = 2  # statements of the target key's code; one of them is deleted
    n_distractors: int = 0  # other keys, each stated once (see the module doc for why 0)
    answer: str = "list"  # "list": all codes in order; "latest": the most recent one
    deleted: str = "last"  # which target fact is e: "last", or "any" (seeded; "list" only)
    edit_depth: tuple[float, float] = (0.2, 0.5)  # where e sits, as a fraction of the haystack
    question_in_cache: bool = True  # the question ends the cached message (see module doc)
    seed: int = 0
    chat: bool = True

    def __post_init__(self) -> None:
        if self.n_cases < 0 or not self.lengths or min(self.lengths) < 256:
            raise ValueError(f"need n_cases >= 0 and lengths >= 256, got {self}")
        if not 2 <= self.n_values <= 5 or self.n_values + self.n_distractors > 9 \
                or self.n_distractors < 0:
            raise ValueError(
                f"need 2 <= n_values <= 5, n_distractors >= 0 and n_values + n_distractors <= 9 "
                f"(distinct leading digits), got {self.n_values} and {self.n_distractors}"
            )
        if self.answer not in ANSWERS or self.deleted not in DELETED:
            raise ValueError(f"answer must be one of {ANSWERS} and deleted one of {DELETED}, "
                             f"got {self.answer!r} and {self.deleted!r}")
        if self.answer == "latest" and self.deleted != "last":
            raise ValueError("answer='latest' needs deleted='last' (deleting an earlier fact "
                             "would not change the latest code)")
        lo, hi = self.edit_depth
        if not 0.0 < lo <= hi <= 1.0:
            raise ValueError(f"edit_depth must satisfy 0 < lo <= hi <= 1, got {self.edit_depth}")


@dataclass(frozen=True)
class NiahCase:
    """One case: cached tokens ``p + e + s``, the edit, the query and the answers."""

    index: int
    tokens: np.ndarray  # (N,) token ids of p + e + s
    edit: Edit  # rows [p0, p1) of e
    query: np.ndarray  # (Q,) appended after repair: [question +] end of turn + assistant header
    question: str  # the question text (what relevance-based allocators score against)
    answer: tuple[str, ...]  # gold after deleting e
    deleted_answer: tuple[str, ...]  # gold with e present (what Dirty should answer)
    key: str
    values: tuple[str, ...]  # the target key's codes in context order, e's included
    deleted_index: int  # which of ``values`` is in e
    p_text: str
    e_text: str
    s_text: str

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.size)

    @property
    def suffix_length(self) -> int:
        return self.n_tokens - self.edit.p1


# ---- haystack -------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4)
def _read_haystack(paths: tuple[Path, ...]) -> tuple[str, ...]:
    from tasks.multihop import load_items

    seen: dict[str, None] = {}
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"haystack file {path} is missing (the shared data sets live "
                                    "in ../shared/data beside the repository)")
        for item in load_items(path):
            for passage in item.passages:
                text = " ".join(passage.text.split())
                if len(text) >= MIN_PARAGRAPH_CHARS:
                    seen.setdefault(text, None)
    return tuple(seen)


def haystack_paragraphs(paths: Sequence[str | Path] | None = None) -> tuple[str, ...]:
    """Distinct real paragraphs (whitespace collapsed, >= ``MIN_PARAGRAPH_CHARS`` characters,
    file order) of HotpotQA / MuSiQue files; by default the two in ``../shared/data``."""
    return _read_haystack(tuple(Path(p) for p in (paths or HAYSTACK_FILES)))


# ---- text -----------------------------------------------------------------------------------
def fact(key: str, value: str) -> str:
    """The paragraph stating ``key``'s access code."""
    return f"The access code for the {key} vault is {value}.{_PARAGRAPH}"


def question_text(key: str, answer: str = "list") -> str:
    if answer == "latest":
        return f"Question: what is the latest access code stated for the {key} vault?"
    return f"Question: which access codes are stated for the {key} vault, in order?"


def _values(rng: np.random.Generator, n: int, forbidden: str) -> list[str]:
    """``n`` four-digit codes with distinct leading digits, none a substring of ``forbidden``."""
    leads = rng.permutation(np.arange(1, 10))[:n]
    out = []
    for lead in leads:
        while (value := f"{lead}{rng.integers(0, 1000):03d}") in forbidden:
            pass
        out.append(value)
    return out


def _fill(tokenizer: Any, rng: np.random.Generator, pool: Sequence[str],
          budget: int) -> tuple[list[str], list[int]]:
    """Seeded paragraphs (each followed by a paragraph break) of at most ``budget`` tokens in
    all, and their token counts."""
    picked: list[str] = []
    sizes: list[int] = []
    used = misses = 0
    for i in rng.permutation(len(pool)):
        if budget - used < 16 or misses > 64:
            break
        text = pool[int(i)] + _PARAGRAPH
        n = len(encode_plain(tokenizer, text))
        if used + n <= budget:
            picked.append(text)
            sizes.append(n)
            used += n
        else:
            misses += 1
    if not picked:
        raise ValueError(f"no haystack paragraph fits in {budget} tokens")
    return picked, sizes


def make_case(tokenizer: Any, spec: NiahSpec, index: int,
              haystack: Sequence[str] | None = None) -> NiahCase:
    """Case ``index`` of ``spec`` (see the module docstring for the construction)."""
    pool = haystack if haystack is not None else haystack_paragraphs()
    rng = np.random.default_rng([spec.seed, index])
    target_len = spec.lengths[index % len(spec.lengths)]
    keys = [KEYS[i] for i in rng.permutation(len(KEYS))[: 1 + spec.n_distractors]]
    key, others = keys[0], keys[1:]
    head, tail = chat_template_parts(tokenizer, spec.chat)
    intro = _INTRO[spec.answer] + _PARAGRAPH
    question = question_text(key, spec.answer)
    q_cached = question if spec.question_in_cache else ""
    query_text = tail if spec.question_in_cache else question + tail
    fact_tokens = sum(len(encode_plain(tokenizer, fact(k, "1234")))
                      for k in [key] * spec.n_values + others)
    budget = (target_len - len(encode_plain(tokenizer, head + intro))
              - len(encode_plain(tokenizer, q_cached)) - fact_tokens)
    paragraphs, sizes = _fill(tokenizer, rng, pool, budget)
    values = _values(rng, spec.n_values + spec.n_distractors, "".join(paragraphs))
    target_values, other_values = values[: spec.n_values], values[spec.n_values :]

    # Slot j holds the facts placed before paragraph j (slot m: after the last one); within a
    # slot, facts go in tie-break order (distractors first, then the target's in value order).
    m = len(paragraphs)
    last = m if spec.question_in_cache or m == 1 else m - 1  # a non-empty suffix if possible
    # e's slot: the paragraph break nearest to the drawn fraction of the haystack's tokens
    ends = np.cumsum(sizes)[:last]  # (last,) haystack tokens before slots 1..last
    target = rng.uniform(*spec.edit_depth) * float(np.sum(sizes))
    e_slot = 1 + int(np.argmin(np.abs(ends - target)))
    n_before = spec.n_values - 1 if spec.deleted == "last" else int(rng.integers(spec.n_values))
    before = np.sort(rng.integers(0, e_slot + 1, size=n_before))
    after = np.sort(rng.integers(e_slot, last + 1, size=spec.n_values - 1 - n_before))
    target_slots = [*before.tolist(), e_slot, *after.tolist()]
    deleted = n_before  # e is the target's fact number n_before, in context order
    facts: list[tuple[int, float, str, bool]] = []  # (slot, tie-break, text, is e)
    for k, (slot, value) in enumerate(zip(target_slots, target_values, strict=True)):
        facts.append((int(slot), float(k), fact(key, value), k == deleted))
    for k, (other, value) in enumerate(zip(others, other_values, strict=True)):
        facts.append((int(rng.integers(0, m + 1)), -1.0 - k, fact(other, value), False))
    facts.sort(key=lambda f: (f[0], f[1]))

    p_parts, e_parts, s_parts = [head, intro], [], []
    parts = p_parts
    by_slot: dict[int, list[tuple[str, bool]]] = {}
    for slot, _, text, is_e in facts:
        by_slot.setdefault(slot, []).append((text, is_e))
    for j in range(m + 1):
        for text, is_e in by_slot.get(j, []):
            if is_e:
                e_parts.append(text)
                parts = s_parts
            else:
                parts.append(text)
        if j < m:
            parts.append(paragraphs[j])
    if q_cached:
        s_parts.append(q_cached)

    ids_p = [i for t in p_parts for i in encode_plain(tokenizer, t)]
    ids_e = [i for t in e_parts for i in encode_plain(tokenizer, t)]
    ids_s = [i for t in s_parts for i in encode_plain(tokenizer, t)]
    kept = tuple(v for k, v in enumerate(target_values) if k != deleted)
    if spec.answer == "list":
        answer, deleted_answer = kept, tuple(target_values)
    else:
        answer, deleted_answer = (kept[-1],), (target_values[-1],)
    p0 = len(ids_p)
    return NiahCase(
        index=index, tokens=np.asarray(ids_p + ids_e + ids_s, dtype=np.int64),
        edit=Edit(p0, p0 + len(ids_e)),
        query=np.asarray(encode_plain(tokenizer, query_text), dtype=np.int64), question=question,
        answer=answer, deleted_answer=deleted_answer, key=key, values=tuple(target_values),
        deleted_index=deleted, p_text="".join(p_parts), e_text="".join(e_parts),
        s_text="".join(s_parts),
    )


def niah_cases(tokenizer: Any, spec: NiahSpec | None = None,
               haystack: Sequence[str] | None = None) -> list[NiahCase]:
    """``spec.n_cases`` cases, deterministic in ``spec``, the haystack and the tokenizer."""
    spec = spec or NiahSpec()
    pool = haystack if haystack is not None else haystack_paragraphs()
    return [make_case(tokenizer, spec, i, pool) for i in range(spec.n_cases)]


# ---- scoring ------------------------------------------------------------------------------
_NUMBER = re.compile(r"\d(?:[\d,]*\d)?")
RESPONSE_MARKERS = ("<|im_start|>assistant\n", "<start_of_turn>model\n")


def response_text(text: str, prefix: str | None = None) -> str:
    """The part of ``text`` after the response boundary: after the last answer ``prefix`` if
    given and present, else after the last assistant marker, else all of it; first non-empty
    line only."""
    cut = -1
    if prefix and prefix.strip() and prefix.strip() in text:
        cut = text.rindex(prefix.strip()) + len(prefix.strip())
    else:
        for marker in RESPONSE_MARKERS:
            if marker in text:
                cut = max(cut, text.rindex(marker) + len(marker))
    body = text[cut:] if cut >= 0 else text
    lines = [line for line in body.splitlines() if line.strip()]
    return lines[0].strip() if lines else ""


def parse_numbers(text: str, prefix: str | None = None) -> list[str]:
    """Codes in the response, in order and with repeats. A comma between digits with a space
    after it separates two codes (``"4821, 7730"``); without one it is a thousands separator
    (``"4,821"`` reads as ``4821``)."""
    body = re.sub(r",\s+", " ", response_text(text, prefix))
    return [m.replace(",", "") for m in _NUMBER.findall(body)]


def score(text: str, gold: str | Sequence[str], prefix: str | None = None) -> bool:
    """Exact match: the response's numbers equal ``gold`` (one value or a list), in order and
    multiplicity; leading zeros are kept (``"0482" != "482"``)."""
    want = [gold] if isinstance(gold, str) else list(gold)
    if not want:
        raise ValueError("gold must name at least one value")
    return parse_numbers(text, prefix) == [w.replace(",", "") for w in want]
