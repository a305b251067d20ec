"""The sidecar benchmark's timed first-argument decode reproduces the library's own decoding:
for any model, its text is the start of what ``generate_tool_call`` writes (it once skipped the
default restraint on optional members and diverged where the object may end)."""

from __future__ import annotations

import pytest
from sidecar_accuracy import FirstArgument

from nexus_mlx.decode.tool_call import CALL_PREFIX, NAME_GLUE, generate_tool_call, tool_call_prompt
from nexus_mlx.tools.tool import Tool

FIRSTS = {  # a short required first value, then only optional members: the object may end
    "set_flag": {"type": "boolean"},
    "set_level": {"type": "integer", "enum": [1, 2, 3]},
    "set_mode": {"type": "string", "enum": ["fast", "safe"]},
    "set_count": {"type": "integer"},
}


def tool_with_optional_tail(name: str) -> Tool:
    properties = {"first": FIRSTS[name], "note": {"type": "string"},
                  "limit": {"type": "integer"}}
    return Tool(name, f"{name} on the service",
                {"type": "object", "required": ["first"], "properties": properties})


@pytest.mark.parametrize("name", sorted(FIRSTS))
def test_first_argument_decode_is_a_prefix_of_the_call(tiny, default_tokenizer, name):
    tool = tool_with_optional_tail(name)
    prompt = tool_call_prompt(default_tokenizer, f"please {name} now", [tool])
    call = generate_tool_call(tiny, default_tokenizer, None, prompt, [tool], max_argument_tokens=24)
    _, first, _ = FirstArgument(tiny, default_tokenizer, 24)(prompt, tool)
    assert first.strip()
    assert call.text.startswith(CALL_PREFIX + tool.qualified_name + NAME_GLUE + first)
