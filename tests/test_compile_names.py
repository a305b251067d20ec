"""``compile_directory``: block file names that differ when case is ignored, and texts that do
not fit the model's positions are refused up front, naming the tool and the limit."""

from __future__ import annotations

import json

import pytest
from tiny_models import tiny_model

from nexus_mlx.blocks.atb import read_header
from nexus_mlx.blocks.compile import block_file_name, block_path, compile_block, compile_directory
from nexus_mlx.errors import PositionError
from nexus_mlx.models.arch import model_plan


class IdTokenizer:
    """Whitespace-separated token ids in, ids out."""

    def encode(self, text, add_special_tokens=False):
        return [int(t) for t in text.split()]


class CharTokenizer:
    """One token per character (ids below the tiny vocabulary)."""

    def encode(self, text, add_special_tokens=False):
        return [ord(c) % 100 for c in text]


def test_names_that_differ_only_in_case_get_distinct_files(tmp_path):
    model, tok = tiny_model("llama"), IdTokenizer()
    items = {"t1": "1 2 3", "T1": "4 5 6", "list/repos": "7 8", "list_repos": "9 10"}
    first = compile_directory(model, tok, items, tmp_path)
    assert set(first.written) == set(items)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 4 and len({f.casefold() for f in files}) == 4
    assert "t1.atb" in files and "list_repos.atb" in files  # lower-case safe names are kept
    for name, text in items.items():  # each file holds its own item
        assert list(read_header(block_path(tmp_path, name)).tokens) == tok.encode(text)
    second = compile_directory(model, tok, items, tmp_path)
    assert second.up_to_date == tuple(items) and not second.written
    third = compile_directory(model, tok, {**items, "T1": "4 5 7"}, tmp_path)
    assert third.written == ("T1",) and set(third.up_to_date) == set(items) - {"T1"}


@pytest.mark.parametrize("names", [
    ["t1", "T1"], ["Get_Issue", "get_issue", "GET_ISSUE"], ["a b", "a_b", "a/b", "A b"],
    ["x", "x.atb", "X.atb"], ["tool+0", "tool"], ["é", "è", "_"], ["a" * 150, "a" * 151],
])
def test_file_names_are_unique_ignoring_case(names):
    files = [block_file_name(n) for n in names]
    assert len({f.casefold() for f in files}) == len(names), files
    assert all(f.endswith(".atb") and "/" not in f and len(f) < 140 for f in files)
    assert files == [block_file_name(n) for n in names]  # deterministic


def test_kept_and_hashed_names_follow_the_documented_form():
    assert block_file_name("list_issues") == "list_issues.atb"
    assert block_file_name("repo.get-file_2") == "repo.get-file_2.atb"
    hashed = block_file_name("createIssue")
    stem, digest = hashed.removesuffix(".atb").split("+")
    assert stem == "createIssue" and len(digest) == 10 and digest == digest.lower()


def test_a_huge_enum_is_refused_naming_the_tool_and_the_limit(tmp_path):
    model = tiny_model("llama")
    limit = model_plan(model).max_position
    schema = {"type": "object", "properties": {"color": {"enum": [f"c{i}" for i in range(10_000)]}}}
    text = json.dumps({"name": "paint", "inputSchema": schema})
    items = {"small": "ab", "paint": text}
    with pytest.raises(PositionError) as info:
        compile_directory(model, CharTokenizer(), items, tmp_path / "blocks")
    message = str(info.value)
    assert "'paint'" in message and f"{len(text)} tokens" in message
    assert f"limit of {limit} positions" in message and "max_position_embeddings" in message
    assert not (tmp_path / "blocks").exists()  # checked before anything was compiled
    with pytest.raises(PositionError, match=r"block 'paint'.*limit of"):
        compile_block(model, CharTokenizer(), text, name="paint")
    with pytest.raises(PositionError, match=r"the text to compile .* past the model's limit"):
        compile_block(model, CharTokenizer(), "ab", anchor=limit - 1)
