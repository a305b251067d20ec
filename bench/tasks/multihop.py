"""Multi-hop QA repair cases (HotpotQA / MuSiQue) and SQuAD-style normalized exact match.

Contract: ``load_items(path)`` reads a HotpotQA-format file (``context`` as ``[title,
[sentences]]``, ``supporting_facts``, ``answer``) or a MuSiQue-format file (``paragraphs`` with
``is_supporting``, ``answer``, ``answer_aliases``) into :class:`QAItem` objects.
``build_case(tokenizer, item, index, spec, substitutes)`` turns one item into a :class:`QACase`,
the same one for the same inputs (a ``numpy`` generator seeded with ``(spec.seed, index)``):

- One user message of the chat template (plain text when ``spec.chat`` is False): an
  instruction asking for a short answer, then passages ``"Title: ...\n<text>\n\n"``: one
  kept distractor (a non-supporting passage), the supporting passages in their original order,
  then ``spec.kept_distractors - 1`` more kept distractors.
- One more passage is *inserted* and is the deleted span ``e``: before the first supporting
  passage, between two of them (a seeded gap; items with one supporting passage use "after")
  or after the last, cycling ``before, between, after`` with ``index``. What it is
  (``spec.deleted``): ``"distractor"``, another non-supporting passage of the item, or
  ``"conflict"``, a copy of the last supporting passage that contains the answer with every
  occurrence of the answer replaced by a *substitute* (another item's answer of the same crude
  type: a number, a capitalized name or a phrase; seeded): a wrong version of the evidence, so deleting it changes what the context supports.
  Items whose answer occurs in no supporting passage (yes/no questions, mostly) fall back to a
  distractor; ``QACase.deleted_kind`` says which, ``QACase.substitute`` is the planted answer.
- ``spec.question_in_cache`` (default True): the question ends the cached message (so ``s``
  holds it) and the query is only the template's end-of-turn and assistant header; with False
  the question is the query's start. Why the default: in Erasing-NIAH (``tasks.niah``) a cached
  question is what keeps the deleted span's trace in the suffix (see there).

``tokens = p + e + s``, each passage tokenized on its own, so ``decode(tokens[p0:p1])`` is
exactly the inserted passage. ``normalize_answer`` is SQuAD's (lower case, no punctuation, no
articles ``a/an/the``, single spaces); ``exact_match(prediction, answers)`` is 1.0 when the
normalized prediction equals any normalized gold answer (answer or alias).
``prediction_text(text)`` takes the first line after the response boundary, drops a leading
``Answer:``, and reads a line that opens with ``Yes``/``No`` and punctuation ("No, they are
not ...") as that word. It does not run a model.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nexus_mlx.refresh.edit import Edit
from tasks.prompting import chat_template_parts, encode_plain

PLACEMENTS = ("before", "between", "after")
DELETED = ("distractor", "conflict")
INSTRUCTION = ("Answer the question at the end using the passages below. Reply with the answer "
               "only: a name, a date, a number or a short phrase (yes or no if the question asks "
               "which of two), with no explanation.\n\n")


@dataclass(frozen=True)
class Passage:
    title: str
    text: str
    supporting: bool


@dataclass(frozen=True)
class QAItem:
    id: str
    question: str
    answers: tuple[str, ...]  # the answer first, then aliases
    passages: tuple[Passage, ...]
    dataset: str


@dataclass(frozen=True)
class QASpec:
    kept_distractors: int = 2  # non-supporting passages that stay (>= 2: one before, one after)
    deleted: str = "conflict"  # what e is: "distractor" or "conflict" (see the module doc)
    question_in_cache: bool = True
    seed: int = 0
    chat: bool = True

    def __post_init__(self) -> None:
        if self.kept_distractors < 2:
            raise ValueError(f"kept_distractors must be >= 2, got {self.kept_distractors}")
        if self.deleted not in DELETED:
            raise ValueError(f"deleted must be one of {DELETED}, got {self.deleted!r}")


@dataclass(frozen=True)
class QACase:
    id: str
    dataset: str
    tokens: np.ndarray  # (N,) p + e + s
    edit: Edit  # rows of the inserted passage
    query: np.ndarray  # (Q,) [question +] end of turn + assistant header
    question: str
    answers: tuple[str, ...]
    placement: str  # before / between / after the supporting evidence
    inserted_title: str
    deleted_kind: str  # "distractor" or "conflict"
    substitute: str | None  # the answer planted in a conflict passage (None for a distractor)
    p_text: str
    e_text: str
    s_text: str

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.size)


# ---- loading -------------------------------------------------------------------------------
def _hotpot_item(raw: dict[str, Any]) -> QAItem:
    support = {title for title, _ in raw["supporting_facts"]}
    passages = tuple(
        Passage(title, "".join(sentences).strip(), title in support)
        for title, sentences in raw["context"]
    )
    return QAItem(str(raw["_id"]), raw["question"], (raw["answer"],), passages, "hotpotqa")


def _musique_item(raw: dict[str, Any]) -> QAItem:
    passages = tuple(
        Passage(p["title"], p["paragraph_text"].strip(), bool(p["is_supporting"]))
        for p in raw["paragraphs"]
    )
    answers = (raw["answer"], *raw.get("answer_aliases", []))
    return QAItem(str(raw["id"]), raw["question"], answers, passages, "musique")


def load_items(path: str | Path) -> list[QAItem]:
    """Items of a HotpotQA- or MuSiQue-format JSON list (the format is read from the keys)."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, list) or not data:
        raise ValueError(f"{path}: expected a non-empty JSON list of questions")
    first = data[0]
    if "context" in first and "supporting_facts" in first:
        return [_hotpot_item(raw) for raw in data]
    if "paragraphs" in first:
        return [_musique_item(raw) for raw in data]
    raise ValueError(f"{path}: neither HotpotQA (context, supporting_facts) nor MuSiQue "
                     f"(paragraphs) format; keys are {sorted(first)}")


