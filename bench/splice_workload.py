"""The deterministic workload shared by the splice benchmarks (dkl_sweep, deep_splice_ttft,
gating_nogo): GitHub MCP tool schemas, one user request per tool, and live contexts of any exact
token length (an on-topic GitHub assistant conversation, or off-topic prose).

Contract:
- ``load_tools()`` reads ``../shared/data/github-mcp/tools.json`` (117 real tool definitions);
  a tool's block text is ``schema_text(tool) = json.dumps(tool)``.
- ``REQUESTS`` maps ten tool names to a user request for that tool; ``query_ids`` wraps a request
  in the model's chat markup (user turn, then the assistant header), so the next token after it is
  the assistant's first token.
- ``context_ids(tokenizer, kind, n)`` returns exactly ``n`` token ids (``whole_turns=True``: the
  longest run of whole pieces of at most ``n``): ``kind="on"`` is the system
  prompt followed by a GitHub conversation, ``kind="off"`` is unrelated prose. Both are built from
  templates whose slots cycle through fixed lists, so no two turns or paragraphs are identical and
  the same ``n`` always gives the same ids. Pieces are tokenized separately and concatenated, so a
  shorter context is a prefix of a longer one and ``system_ids`` is a prefix of every on-topic one.

It knows no model, cache, timing or metric (next-token KL and top-1 agreement are
``nexus_mlx.metrics``).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

from common import shared_data

TOOLS_PATH = shared_data("github-mcp", "tools.json")

SYSTEM = (
    "<|im_start|>system\nYou are a helpful assistant that manages GitHub repositories for the "
    "user. You can call GitHub tools; their JSON schemas follow the conversation. Answer "
    "briefly and call a tool when the user asks for an action.<|im_end|>\n"
)

REQUESTS: dict[str, str] = {
    "create_issue": "Please open an issue in octo-org/webapp titled 'Login page crashes on "
    "Safari' and describe the crash in one sentence.",
    "get_file_contents": "Show me the contents of src/config.yaml on the main branch of "
    "octo-org/webapp.",
    "search_repositories": "Find GitHub repositories about async runtimes written in Rust "
    "with more than a thousand stars.",
    "create_branch": "Create a new branch called feature/dark-mode from main in "
    "octo-org/webapp.",
    "add_issue_comment": "Add a comment to issue #17 in octo-org/webapp saying that the fix "
    "has been deployed to production.",
    "create_pull_request": "Open a pull request from feature/dark-mode into main in "
    "octo-org/webapp titled 'Add dark mode'.",
    "add_sub_issue": "Make issue #88 a sub-issue of the tracking issue #80 in "
    "octo-org/webapp.",
    "push_files": "Commit README.md and docs/setup.md to the docs-refresh branch of "
    "octo-org/webapp in a single push.",
    "get_repository_tree": "List every file under the src directory of octo-org/webapp, "
    "recursively.",
    "list_branches": "Which branches exist in the octo-org/webapp repository right now?",
}

# ---- on-topic: a GitHub assistant conversation ---------------------------------------------
_REPOS = ["octo-org/webapp", "acme/payments-api", "lab42/vision-kit", "octo-org/infra",
          "acme/mobile-client", "lab42/docs-site", "octo-org/cli", "acme/data-pipeline"]
_BRANCHES = ["main", "develop", "release/2.4", "fix/timeout", "feature/search", "hotfix/login"]
_PEOPLE = ["mona", "hubot", "alice-dev", "bkumar", "chen-li", "dpetrov", "erin-ops"]
_FILES = ["src/server.py", "package.json", "Dockerfile", "docs/index.md", "ci/build.yml",
          "lib/auth.ts", "Makefile", "tests/test_api.py"]

_TURNS = [
    ("What changed in {repo} since yesterday?",
     "Three commits landed on {branch}: {person} bumped the version, fixed a flaky test in "
     "{file} and updated the changelog. Nothing is waiting for review."),
    ("Are there open issues about timeouts in {repo}?",
     "Yes, issue #{n} reports request timeouts after {m} seconds on {branch}. It is assigned "
     "to {person} and labelled bug."),
    ("Who last touched {file} in {repo}?",
     "{person} edited {file} in commit {sha} on {branch}, changing the retry logic and adding "
     "a log line."),
    ("Is the CI green on {branch} of {repo}?",
     "The last workflow run on {branch} failed at the lint step after {m} minutes; the test "
     "jobs passed. The failure comes from an unused import in {file}."),
    ("Summarize pull request #{n} in {repo} for me.",
     "Pull request #{n} by {person} refactors {file}, adds {m} tests and targets {branch}. "
     "Two reviewers approved it and one asked for a smaller diff."),
    ("Did anyone comment on issue #{n} in {repo}?",
     "{person} commented an hour ago that the bug reproduces on {branch} and attached a "
     "stack trace pointing at {file}, line {m}."),
    ("How many stars does {repo} have?",
     "{repo} has {n} stars and {m} forks; the default branch is {branch} and the most "
     "active contributor this month is {person}."),
    ("List the labels used in {repo}.",
     "The labels are bug, enhancement, documentation, good first issue and needs-triage; "
     "{m} open issues carry needs-triage, the oldest is #{n}."),
]

# ---- off-topic: unrelated prose -------------------------------------------------------------
_PLACES = ["a harbour town", "the northern valley", "an old mill", "the river delta",
           "a mountain village", "the coastal marsh", "a walled garden"]
_SEASONS = ["spring", "early summer", "late autumn", "midwinter", "the rainy season"]
_NAMES = ["Marguerite", "Tomas", "Ines", "Ruairi", "Yuki", "Ottilie", "Bram"]

_PARAGRAPHS = [
    "In {season} the bakers of {place} start their sourdough before dawn. {name} feeds the "
    "starter with rye flour, waits {m} hours for it to double, and shapes loaves that rest "
    "overnight in cane baskets before meeting a very hot stone oven.",
    "The lighthouse above {place} was first lit {n} years ago. Its keeper, {name}, climbed "
    "{m} steps every evening to trim the wick and wind the clockwork that turned the lens.",
    "Migrating geese pass over {place} in {season}, flying in long uneven lines. Watchers "
    "like {name} count them from the hills and have logged more than {n} birds in a day.",
    "Tide pools near {place} hold anemones, small crabs and bright sea snails. {name} "
    "visits them at low tide in {season} and notes how the water warms by {m} degrees.",
    "The path from {place} to the high pass climbs through larch forest and then over "
    "bare scree. {name} walked it in {season} and needed {m} hours to reach the cairn.",
    "An old recipe from {place} braises beans with sage, garlic and a splash of wine for "
    "{m} hours. {name} insists that the pot must never boil, only tremble.",
    "Beekeepers around {place} move their hives in {season} to follow the heather bloom. "
    "{name} keeps {m} colonies and harvested {n} jars of dark honey last year.",
    "The town choir of {place} rehearses twice a week in a cold stone church. {name} "
    "conducts, and the {m} singers are preparing a concert for {season}.",
]


def load_tools() -> dict[str, dict[str, Any]]:
    """The GitHub MCP tools by name."""
    tools = json.loads(TOOLS_PATH.read_text())["tools"]
    return {tool["name"]: tool for tool in tools}


def schema_text(tool: dict[str, Any]) -> str:
    """The text a tool block is compiled from: the tool's JSON."""
    return json.dumps(tool)


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def system_ids(tokenizer: Any) -> list[int]:
    return encode(tokenizer, SYSTEM)


