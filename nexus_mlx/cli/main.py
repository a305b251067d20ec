"""The ``nexus-mlx`` command line.

Contract: ``main(argv)`` parses a subcommand and runs it (implementations in
:mod:`nexus_mlx.cli.commands`), returning the process exit status. Every subcommand checks its
arguments (:mod:`nexus_mlx.cli.checks`) before it loads a model. A user error — a
:class:`NexusError` raised on purpose, or an ``OSError`` on a path the user gave — prints as one
line naming the value and the fix and exits with status 2; any other exception prints one
"internal error" line and exits with status 1. Tracebacks appear only with ``--debug``, which is
accepted before or after the subcommand. ``--model SPEC`` (``default``, ``gemma3-270m``, a
``.gguf`` file or an mlx-lm directory) is accepted by every subcommand that runs a model.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Sequence

from nexus_mlx.agent.session import DEFAULT_GUARD
from nexus_mlx.cli import commands
from nexus_mlx.cli.agent_cmd import APPROVALS, cmd_agent
from nexus_mlx.decode.lookahead import DEFAULT_DRAFT_TOKENS
from nexus_mlx.errors import NexusError
from nexus_mlx.server.engine import DEFAULT_IDLE_RELEASE_S, DEFAULT_TRIM_HEAP_S
from nexus_mlx.server.response_store import DEFAULT_MAX_RESPONSES

DEBUG_HELP = "show the traceback of an error (accepted before or after the subcommand)"
MODEL_HELP = ("model spec: 'default', 'qwen2.5-coder-0.5b', 'gemma3-270m', a .gguf file or an "
              "mlx-lm directory")
TOOLS_HELP = "a registry file (JSON list / {'tools': [...]}, Seal-Tools .jsonl) or an MCP server command"


def _add(
    sub: argparse._SubParsersAction,  # type: ignore[type-arg]
    name: str,
    help_text: str,
    func: Callable[[argparse.Namespace], int],
    *,
    model: bool = True,
) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=help_text)
    # SUPPRESS: an absent sub-level --debug leaves the top-level value alone
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    if model:
        p.add_argument("--model", default="default", help=MODEL_HELP)
    p.set_defaults(func=func)
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nexus-mlx",
        description="KV-cache surgery and tool routing for agentic LLMs on MLX.",
    )
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = _add(sub, "chat", "one chat turn on a model, with TTFT and tokens/s", commands.cmd_chat)
    p.add_argument("prompt", help="the user message")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate at most")
    p.add_argument("--draft-tokens", type=int, default=0, metavar="N",
                   help="where the answer copies the prompt, draft N tokens ahead and verify "
                   "them in one pass (the same answer; 0, the default, decodes one per pass)")

    p = _add(sub, "demo", "the main job (make demo runs it with --model qwen2.5-coder-0.5b)",
             commands.cmd_demo)
    p.add_argument("--extra-tools", action="append", default=[], metavar="FILE",
                   help="a registry file whose tools are routed alongside the live ones (repeatable)")

    p = _add(sub, "agent", "answer a request with the agent loop over live MCP servers, calling "
             "their tools on one live session", cmd_agent)
    p.add_argument("request", help="the user's request")
    p.add_argument("--server", action="append", default=[], metavar="NAME=COMMAND",
                   help="an MCP server to start: its namespace and its command line, e.g. "
                   "'time=mcp-server-time' (repeatable)")
    p.add_argument("--approve", default="read-only", choices=APPROVALS,
                   help="which calls run: only read-only tools' (default); those and the ones "
                   "you answer yes to at the terminal (ask); every call (all)")
    p.add_argument("--tool-choice", default="auto",
                   help="the first step's tool choice: auto, required, none or a tool's name")
    p.add_argument("--max-steps", type=int, default=6, help="model steps at most")
    p.add_argument("--max-tokens", type=int, default=256, help="tokens per step at most")
    p.add_argument("--no-review", action="store_true",
                   help="do not split the request into parts and check each part's call")

    p = _add(sub, "compile", "compile a tool registry to .atb KV blocks", commands.cmd_compile)
    p.add_argument("--tools", required=True, help=TOOLS_HELP)
    p.add_argument("--out", required=True, help="directory for the .atb files")
    p.add_argument("--context", default=None, help="text preceding every block (a system prompt)")
    p.add_argument("--dtype", default=None, choices=["float16", "float32"],
                   help="block dtype (default: the model's compute dtype)")

    p = _add(sub, "route", "route a request: candidates, margin, gate, IR, arguments, timings",
             commands.cmd_route)
    p.add_argument("query", help="the user's request")
    p.add_argument("--tools", required=True, help=TOOLS_HELP)
    p.add_argument("-k", type=int, default=None,
                   help="candidates the SLB returns (default: the router's, 10)")
    p.add_argument("--max-tokens", type=int, default=96, help="argument tokens at most")

    p = _add(sub, "splice-demo", "splice a compiled schema at several depths vs a text prefill",
             commands.cmd_splice_demo)
    p.add_argument("--depths", type=int, nargs="+", default=[0, 256, 512, 1024],
                   help="history lengths n_past to splice after")
    p.add_argument("-K", type=float, default=4.0, help="recompute curve K (4 default, 16 flat)")
    p.add_argument("--repeats", type=int, default=5,
                   help="timed runs per depth and path, after one warm-up; medians are printed")

    p = _add(sub, "repair-demo", "delete a correction from a cached context and repair it",
             commands.cmd_repair_demo)
    p.add_argument("--budget", type=float, default=5.0, help="recompute budget in percent")
    p.add_argument("--allocator", default="sur", help="allocator name (sur, bm25_units, ...)")

    p = _add(sub, "serve", "an OpenAI-compatible HTTP server whose sessions keep their KV cache "
             "across requests (the model is served under its --model spec)", commands.cmd_serve)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8080, help="port to listen on (0: any free one)")
    p.add_argument("--policy", default="repair", choices=["exact", "repair"],
                   help="edits the cache cannot append: re-encode them (exact) or splice and "
                   "repair the reused rows on a budget (repair)")
    p.add_argument("--budget", type=float, default=5.0, metavar="PCT",
                   help="repair budget: percent of a reused block's rows recomputed")
    p.add_argument("--cache-budget", type=int, default=2048, metavar="MIB",
                   help="KV cache the live sessions (and the completions scorer's last "
                   "prompt) may hold in all, in MiB (least recently used dropped first)")
    p.add_argument("--max-sessions", type=int, default=8,
                   help="live sessions (cached conversations) at most")
    p.add_argument("--max-tokens", type=int, default=512,
                   help="reply tokens at most when a request gives no max_tokens")
    p.add_argument("--heal-after-reply", action="store_true",
                   help="(repair) after each reply, recompute the session's stale rows while "
                   "the client runs its tools, so the next request finds an exact cache")
    p.add_argument("--guard", type=float, default=DEFAULT_GUARD, metavar="NATS",
                   help="(repair) heal a session's stale rows before any token whose top two "
                   "logits are within NATS of each other (a close call); 0 turns it off "
                   f"(default {DEFAULT_GUARD})")
    p.add_argument("--draft-tokens", type=int, default=DEFAULT_DRAFT_TOKENS, metavar="N",
                   help="where a reply copies its conversation (a quoted argument, a tool "
                   "result), draft N tokens ahead and verify them in one pass: the same reply "
                   f"sooner; 0 turns it off (default {DEFAULT_DRAFT_TOKENS})")
    p.add_argument("--max-stored-responses", type=int, default=DEFAULT_MAX_RESPONSES,
                   metavar="N", help="Responses API: finished responses kept in memory for "
                   "previous_response_id and GET /v1/responses/{id} (least recently used "
                   f"dropped first); 0 keeps none (default {DEFAULT_MAX_RESPONSES})")
    p.add_argument("--trim-heap", default=str(DEFAULT_TRIM_HEAP_S), metavar="SECONDS",
                   help="after a reply, give the C heap's free pages back to the OS (glibc's "
                   "malloc_trim) if SECONDS have passed since the last time, so a long-running "
                   "server's RSS does not creep; 0: after every reply, off: never (default "
                   f"{DEFAULT_TRIM_HEAP_S:g})")
    p.add_argument("--idle-release", default=str(DEFAULT_IDLE_RELEASE_S), metavar="SECONDS",
                   help="once no request has been in flight for SECONDS, give back MLX's cache "
                   "of freed buffers (and, with --trim-heap, the C heap's free pages); once per "
                   f"idle period; off: never (default {DEFAULT_IDLE_RELEASE_S:g})")
    p.add_argument("--session-dir", default=None, metavar="DIR",
                   help="keep the live sessions across restarts: restore those saved in DIR "
                   "at start (files for another model or template are skipped), save the idle "
                   "ones that changed there when the server goes idle and at stop")
    p.add_argument("--no-interleave", action="store_true",
                   help="decode each reply to its end before the next request's turn; by "
                   "default the replies being decoded take turns token by token, so a short "
                   "request is not kept waiting behind a long reply")

    p = _add(sub, "convert", "write a model as an mlx-lm directory (safetensors, config.json, "
             "tokenizer files) that mlx_lm.load and mlx_lm.server load as the same model",
             commands.cmd_convert, model=False)
    p.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    p.add_argument("--out", required=True, metavar="DIR",
                   help="the directory to write (new, empty, or a model directory with --force)")
    p.add_argument("--dtype", default="auto", choices=list(commands.CONVERT_DTYPES),
                   help="auto: what nexus-mlx computes with here (float32 on CPU, the file's "
                   "precision on a GPU); keep: the file's precision, quantized layers saved "
                   "quantized (mlx-lm's quantization block); a float type: dequantize and cast")
    p.add_argument("--force", action="store_true",
                   help="replace the model directory already at --out")
    p.add_argument("--max-shard-size", type=int, default=5120, metavar="MIB",
                   help="weights per safetensors file at most, in MiB (larger models are sharded)")

    p = _add(sub, "bench", "run a benchmark script from bench/", commands.cmd_bench, model=False)
    p.add_argument("name", help="benchmark name, e.g. blas, engine, dkl_sweep")
    p.add_argument("--quick", action="store_true", help="the < 1 minute smoke-test setting")

    p = _add(sub, "report", "write results/REPORT.md from results/*.json", commands.cmd_report,
             model=False)
    p.add_argument("--results", default="results",
                   help="the results directory (relative to the current directory)")
    return parser


def _os_error(exc: OSError) -> str:
    where = f" {str(exc.filename)!r}" if exc.filename is not None else ""
    return f"{exc.strerror or type(exc).__name__}{where}; check the path and its permissions"


def _fail(message: str, debug: bool, status: int) -> int:
    if debug:
        traceback.print_exc()
    print(message, file=sys.stderr)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = bool(getattr(args, "debug", False))
    try:
        return int(args.func(args))
    except NexusError as exc:
        return _fail(f"nexus-mlx: error: {' '.join(str(exc).splitlines())}", debug, 2)
    except OSError as exc:
        return _fail(f"nexus-mlx: error: {_os_error(exc)}", debug, 2)
    except KeyboardInterrupt:
        print("nexus-mlx: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug, not a user error: one line unless --debug
        detail = " ".join(str(exc).split())[:300]
        return _fail(f"nexus-mlx: internal error: {type(exc).__name__}: {detail} (rerun with "
                     "--debug for the traceback and report it)", debug, 1)


if __name__ == "__main__":
    sys.exit(main())
