"""Which tool calls the agent loop may run: approval policies over MCP tool annotations.

Contract: an approval is a plain callable ``(call, tool) -> bool`` (:data:`CallApproval`; True:
run it) that the agent loop (:func:`~nexus_mlx.agent.loop.run_agent`, ``approve``) asks on its
own thread, for each call a step makes to a registry tool, before any of that step's calls runs;
a refused call never reaches its server and becomes the result ``error: ... not run ...``, so
the model can go on without it. :class:`ApprovalPolicy` is the ready-made one: a call is run
when its tool or server is in ``allow``, when the tool declares itself read-only (``read_only``),
or declares that it does not destroy (``non_destructive``); any other call is put to ``ask``
(e.g. a person at a terminal) or refused when there is none. :data:`READ_ONLY` runs only
read-only tools. MCP's hints (``ToolAnnotations``) default to the cautious side, and this module
reads them so: a tool without ``readOnlyHint: true`` may write, and one that may write without
``destructiveHint: false`` may destroy. Hints are what the server says of its tools, not a
guarantee: ``allow`` only the servers you trust.

It does not run calls, show tools or know about the loop's steps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from nexus_mlx.decode.call_format import ParsedCall
from nexus_mlx.errors import ArgumentError
from nexus_mlx.tools.tool import Tool

CallApproval = Callable[[ParsedCall, Tool], bool]  # (call, its tool) -> run it?


def reads_only(tool: Tool) -> bool:
    """Whether ``tool`` declares that it does not modify its environment (``readOnlyHint``)."""
    return tool.annotations.get("readOnlyHint") is True


def may_destroy(tool: Tool) -> bool:
    """Whether ``tool`` may make destructive updates: it may write and does not declare
    ``destructiveHint: false`` (MCP's default for a tool that writes is destructive)."""
    return not reads_only(tool) and tool.annotations.get("destructiveHint") is not False


def effect(tool: Tool) -> str:
    """What ``tool``'s annotations say it may do, in words (for refusals and prompts)."""
    if reads_only(tool):
        return "declared read-only"
    return "may make destructive changes" if may_destroy(tool) else "may write (not destructive)"


def _names(value: Iterable[str], option: str) -> frozenset[str]:
    if isinstance(value, str):
        raise ArgumentError(f"{option} must be a collection of tool or server names, not the "
                            f"string {value!r}")
    names = frozenset(value)
    bad = sorted(repr(n) for n in names if not isinstance(n, str) or not n)
    if bad:
        raise ArgumentError(f"{option} holds names that are not non-empty strings: "
                            f"{', '.join(bad)}")
    return names


def check_approval(approve: object, option: str = "approve") -> CallApproval | None:
    """``approve`` when it is None or callable, else an :class:`ArgumentError` naming
    ``option``."""
    if approve is not None and not callable(approve):
        raise ArgumentError(f"{option} must be a callable (call, tool) -> bool or None, got "
                            f"{approve!r}")
    return approve  # type: ignore[return-value]


@dataclass(frozen=True)
class ApprovalPolicy:
    """Run what is allowed or declared safe enough; ask about or refuse the rest (module
    docstring). ``allow``: qualified tool names (``git.git_add``) or server namespaces
    (``time``) always run, whatever their hints."""

    allow: frozenset[str] = field(default_factory=frozenset)
    read_only: bool = True
    non_destructive: bool = False
    ask: CallApproval | None = None  # asked about every other call; None: they are refused

    def __post_init__(self) -> None:
        object.__setattr__(self, "allow", _names(self.allow, "allow"))
        for option in ("read_only", "non_destructive"):
            if not isinstance(getattr(self, option), bool):
                raise ArgumentError(f"{option} must be True or False, got "
                                    f"{getattr(self, option)!r}")
        check_approval(self.ask, "ask")

    def allows(self, tool: Tool) -> bool:
        """Whether ``tool``'s calls run without asking."""
        if tool.qualified_name in self.allow or (tool.server or "") in self.allow:
            return True
        return (self.read_only and reads_only(tool)) or (
            self.non_destructive and not may_destroy(tool))

    def __call__(self, call: ParsedCall, tool: Tool) -> bool:
        if self.allows(tool):
            return True
        return self.ask is not None and self.ask(call, tool) is True


READ_ONLY = ApprovalPolicy()  # runs the tools that declare themselves read-only, refuses the rest