def query_ids(tokenizer: Any, request: str) -> list[int]:
    """A user turn with ``request``, then the assistant header."""
    return encode(tokenizer, f"<|im_start|>user\n{request}<|im_end|>\n<|im_start|>assistant\n")


def _slots(i: int) -> dict[str, Any]:
    """Slot values for the i-th turn or paragraph (``n`` and ``sha`` differ for every i)."""
    return {
        "repo": _REPOS[i % len(_REPOS)], "branch": _BRANCHES[i % len(_BRANCHES)],
        "person": _PEOPLE[i % len(_PEOPLE)], "file": _FILES[(3 * i) % len(_FILES)],
        "place": _PLACES[i % len(_PLACES)], "season": _SEASONS[i % len(_SEASONS)],
        "name": _NAMES[(2 * i) % len(_NAMES)], "n": 12 + 37 * i, "m": 3 + (7 * i) % 29,
        "sha": f"{(2654435761 * (i + 1)) % 16**7:07x}",
    }


def _on_topic_pieces() -> Iterator[str]:
    for i in itertools.count():
        user, assistant = _TURNS[i % len(_TURNS)]
        slots = _slots(i)
        yield (f"<|im_start|>user\n{user.format(**slots)}<|im_end|>\n"
               f"<|im_start|>assistant\n{assistant.format(**slots)}<|im_end|>\n")


def _off_topic_pieces() -> Iterator[str]:
    for i in itertools.count():
        yield _PARAGRAPHS[i % len(_PARAGRAPHS)].format(**_slots(i)) + "\n\n"


def context_ids(tokenizer: Any, kind: str, n: int, *, whole_turns: bool = False) -> list[int]:
    """Exactly ``n`` token ids of an on-topic (``"on"``) or off-topic (``"off"``) context, or
    with ``whole_turns`` the longest run of whole pieces (the system prompt, complete turns) of
    at most ``n`` tokens: a context that ends where a chat template puts the next message (or a
    tool definition), never inside an open turn."""
    if kind not in ("on", "off"):
        raise ValueError(f"context kind must be 'on' or 'off', got {kind!r}")
    ids = system_ids(tokenizer) if kind == "on" else []
    if whole_turns and len(ids) > n:
        return []
    pieces = _on_topic_pieces() if kind == "on" else _off_topic_pieces()
    while len(ids) < n:
        piece = encode(tokenizer, next(pieces))
        if whole_turns and len(ids) + len(piece) > n:
            return ids
        ids += piece
    return ids[:n]
