"""The ``nexus-mlx`` command line.

Contract: ``main(argv)`` parses a subcommand and runs it, returning the process exit status.
Errors raised on purpose (:class:`NexusError`) print as one readable line (``--debug`` shows the
traceback) and exit with status 2. Subcommands:

- ``chat``: one chat turn on a model spec, printing the answer, TTFT and tokens/s.
- ``demo``: the main job on the embedded default model (what ``make demo`` runs).
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence

from nexus_mlx.decode.generate import GenerationStats, chat
from nexus_mlx.errors import NexusError
from nexus_mlx.models.load import load


def _print_generation(answer: str, stats: GenerationStats) -> None:
    print(answer.strip())
    print(
        f"[{stats.prompt_tokens} prompt tokens, TTFT {stats.ttft_s * 1000:.0f} ms "
        f"({stats.prefill_tokens_per_s:.0f} tok/s prefill), "
        f"{stats.generated_tokens} tokens at {stats.decode_tokens_per_s:.1f} tok/s]"
    )


def cmd_chat(args: argparse.Namespace) -> int:
    model, tokenizer = load(args.model)
    result = chat(model, tokenizer, args.prompt, max_tokens=args.max_tokens)
    _print_generation(result.text, result.stats)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from nexus_mlx.demo import run_demo

    return run_demo(args.model)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nexus-mlx",
        description="KV-cache surgery and tool routing for agentic LLMs on MLX.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--model", default="default",
                       help="model spec: 'default', 'gemma3-270m', a .gguf file or an mlx-lm directory")
        p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate at most")
        return p

    chat = add("chat", "one chat turn on a model, with TTFT and tokens/s")
    chat.add_argument("prompt", help="the user message")
    chat.set_defaults(func=cmd_chat)
    demo = add("demo", "the main job on the embedded default model (make demo)")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except NexusError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"nexus-mlx: error: {exc}", file=sys.stderr)
        print("hint: run with --debug for the traceback", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
