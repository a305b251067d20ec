"""The main job (``make demo`` / ``nexus-mlx demo``): route and call real MCP tools end to end.

Contract: ``run_demo(model_spec)`` starts the real ``mcp-server-time`` and ``mcp-server-git``
(on a small temporary repository it creates), merges their tools into one namespaced registry
(plus any registry files passed as ``extra_tools``, e.g. the 117 GitHub MCP definitions: routed,
never executed), embeds them into the INT8 SLB, calibrates the margin gate, compiles the live tools
to ``.atb`` blocks and splices one into a conversation cache (reporting fidelity and time
against a text prefill), then answers a few requests: route -> compressed IR -> constrained
arguments -> execution of read-only calls on their server, and finally holds a multi-turn
conversation in one live session (:mod:`.demo_session`: calls in the model's own format, the tool
list changing, a stale result pruned, each step's reuse / splice / repair printed). Every decision
is printed with its timings, and the routed part ends with each server's record: which calls it accepted, which it refused
and the server's own error text, and which calls were never sent (and why). Servers are always
shut down. Returns 0 (a refused call is an outcome the demo reports, not a failure of the demo).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx

import nexus_mlx
from nexus_mlx.agent.approval import READ_ONLY
from nexus_mlx.agent.mcp_server import McpServer, installed_server
from nexus_mlx.agent.orchestrator import Agent
from nexus_mlx.blocks.compile import compile_block, compile_directory
from nexus_mlx.blocks.splicing import splice
from nexus_mlx.cli.demo_session import session_showcase
from nexus_mlx.cli.progress import tool_bar
from nexus_mlx.metrics import next_token_kl, top1_agreement
from nexus_mlx.models.forward import forward, make_cache
from nexus_mlx.models.load import load
from nexus_mlx.models.twins import twin_report
from nexus_mlx.routing.embedder import Embedder
from nexus_mlx.routing.router import QUERY_PREFIX, build_router
from nexus_mlx.tools.ir import tool_signature
from nexus_mlx.tools.registry import ToolRegistry, load_tools

SYSTEM = "You are an agent that calls tools to help the user."
REQUESTS = (
    "What time is it in Tokyo right now?",
    "Convert 14:30 from New York time to London time.",
    "Show me the recent commit log of the repository at {repo}.",
    "Which files changed in the working tree of the repository at {repo}?",
)

Say = Callable[[str], None]


@dataclass(frozen=True)
class CallOutcome:
    """What became of one request's call: ``accepted`` / ``refused`` by its server, or
    ``not sent`` (invalid arguments, no live server, not read-only); ``detail`` says why."""

    request: str
    server: str  # the namespace ("" when no live server owns the tool)
    call: str  # name(arguments JSON)
    status: str
    detail: str = ""


def outcome_summary(outcomes: Sequence[CallOutcome], servers: Sequence[str]) -> list[str]:
    """The closing lines: per server, the calls it accepted and refused (with its error text),
    then the calls never sent, then one verdict line."""
    lines = ["", "what the servers did with the calls:"]
    for server in servers:
        mine = [o for o in outcomes if o.server == server and o.status != "not sent"]
        accepted = [o for o in mine if o.status == "accepted"]
        refused = [o for o in mine if o.status == "refused"]
        lines.append(f"  {server}: accepted {len(accepted)}, refused {len(refused)}")
        lines += [f"    accepted {o.call}" for o in accepted]
        lines += [f"    refused  {o.call}: {o.detail}" for o in refused]
    unsent = [o for o in outcomes if o.status == "not sent"]
    if unsent:
        lines.append(f"  not sent: {len(unsent)}")
        lines += [f"    {o.call}: {o.detail}" for o in unsent]
    n_ok = sum(o.status == "accepted" for o in outcomes)
    if outcomes and n_ok == 0:
        lines.append(f"no call succeeded: all {len(outcomes)} were refused by their server or "
                     "not sent (reasons above)")
    else:
        lines.append(f"{n_ok} of {len(outcomes)} calls accepted by their server")
    return lines


@contextmanager
def _demo_repository() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="nexus-demo-") as tmp:
        repo = Path(tmp)
        env = {"GIT_AUTHOR_NAME": "demo", "GIT_AUTHOR_EMAIL": "demo@example.invalid",
               "GIT_COMMITTER_NAME": "demo", "GIT_COMMITTER_EMAIL": "demo@example.invalid"}

        def git(*args: str) -> None:
            subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                           env={**env, "PATH": "/usr/bin:/bin:/usr/local/bin"})

        git("init", "-q")
        (repo / "README.md").write_text("# demo\n")
        git("add", "README.md")
        git("commit", "-q", "-m", "Start the demo repository")
        (repo / "README.md").write_text("# demo\n\nEdited by the nexus-mlx demo.\n")
        yield repo


def _registry(servers: dict[str, McpServer], extra_tools: Sequence[Path], say: Say) -> ToolRegistry:
    registry = ToolRegistry()
    for server in servers.values():
        registry = registry.merge(server.list_tools())  # already namespaced by its spec
    live = len(registry)
    for path in extra_tools:
        registry = registry.merge(load_tools(path), namespace=Path(path).parent.name or "extra")
    say(f"registry: {live} live tools from {sorted(servers)} + {len(registry) - live} definitions "
        f"from {[str(p) for p in extra_tools]} (routed only)")
    return registry


def _timed(say: Say, label: str, fn: Callable[[], Any]) -> Any:
    start = time.perf_counter()
    out = fn()
    say(f"{label} in {time.perf_counter() - start:.2f} s")
    return out


def _splice_showcase(model: Any, tokenizer: Any, registry: ToolRegistry, say: Say) -> None:
    tool = registry.get("time.get_current_time")
    schema = json.dumps({"name": tool.name, "description": tool.description,
                         "inputSchema": tool.input_schema})
    history = tokenizer.encode(SYSTEM + " The user is planning a trip. " * 12)
    query = tokenizer.encode(" User: what time is it in Tokyo?")
    block = compile_block(model, tokenizer, schema)
    ref_cache = make_cache(model)
    start = time.perf_counter()
    ref = forward(model, history + list(block.tokens) + query, ref_cache, logits="last")
    mx.eval(ref)
    prefill_s = time.perf_counter() - start
    cache = make_cache(model)
    mx.eval(forward(model, history, cache, logits="last"))
    start = time.perf_counter()
    result = splice(model, cache, block)
    out = forward(model, query, cache, logits="last")
    mx.eval(out)
    splice_s = time.perf_counter() - start
    kl = next_token_kl(ref[0, -1], out[0, -1])
    say(f"splice: {block.num_tokens}-token schema block at depth {len(history)}: path={result.path}, "
        f"R={result.r_pct:.1f}% ({result.recomputed} tokens re-decoded); history+schema+query "
        f"prefill {prefill_s * 1e3:.0f} ms (incl. history) vs splice+query {splice_s * 1e3:.0f} ms; "
        f"next-token KL {kl:.4f} nats, top-1 {'agrees' if top1_agreement(ref[0, -1], out[0, -1]) else 'differs'}")


def _answer(agent: Agent, request: str, executable: set[str], say: Say) -> CallOutcome:
    turn = agent.turn([{"role": "user", "content": request}])
    route, call = turn.route, turn.call
    say(f"\n> {request}")
    cands = ", ".join(f"{n} {s:.3f}" for n, s in route.candidates[:3])
    gate = "escalated to the LLM reranker" if route.escalated else "auto-routed"
    say(f"  candidates: {cands}; margin {route.margin:.3f} vs tau {route.tau:.3f}: {gate}")
    say(f"  IR: {tool_signature(agent.registry.get(call.name))}")
    state = "valid" if call.valid else f"invalid {list(call.errors)}"
    say(f"  call: {call.name}({json.dumps(call.arguments)}) [{state}]; route "
        f"{turn.timings['route'] * 1e3:.0f} ms, arguments {turn.timings['arguments'] * 1e3:.0f} ms "
        f"({turn.prompt_tokens} sidecar tokens)")
    label = f"{call.name}({json.dumps(call.arguments)})"
    server = call.name.split(".", 1)[0] if call.name in executable else ""
    if call.name not in executable:
        why = "not executed: no live server for it, or not read-only"
        say(f"  {why}")
        return CallOutcome(request, server, label, "not sent", why)
    if not call.valid:
        why = f"not executed: invalid arguments {list(call.errors)}"
        say(f"  {why}")
        return CallOutcome(request, server, label, "not sent", why)
    result = agent.execute(turn)
    text = " ".join(result.text.split())
    say(f"  {'server refused' if result.is_error else 'result'}: {text[:160]}")
    return CallOutcome(request, server, label, "refused" if result.is_error else "accepted",
                       text[:400])


def run_demo(model_spec: str = "default", extra_tools: Sequence[Path] = (), say: Say = print) -> int:
    blas = nexus_mlx.BLAS_STATUS
    kernels = f" ({blas.core} kernels)" if blas.core else ""
    say(f"nexus-mlx {nexus_mlx.__version__} | BLAS: "
        + (f"{blas.library}{kernels}" if blas.loaded else blas.reason))
    model, tokenizer = _timed(say, f"loaded model {model_spec!r}", lambda: load(model_spec))
    twins = twin_report(model)
    if twins is not None:  # decode steps read exact one-byte twins of the weights
        say(f"  weight twins: {twins.reason}, built in {twins.seconds:.1f} s")
    embedder = _timed(say, "loaded embedder all-MiniLM-L6-v2",
                      lambda: Embedder.load(query_prefix=QUERY_PREFIX))
    with ExitStack() as stack:
        repo = stack.enter_context(_demo_repository())
        specs = {
            "time": installed_server("mcp-server-time", "mcp_server_time", namespace="time"),
            "git": installed_server("mcp-server-git", "mcp_server_git", "--repository", str(repo),
                                    namespace="git"),
        }
        servers = {ns: stack.enter_context(McpServer(spec)) for ns, spec in specs.items()}
        registry = _registry(servers, extra_tools, say)
        router = _timed(say, f"embedded {len(registry)} tools into the INT8 SLB, calibrated the "
                        "gate", lambda: build_router(registry, model, tokenizer, embedder=embedder,
                                                     progress=tool_bar("embedding tools")))
        if router.embeddings_cached:
            say("  (tool embeddings read from the on-disk cache)")
        cal = router.calibration
        if cal is not None:
            say(f"gate: {cal.describe()}")
        else:
            say("gate: registry too small to calibrate; auto-routing everything")
        live = [t for t in registry if t.server in servers]
        blocks = stack.enter_context(tempfile.TemporaryDirectory(prefix="nexus-atb-"))
        texts = {t.qualified_name: json.dumps({"name": t.name, "inputSchema": t.input_schema})
                 for t in live}
        report = _timed(say, f"compiled {len(texts)} live tools to .atb blocks",
                        lambda: compile_directory(model, tokenizer, texts, blocks, context=SYSTEM,
                                                  progress=tool_bar("compiling", iterable=True)))
        say(f"  ({len(report.written)} written, {len(report.up_to_date)} up to date)")
        _splice_showcase(model, tokenizer, registry, say)
        agent = Agent(model, tokenizer, registry, router, servers, max_argument_tokens=48)
        executable = {t.qualified_name for t in live if READ_ONLY.allows(t)}
        outcomes = [_answer(agent, request.format(repo=repo), executable, say)
                    for request in REQUESTS]
        for line in outcome_summary(outcomes, sorted(servers)):
            say(line)
        accepted = session_showcase(model, tokenizer, registry, servers, repo, say)
        say(f"live session: the servers accepted {accepted} call(s)")
    say("\nservers shut down; done.")
    return 0
