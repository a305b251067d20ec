"""Multi-hop QA repair cases (HotpotQA / MuSiQue) and SQuAD-style normalized exact match.

Contract: ``load_items(path)`` reads a HotpotQA-format file (``context`` as ``[title,
[sentences]]``, ``supporting_facts``, ``answer``) or a MuSiQue-format file (``paragraphs`` with
``is_supporting``, ``answer``, ``answer_aliases``) into :class:`QAItem` objects.
``build_case(tokenizer, item, index, spec)`` turns one item into a :class:`QACase`, the same one
for the same inputs (a ``numpy`` generator seeded with ``(spec.seed, index)``):

- Passages ``"Title: ...\\n<text>\\n\\n"`` in one user message of the chat template (plain text
  when ``spec.chat`` is False): one kept distractor (a non-supporting passage), then the
  supporting passages in their original order, then ``spec.kept_distractors - 1`` more kept
  distractors, so the suffix is never empty.
- One more non-supporting passage is *inserted* and is the deleted span ``e``: before the first
  supporting passage, between two of them (a seeded gap; items with one supporting passage use
  "after") or after the last, cycling ``before, between, after`` with ``index``.
- ``query`` (not in the cache): the question, an instruction to answer in a few words, the
  template's end-of-turn and assistant header, and the answer prefix ``"Answer:"`` (measured on
  16 questions with the default model: without it the model restates the question in a full
  sentence and matches 0/16; with it, 1/16, and its answers are short).

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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nexus_mlx.refresh.edit import Edit
from tasks.prompting import chat_template_parts, encode_plain

PLACEMENTS = ("before", "between", "after")
INSTRUCTION = "Read the passages and answer the question.\n\n"
ANSWER_PREFIX = "Answer:"


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
    seed: int = 0
    chat: bool = True

    def __post_init__(self) -> None:
        if self.kept_distractors < 2:
            raise ValueError(f"kept_distractors must be >= 2, got {self.kept_distractors}")


@dataclass(frozen=True)
class QACase:
    id: str
    dataset: str
    tokens: np.ndarray  # (N,) p + e + s
    edit: Edit  # rows of the inserted passage
    query: np.ndarray  # (Q,) question + instruction + assistant header
    question: str
    answers: tuple[str, ...]
    placement: str  # before / between / after the supporting evidence
    inserted_title: str
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


def build_case(tokenizer: Any, item: QAItem, index: int, spec: QASpec | None = None) -> QACase:
    """Case ``index`` from ``item`` (see the module docstring)."""
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
    head, tail = chat_template_parts(tokenizer, spec.chat)
    p_parts = [head, INSTRUCTION] + [passage_text(p) for p in ordered[0]]
    e_text = passage_text(inserted)
    s_parts = [passage_text(p) for p in ordered[1]]
    ids_p = [i for t in p_parts for i in encode_plain(tokenizer, t)]
    ids_e = encode_plain(tokenizer, e_text)
    ids_s = [i for t in s_parts for i in encode_plain(tokenizer, t)]
    query = encode_plain(tokenizer,
                    f"Question: {item.question}\nAnswer in a few words.{tail}{ANSWER_PREFIX}")
    p0 = len(ids_p)
    return QACase(
        id=item.id, dataset=item.dataset, tokens=np.asarray(ids_p + ids_e + ids_s, np.int64),
        edit=Edit(p0, p0 + len(ids_e)), query=np.asarray(query, np.int64),
        question=item.question, answers=item.answers, placement=placement,
        inserted_title=inserted.title, p_text="".join(p_parts), e_text=e_text,
        s_text="".join(s_parts),
    )


def build_cases(tokenizer: Any, items: Iterable[QAItem], spec: QASpec | None = None) -> list[QACase]:
    """One case per item; the case index is the item's index."""
    return [build_case(tokenizer, item, i, spec) for i, item in enumerate(items)]


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
