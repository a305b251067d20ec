"""The agent loop's completeness review: before a run ends on a text answer, ask the model which
parts of the request the conversation's tool results do not answer yet, and have it call a tool
for those parts instead of answering.

Contract: ``unanswered_parts(session, visible, tools, request)`` asks the live session, with one
temporary user message after ``visible`` (:data:`DEFAULT_REVIEW_PROMPT`, ``{request}`` standing
for the request), for a JSON object under :data:`REVIEW_SCHEMA` (constrained decoding, no tool
call allowed) and returns its ``unanswered_parts`` that come from the request: distinct strings
at least half of whose words (of three or more letters or digits) are the request's, at most
:data:`MAX_PARTS` (small models also list remarks there, "The tool results above already
answer the request."); a reply that does not parse (cut at ``max_tokens``) counts as none.
``worth_asking(part, request, asked, called)`` says which of them to ask a call for (not one
already asked for, nor the whole request once a call was made), ``follow_up_prompt(part)`` is the
temporary user message that then asks for a part's call, and
:data:`EVERY_PART_PROMPT` the answer prompt for the steps after it. Small models answer a
two-part request ("what changed in the last commit, and what time is it in Tokyo now?") after
the first part's result, yet name the second part as unanswered when asked, call its tool when a
call is required, and then answer only the part of the latest result unless asked for every part
of the quoted request (Qwen2.5-Coder-1.5B does all three). The review's messages are never
kept in the conversation: the next step's rendering drops them from the live cache (an edit at
the end the session reuses up to).

It does not decide when to review or what to do with a forced call: that is the loop's
(:func:`~nexus_mlx.agent.loop.run_agent`, ``review``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from nexus_mlx.agent.session import Reply, Session

REQUEST_PLACEHOLDER = "{request}"  # stands for the request's text in the prompts here
MAX_PARTS = 4
WHOLE_REQUEST = 0.9  # the share of the request's words that makes a part the whole request
REVIEW_TOKENS = 160  # enough for both lists of a request of a few parts
DEFAULT_REVIEW_PROMPT = (
    'My request was: "{request}"\nSplit my request into its parts. Which parts do the tool '
    "results above already answer, and which parts still need another tool call? Reply in JSON.")
EVERY_PART_PROMPT = ('My request was: "{request}"\nUsing the tool results above, answer every '
                     "part of it in plain words.")
FOLLOW_UP_PROMPT = ("Call a tool now for the part of my request that is not answered yet: "
                    "{part}")
REVIEW_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "answered_parts": {"type": "array", "items": {"type": "string"}},
        "unanswered_parts": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["answered_parts", "unanswered_parts"],
    "additionalProperties": False,
}


def with_request(prompt: str, request: str) -> str:
    """``prompt`` with each ``{request}`` replaced by the request's text, stripped (the only
    placeholder; other braces stay as written). The loop's answer prompts use it too."""
    return prompt.replace(REQUEST_PLACEHOLDER, request.strip())


def review_reply(session: Session, visible: Sequence[Mapping[str, Any]],
                 tools: Sequence[Mapping[str, Any]], request: str,
                 prompt: str = DEFAULT_REVIEW_PROMPT) -> Reply:
    """The model's review of ``visible`` (a JSON object under :data:`REVIEW_SCHEMA`)."""
    question = with_request(prompt, request)
    return session.generate([*visible, {"role": "user", "content": question}], tools,
                            tool_choice="none", max_tokens=REVIEW_TOKENS,
                            response_format={"type": "json_schema", "json_schema": {
                                "name": "review", "schema": REVIEW_SCHEMA}})


def _words(text: str) -> list[str]:
    return [w for w in re.findall(r"[a-z0-9]+", text.lower()) if len(w) > 2]


def from_request(part: str, request: str) -> bool:
    """Whether at least half of ``part``'s words are ``request``'s (and it has words)."""
    words, asked = _words(part), set(_words(request))
    return bool(words) and 2 * sum(w in asked for w in words) >= len(words)


def parts_of(text: str, request: str) -> list[str]:
    """The distinct ``unanswered_parts`` of a review's text that come from ``request``, at
    most :data:`MAX_PARTS`; none when the text is not such an object."""
    try:
        value = json.loads(text)
    except ValueError:
        return []
    parts = value.get("unanswered_parts") if isinstance(value, dict) else None
    if not isinstance(parts, list):
        return []
    cleaned = (p.strip() for p in parts if isinstance(p, str))
    return list(dict.fromkeys(p for p in cleaned if from_request(p, request)))[:MAX_PARTS]


def unanswered_parts(session: Session, visible: Sequence[Mapping[str, Any]],
                     tools: Sequence[Mapping[str, Any]], request: str,
                     prompt: str = DEFAULT_REVIEW_PROMPT) -> list[str]:
    """The parts of ``request`` the model says ``visible``'s tool results do not answer."""
    return parts_of(review_reply(session, visible, tools, request, prompt).text, request)


def part_key(part: str) -> frozenset[str]:
    """The words that identify a part (two wordings of one part share them)."""
    return frozenset(_words(part))


def worth_asking(part: str, request: str, asked: set[frozenset[str]], called: bool) -> bool:
    """Whether to ask for a call for ``part``: not a part already asked for in this run
    (``asked``: their :func:`part_key`), nor, once a call has been made (``called``), the whole
    request again (at least :data:`WHOLE_REQUEST` of its words): after a one-part request's
    call, small models name the request itself as unanswered (Qwen2.5-Coder-1.5B does, and then
    repeats the call)."""
    key, whole = part_key(part), part_key(request)
    if key in asked:
        return False
    return not (called and whole and len(key & whole) >= WHOLE_REQUEST * len(whole))


def follow_up_prompt(part: str) -> str:
    """The temporary user message asking for a call for ``part``."""
    return FOLLOW_UP_PROMPT.replace("{part}", part)
