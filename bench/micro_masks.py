"""Per-token logit-mask overhead: the tool-name trie FSM and llguidance JSON masks, real vocabulary.

Setup: the default model's tokenizer (49,152 tokens, rebuilt from its GGUF metadata; no weights
are loaded; ``--model`` names another packaged alias or ``.gguf`` file, e.g. ``qwen2.5-coder-0.5b``
with 151,936 tokens, and ``--tag`` the result's suffix; ``model`` records which), the 117 GitHub MCP tool names and their input schemas. Correctness first: every name
walks to completion in its canonical tokenization, and one seeded random walk per schema gives
JSON that validates. Then, per masked decode step (microseconds; medians with bootstrap CIs):

- ``fsm_cold``: :meth:`NameFSM.allowed_mask` the first time a state is seen (fresh FSM per name);
- ``fsm_warm``: the same states again (cached numpy mask), ``fsm_warm_mx``: cached MLX mask;
- ``llg_fill``: llguidance alone (``fill_next_token_bitmask`` into an int32 bitmask);
- ``json_mask``: :meth:`JsonConstraint.allowed_mask` (fill + unpack to bool + placeholder guard),
  ``json_mask_noguard``: the same without the guard;
- ``apply``: numpy bool mask -> ``mx.array`` -> ``mask_logits`` on ``(1, 49152)`` fp32 logits,
  evaluated.
The JSON steps replay recorded random walks (uniform over allowed tokens, then the closing
policy). JSON: {"vocab", "names", "schemas", "steps": {metric: n}, "us": {metric: [median, lo,
hi]}, "loadavg"}. The machine's load is recorded because other jobs share its two cores.
"""

from __future__ import annotations

from common import ( # first: loads nexus_mlx + fast BLAS
    add_model_argument,
    add_tag_argument,
    arg_parser,
    emit,
    median_ci,
    shared_data,
    tagged_name,
)

import os
import random
import time
from pathlib import Path

import llguidance
import llguidance.numpy
import mlx.core as mx
import numpy as np

from nexus_mlx.tools.registry import load_tools
from nexus_mlx.decode.json_constraint import JsonConstraint, compile_schema, ll_tokenizer
from nexus_mlx.decode.placeholders import check_arguments
from nexus_mlx.decode.name_fsm import NameFSM, mask_logits, vocab_of
from nexus_mlx.decode.tool_call import NAME_GLUE
from nexus_mlx.models.gguf_format import parse_gguf
from nexus_mlx.models.gguf_tokenizer import build_tokenizer
from nexus_mlx.models.packages import resolve_package_spec

NAME = "micro_masks"
GITHUB = shared_data("github-mcp", "tools.json")


