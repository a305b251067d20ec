"""``nexus-mlx agent``: its arguments checked before anything starts, and the command run end to
end on the default model over real MCP servers over stdio: a read-only call runs, and a call to
a tool that writes runs only when the person at the terminal says yes."""

from __future__ import annotations

import io
import shlex
import sys
import textwrap
from pathlib import Path

import pytest

from nexus_mlx.agent.approval import READ_ONLY, ApprovalPolicy
from nexus_mlx.cli.agent_cmd import approval, ask_at_terminal, server_spec, tool_choice
from nexus_mlx.cli.main import main
from nexus_mlx.decode.call_format import ParsedCall
from nexus_mlx.errors import ArgumentError
from nexus_mlx.tools.registry import ToolRegistry
from nexus_mlx.tools.tool import Tool

# a real MCP server (the mcp SDK's own) with one tool that writes a file: no arguments, so even
# the 135M default model calls it reliably
MARKER_SERVER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from mcp.server.mcpserver import MCPServer
    from mcp.types import ToolAnnotations

    server = MCPServer("marker")

    @server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False))
    def write_marker() -> str:
        \"\"\"Write the marker file.\"\"\"
        Path(sys.argv[1]).write_text("written")
        return "marker written"

    server.run()
    """
)


def test_server_values_are_checked_before_anything_starts():
    spec = server_spec("time=mcp-server-time --local-timezone 'Europe/Paris'")
    assert (spec.namespace, spec.command, spec.args) == (
        "time", "mcp-server-time", ("--local-timezone", "Europe/Paris"))
    for bad, match in [("mcp-server-time", "must be NAME=COMMAND"), ("=x", "must be NAME=COMMAND"),
                       ("time=", "names no command"), ("time=  ", "names no command"),
                       ("a.b=x", "namespace 'a.b' is invalid"),
                       ("t=x 'open", "not a valid command line")]:
        with pytest.raises(ArgumentError, match=match):
            server_spec(bad)


def test_approvals_and_tool_choices_are_what_the_options_say():
    assert approval("read-only") is READ_ONLY and approval("all") is None
    asking = approval("ask")
    assert isinstance(asking, ApprovalPolicy) and asking.ask is ask_at_terminal
    with pytest.raises(ArgumentError, match="--approve 'some'"):
        approval("some")
    registry = ToolRegistry([Tool("now", "the time", {"type": "object", "properties": {}},
                                  server="time")])
    assert tool_choice("required", registry) == "required"
    assert tool_choice("time.now", registry)["function"]["name"] == "time.now"
    with pytest.raises(ArgumentError, match="nor a tool the servers list \\(time.now\\)"):
        tool_choice("time.later", registry)


def test_the_terminal_answer_decides_and_no_answer_is_no():
    call = ParsedCall("m.write_marker", {})
    tool = Tool("write_marker", "w", {"type": "object", "properties": {}}, server="m",
                annotations={"readOnlyHint": False, "destructiveHint": False})
    prompts: list[str] = []

    def answering(text: str):
        def read(prompt: str) -> str:
            prompts.append(prompt)
            return text
        return read

    assert ask_at_terminal(call, tool, answering(" Yes\n"))
    assert not ask_at_terminal(call, tool, answering("n"))
    assert not ask_at_terminal(call, tool, answering(""))
    assert prompts[0] == "  run m.write_marker({})? the tool may write (not destructive) [y/N] "

    def closed(prompt: str) -> str:
        raise EOFError

    assert not ask_at_terminal(call, tool, closed)


@pytest.mark.parametrize("argv, match", [
    (["agent", "  "], "the request is empty"),
    (["agent", "What time is it?"], "at least one --server"),
    (["agent", "q", "--server", "t=a", "--server", "t=b"], "names must differ"),
    (["agent", "q", "--server", "t=a", "--max-steps", "0"], "--max-steps must be a positive"),
    (["agent", "q", "--server", "t=no-such-mcp-server-here"],
     "cannot start MCP server 't' (no-such-mcp-server-here)"),
    (["agent", "q", "--server", "t=" + shlex.quote(sys.executable) + " -m mcp_server_time",
      "--tool-choice", "t.later"], "nor a tool the servers list"),
])
def test_bad_arguments_exit_2_with_one_line(argv, match, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert match in err and len(err.strip().splitlines()) == 1


def _server(name: str, *argv: str) -> str:
    return f"{name}=" + " ".join(shlex.quote(a) for a in (sys.executable, *argv))


def test_a_read_only_call_runs_and_the_answer_is_printed(default_model, capsys):
    status = main(["agent", "What is the current time in UTC?", "--server",
                   _server("time", "-m", "mcp_server_time"), "--tool-choice", "required",
                   "--max-steps", "2", "--max-tokens", "48", "--no-review"])
    out = capsys.readouterr().out
    assert out.startswith("2 tools from time; approval: read-only")
    assert "  step 1: append" in out and "call time." in out
    assert " -> accepted: " in out or " -> refused: " in out  # the server's verdict on its args
    assert "not approved" not in out
    assert status == (0 if "\nanswer: " in out else 1)


@pytest.mark.parametrize("typed, written", [("n\n", False), ("y\n", True), ("", False)])
def test_a_call_that_writes_runs_only_when_the_person_says_yes(default_model, tmp_path, capsys,
                                                              monkeypatch, typed, written):
    script, marker = tmp_path / "marker_server.py", tmp_path / "marker.txt"
    script.write_text(MARKER_SERVER)
    monkeypatch.setattr(sys, "stdin", io.StringIO(typed))
    main(["agent", "Write the marker.", "--server", _server("m", str(script), str(marker)),
          "--tool-choice", "m.write_marker", "--approve", "ask", "--max-steps", "1",
          "--max-tokens", "24", "--no-review"])
    out = capsys.readouterr().out
    assert "run m.write_marker({})? the tool may write (not destructive) [y/N]" in out
    assert marker.exists() == written
    verdict = "accepted: marker written" if written else (
        "not approved: error: m.write_marker was not run: the approval policy refused it")
    assert f"call m.write_marker({{}}) -> {verdict}" in out


def test_read_only_refuses_the_call_that_writes_without_asking(default_model, tmp_path, capsys,
                                                              monkeypatch):
    script, marker = tmp_path / "marker_server.py", tmp_path / "marker.txt"
    script.write_text(MARKER_SERVER)
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))  # never read
    main(["agent", "Write the marker.", "--server", _server("m", str(script), str(marker)),
          "--tool-choice", "m.write_marker", "--max-steps", "1", "--max-tokens", "24"])
    out = capsys.readouterr().out
    assert "[y/N]" not in out and "-> not approved" in out and not marker.exists()


def test_the_marker_server_is_a_real_server(tmp_path):
    """The helper server itself: listed over stdio with its annotations."""
    from nexus_mlx.agent.mcp_server import list_server_tools

    script = tmp_path / "marker_server.py"
    script.write_text(MARKER_SERVER)
    tools = list_server_tools(server_spec(_server("m", str(script), str(tmp_path / "x"))))
    assert tools.names() == ["m.write_marker"]
    assert tools.get("m.write_marker").annotations["readOnlyHint"] is False
    assert not Path(tmp_path / "x").exists()  # listing never calls
