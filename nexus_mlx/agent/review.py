"""The agent loop's completeness review: before a run that made calls ends on a text answer,
split the request into its parts and, for each part, have the model make the call that part
needs; a call not made yet is made instead of answering.

Contract: ``request_parts(session, visible, tools, request)`` asks the live session, with one
temporary user message after ``visible`` (:data:`DEFAULT_SPLIT_PROMPT`, ``{request}`` standing
for the request), for a JSON object under :data:`SPLIT_SCHEMA` (constrained decoding, no tool
call allowed) and returns its ``parts`` that come from the request: distinct strings at least
:data:`FROM_REQUEST` of whose words (of three or more letters or digits) are the request's, at
most :data:`MAX_PARTS` (small models also copy the question there, "Split my request into its
parts", or add a task of their own, "Get current time in America/New_York"); a reply that does
not parse (cut at ``max_tokens``) has none. ``follow_up_prompt(part)`` is the temporary user
message that then asks for one part's call (the loop requires one; a call already made means the
part was covered), and :data:`EVERY_PART_PROMPT` the answer prompt for the steps after a call
the review found missing. Small models answer a two-part request ("what changed in the last
commit, and what time is it in Tokyo now?") after the first part's result, yet split it when
asked, make the missing call when one is required for that part alone, and then answer only the
part of the latest result unless asked for every part of the quoted request: Qwen2.5-Coder-1.5B
does all three; the 0.5B splits some two-part requests and makes their missing call. Asked
instead which parts the results leave unanswered, the 0.5B named none, ever, and the 1.5B often
named the whole request. The review's messages are never kept in the conversation: the next
step's rendering drops them from the live cache (an edit at the end the session reuses up to).

It does not decide when to review or what to do with the calls: that is the loop's
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
FROM_REQUEST = 0.75  # the share of a part's words that must be the request's
SPLIT_TOKENS = 160  # enough for a request of a few parts, each copied in the request's words
DEFAULT_SPLIT_PROMPT = (
    'My request was: "{request}"\nSplit my request into its separate questions or tasks, each '
    "in my words. Reply in JSON.")
EVERY_PART_PROMPT = ('My request was: "{request}"\nUsing the tool results above, answer every '
                     "part of it in plain words.")
FOLLOW_UP_PROMPT = "Call a tool now for this part of my request: {part}"
SPLIT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"parts": {"type": "array", "items": {"type": "string"}}},
    "required": ["parts"],
    "additionalProperties": False,
}


def with_request(prompt: str, request: str) -> str:
    """``prompt`` with each ``{request}`` replaced by the request's text, stripped (the only
    placeholder; other braces stay as written). The loop's answer prompts use it too."""
    return prompt.replace(REQUEST_PLACEHOLDER, request.strip())


def split_reply(session: Session, visible: Sequence[Mapping[str, Any]],
                tools: Sequence[Mapping[str, Any]], request: str,
                prompt: str = DEFAULT_SPLIT_PROMPT) -> Reply:
    """The model's split of ``request``, after ``visible`` (a JSON object under
    :data:`SPLIT_SCHEMA`)."""
    question = with_request(prompt, request)
    return session.generate([*visible, {"role": "user", "content": question}], tools,
                            tool_choice="none", max_tokens=SPLIT_TOKENS,
                            response_format={"type": "json_schema", "json_schema": {
                                "name": "parts", "schema": SPLIT_SCHEMA}})


def _words(text: str) -> list[str]:
    return [w for w in re.findall(r"[a-z0-9]+", text.lower()) if len(w) > 2]


def from_request(part: str, request: str) -> bool:
    """Whether at least :data:`FROM_REQUEST` of ``part``'s words are ``request``'s (and it
    has words)."""
    words, asked = _words(part), set(_words(request))
    return bool(words) and sum(w in asked for w in words) >= FROM_REQUEST * len(words)


def parts_of(text: str, request: str) -> list[str]:
    """The distinct ``parts`` of a split's text that come from ``request`` (two wordings of one
    part, :func:`part_key`, count once), at most :data:`MAX_PARTS`; none when the text is not
    such an object."""
    try:
        value = json.loads(text)
    except ValueError:
        return []
    parts = value.get("parts") if isinstance(value, dict) else None
    if not isinstance(parts, list):
        return []
    kept: dict[frozenset[str], str] = {}
    for part in parts:
        if isinstance(part, str) and from_request(part, request):
            kept.setdefault(part_key(part), part.strip())
    return list(kept.values())[:MAX_PARTS]


def request_parts(session: Session, visible: Sequence[Mapping[str, Any]],
                  tools: Sequence[Mapping[str, Any]], request: str,
                  prompt: str = DEFAULT_SPLIT_PROMPT) -> list[str]:
    """The parts of ``request``, as the model splits it after ``visible``."""
    return parts_of(split_reply(session, visible, tools, request, prompt).text, request)


def part_key(part: str) -> frozenset[str]:
    """The words that identify a part (two wordings of one part share them)."""
    return frozenset(_words(part))


def follow_up_prompt(part: str) -> str:
    """The temporary user message asking for the call ``part`` needs."""
    return FOLLOW_UP_PROMPT.replace("{part}", part)