def _us(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e6


def _walk(constraint: JsonConstraint, rng: random.Random, free: int) -> list[int]:
    for step in range(400):
        if constraint.is_complete():
            return list(constraint.tokens)
        token = constraint.closing_token() if step >= free else None
        if token is None:
            allowed = np.flatnonzero(constraint.allowed_mask())
            token = int(allowed[rng.randrange(allowed.size)])
        assert constraint.accept_token(token)
    raise AssertionError(f"walk did not complete: {constraint.text[:120]!r}")


def main() -> dict[str, object]:
    parser = arg_parser(__doc__.splitlines()[0])
    add_model_argument(parser)
    add_tag_argument(parser)
    args = parser.parse_args()
    path = resolve_package_spec(args.model) or Path(args.model)
    if path.suffix.lower() != ".gguf":
        raise SystemExit(f"--model must be a packaged alias or a .gguf file, got {args.model!r}")
    tokenizer = build_tokenizer(parse_gguf(path).metadata, path)
    vocab = vocab_of(tokenizer)
    ll_tok = ll_tokenizer(tokenizer)
    tools = list(load_tools(GITHUB))
    names = [t.name for t in tools]
    if args.quick:
        tools = tools[:20]
    repeats = 1 if args.quick else 3

    # -- correctness before timing ---------------------------------------------------------
    name_paths = []
    for name in names:
        ids = tokenizer.encode(name + NAME_GLUE, add_special_tokens=False)
        fsm = NameFSM(names, vocab, terminator=NAME_GLUE)
        assert fsm.accept_tokens(ids) == len(ids) and fsm.matched_name() == name
        name_paths.append(ids)
    rng = random.Random(0)
    walks = []
    for tool in tools:
        compiled = compile_schema(tool.input_schema)
        constraint = JsonConstraint(compiled, vocab, names=[tool.name], ll_tok=ll_tok)
        tokens = _walk(constraint, rng, rng.randrange(40))
        assert check_arguments(constraint.value(), tool.input_schema, [tool.name]) == []
        walks.append((tool, compiled, tokens))

    # -- name FSM --------------------------------------------------------------------------
    us: dict[str, list[float]] = {k: [] for k in (
        "fsm_cold", "fsm_warm", "fsm_warm_mx", "llg_fill", "json_mask", "json_mask_noguard",
        "apply")}
    for _ in range(repeats):
        shared = NameFSM(names, vocab, terminator=NAME_GLUE)
        for ids in name_paths:
            fsm = NameFSM(names, vocab, terminator=NAME_GLUE)
            for token in ids:
                us["fsm_cold"].append(_us(fsm.allowed_mask))
                fsm.accept_token(token)
            shared.reset()
            for token in ids:
                shared.allowed_mask()  # warm the shared cache
                shared.allowed_mask_mx()
                shared.accept_token(token)
            shared.reset()
            for token in ids:
                us["fsm_warm"].append(_us(shared.allowed_mask))
                us["fsm_warm_mx"].append(_us(shared.allowed_mask_mx))
                shared.accept_token(token)

    # -- llguidance / JSON -----------------------------------------------------------------
    bits = llguidance.numpy.allocate_token_bitmask(1, vocab.size)
    logits = mx.random.normal((1, vocab.size))
    mx.eval(logits)
    for _ in range(repeats):
        for tool, compiled, tokens in walks:
            matcher = llguidance.LLMatcher(ll_tok, compiled.grammar, log_level=0)
            for token in tokens:
                us["llg_fill"].append(
                    _us(lambda m=matcher: llguidance.numpy.fill_next_token_bitmask(m, bits)))
                assert matcher.consume_token(token)
            for guard, key in ((True, "json_mask"), (False, "json_mask_noguard")):
                constraint = JsonConstraint(compiled, vocab, guard_placeholders=guard,
                                            names=[tool.name], ll_tok=ll_tok)
                for token in tokens:
                    us[key].append(_us(constraint.allowed_mask))
                    if guard:
                        mask = constraint.allowed_mask()
                        us["apply"].append(
                            _us(lambda m=mask: mx.eval(mask_logits(logits, mx.array(m)))))
                    assert constraint.accept_token(token)

    summary = {k: [round(x, 2) for x in median_ci(v)] for k, v in us.items()}
    name = tagged_name(NAME, args.tag)
    payload: dict[str, object] = {
        "model": f"{args.model} ({path.name}, tokenizer only)",
        "vocab": vocab.size, "names": len(names), "schemas": len(walks),
        "steps": {k: len(v) for k, v in us.items()}, "us": summary,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }
    try:
        import plots

        fig, ax = plots.figure()
        keys = list(summary)
        med = [summary[k][0] for k in keys]
        ax.barh(keys, med, xerr=plots.error_bars(med, [summary[k][1:] for k in keys]))
        ax.set_xscale("log")
        ax.set_xlabel("microseconds per masked token (median, 95% CI)")
        ax.set_title(f"mask overhead, vocab {vocab.size}")
        plots.save(fig, name, args.quick)
    except ImportError as exc:  # matplotlib or bench/plots.py missing: JSON only
        payload["png"] = f"skipped: {exc}"
    return emit(name, payload, args.quick)


if __name__ == "__main__":
    main()