# ---- cases ---------------------------------------------------------------------------------
def passage_text(passage: Passage) -> str:
    return f"Title: {passage.title}\n{passage.text}\n\n"


_YES_NO_ANSWERS = {"yes", "no"}


def _kind(answer: str) -> str:
    """A crude answer type: "number" (has a digit), "name" (capitalized) or "phrase"."""
    if any(ch.isdigit() for ch in answer):
        return "number"
    return "name" if answer.strip()[:1].isupper() else "phrase"


def _occurrences(answer: str) -> re.Pattern[str]:
    return re.compile(rf"(?<!\w){re.escape(answer)}(?!\w)", re.IGNORECASE)


def conflict_passage(item: QAItem, rng: np.random.Generator, substitutes: Sequence[str],
                     context: str) -> tuple[Passage, str] | None:
    """A copy of the last supporting passage holding one of the item's answers, each occurrence
    (in its title too) replaced by a seeded substitute of the same crude kind (``_kind``) that is not a gold answer
    and occurs nowhere in ``context``; None when no passage or no substitute qualifies."""
    golds = {normalize_answer(a) for a in item.answers}
    for passage in reversed([p for p in item.passages if p.supporting]):
        found = [a for a in item.answers if normalize_answer(a) not in _YES_NO_ANSWERS
                 and normalize_answer(a) and _occurrences(a).search(passage.text)]
        if found:
            break
    else:
        return None
    answer = found[0]
    pool = sorted({c for c in substitutes if _kind(c) == _kind(answer)
                   and normalize_answer(c) not in golds | _YES_NO_ANSWERS | {""}
                   and c.lower() not in context.lower()})
    if not pool:
        return None
    substitute = pool[int(rng.integers(len(pool)))]
    swap = _occurrences(answer)
    title = swap.sub(lambda _: substitute, passage.title)  # a title naming the answer, too
    return Passage(title, swap.sub(lambda _: substitute, passage.text), False), substitute


