"""Schema-constrained JSON masks (llguidance + placeholder guard) for three GitHub MCP tools: one
walk = a mask and an accepted token at every step of each tool's canonical arguments.

Reference, before timing: every canonical token is in its step's mask and accepted, a token
outside the mask is refused with the state left unchanged, and each finished text parses to the
intended arguments (keys in the grammar's order: required first) and validates against the
tool's original schema (``jsonschema``).
"""

import json

import numpy as np
import pytest

from nexus_mlx.decode.json_constraint import JsonConstraint, compile_schema, prepare_schema
from nexus_mlx.decode.placeholders import check_arguments

CALLS = {
    "create_issue": {"owner": "octocat", "repo": "hello-world", "title": "Fix the login redirect"},
    "create_branch": {"owner": "octocat", "repo": "hello-world", "branch": "fix/login"},
    "create_repository": {"name": "demo-service", "private": False},
}


@pytest.fixture(scope="module")
def walks(tokenizer, github_tools):
    out = []
    for name, args in CALLS.items():
        tool = github_tools.get(name)
        compiled = compile_schema(tool.input_schema)
        assert compiled.mode == "strict", compiled.notes
        constraint = JsonConstraint(compiled, tokenizer, names=[name])
        order = list(prepare_schema(tool.input_schema)["properties"])  # required first
        text = json.dumps({key: args[key] for key in order if key in args})
        ids = list(tokenizer.encode(text, add_special_tokens=False))
        out.append((tool, args, constraint, ids))
    return out


def _walk_all(walks) -> int:
    steps = 0
    for _, _, constraint, ids in walks:
        for token in ids:
            constraint.allowed_mask()
            constraint.accept_token(token)
            steps += 1
    return steps


def _reset(walks):
    for _, _, constraint, _ in walks:
        constraint.reset()
    return (walks,), {}


def test_json_mask(benchmark, walks):
    for tool, args, constraint, ids in walks:
        constraint.reset()
        for step, token in enumerate(ids):
            mask = constraint.allowed_mask()
            assert mask[token], (tool.name, constraint.text)
            if step == len(ids) // 2:
                refused = int(np.flatnonzero(~mask)[0])
                before = (constraint.text, list(constraint.tokens))
                assert not constraint.accept_token(refused)
                assert (constraint.text, list(constraint.tokens)) == before
            assert constraint.accept_token(token)
        assert constraint.is_complete() and constraint.value() == args
        assert check_arguments(constraint.value(), tool.input_schema, [tool.name]) == []

    steps = sum(len(ids) for *_, ids in walks)
    benchmark.extra_info.update({"tools": list(CALLS), "steps": steps})
    benchmark.pedantic(_walk_all, setup=lambda: _reset(walks), rounds=10, warmup_rounds=1)