def build_case(tokenizer: Any, item: QAItem, index: int, spec: QASpec | None = None,
               substitutes: Sequence[str] = ()) -> QACase:
    """Case ``index`` from ``item``; ``substitutes``: candidate planted answers for a conflict
    passage (other items' answers; see the module docstring)."""
    spec = spec or QASpec()
    rng = np.random.default_rng([spec.seed, index])
    support = [p for p in item.passages if p.supporting]
    others = [p for p in item.passages if not p.supporting]
    if not support or len(others) < spec.kept_distractors + 1:
        raise ValueError(
            f"item {item.id}: needs >= 1 supporting and >= {spec.kept_distractors + 1} "
            f"non-supporting passages, has {len(support)} and {len(others)}"
        )
    picked = [others[i] for i in rng.permutation(len(others))[: spec.kept_distractors + 1]]
    inserted, kept = picked[0], picked[1:]
    placement = PLACEMENTS[index % len(PLACEMENTS)]
    if placement == "between" and len(support) < 2:
        placement = "after"
    if placement == "before":
        gap = 0
    elif placement == "between":
        gap = int(rng.integers(1, len(support)))
    else:
        gap = len(support)
    ordered = [kept[0], *support[:gap]], [*support[gap:], *kept[1:]]
    kind, substitute = "distractor", None
    if spec.deleted == "conflict":
        context = "".join(passage_text(p) for p in [*ordered[0], *ordered[1]]) + item.question
        conflict = conflict_passage(item, rng, substitutes, context)
        if conflict is not None:
            (inserted, substitute), kind = conflict, "conflict"
    head, tail = chat_template_parts(tokenizer, spec.chat)
    question = f"Question: {item.question}"
    p_parts = [head, INSTRUCTION] + [passage_text(p) for p in ordered[0]]
    e_text = passage_text(inserted)
    s_parts = [passage_text(p) for p in ordered[1]]
    if spec.question_in_cache:
        s_parts.append(question)
    ids_p = [i for t in p_parts for i in encode_plain(tokenizer, t)]
    ids_e = encode_plain(tokenizer, e_text)
    ids_s = [i for t in s_parts for i in encode_plain(tokenizer, t)]
    query = encode_plain(tokenizer, tail if spec.question_in_cache else question + tail)
    p0 = len(ids_p)
    return QACase(
        id=item.id, dataset=item.dataset, tokens=np.asarray(ids_p + ids_e + ids_s, np.int64),
        edit=Edit(p0, p0 + len(ids_e)), query=np.asarray(query, np.int64),
        question=item.question, answers=item.answers, placement=placement,
        inserted_title=inserted.title, deleted_kind=kind, substitute=substitute,
        p_text="".join(p_parts), e_text=e_text, s_text="".join(s_parts),
    )


def build_cases(tokenizer: Any, items: Sequence[QAItem], spec: QASpec | None = None) -> list[QACase]:
    """One case per item (the case index is the item's index); conflict substitutes are drawn
    from the other items' first answers."""
    pool = [item.answers[0] for item in items]
    return [build_case(tokenizer, item, i, spec, pool) for i, item in enumerate(items)]


# ---- scoring -------------------------------------------------------------------------------
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)
RESPONSE_MARKERS = ("<|im_start|>assistant\n", "<start_of_turn>model\n")
_LEAD = re.compile(r"^\s*(the\s+)?answer\s*(is)?\s*[:\-]?\s*", re.IGNORECASE)
_YES_NO = re.compile(r"^(yes|no)\s*[,.;:!]", re.IGNORECASE)


def normalize_answer(text: str) -> str:
    """SQuAD normalization: lower, drop punctuation, drop articles, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def prediction_text(text: str) -> str:
    """The answer in a generation: after the last response marker if any, first non-empty
    line, a leading ``Answer:`` / ``The answer is`` removed."""
    cut = max((text.rindex(m) + len(m) for m in RESPONSE_MARKERS if m in text), default=0)
    body = text[cut:]
    for marker in ("<|im_end|>", "<end_of_turn>", "<|endoftext|>"):
        body = body.split(marker, 1)[0]
    lines = [line for line in body.splitlines() if line.strip()]
    first = lines[0] if lines else ""
    answer = _LEAD.sub("", first, count=1).strip()
    yes_no = _YES_NO.match(answer)
    return yes_no.group(1) if yes_no else answer


def exact_match(prediction: str, answers: str | Sequence[str]) -> float:
    """1.0 if the normalized prediction equals a normalized gold answer, else 0.0."""
    golds = [answers] if isinstance(answers, str) else list(answers)
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in golds))
