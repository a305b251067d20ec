"""Reference-free drift gating, a negative result (paper 1, Table II): does the per-head key
variance of the preceding context predict how far a spliced block drifts, per head?

Contract: ``python bench/gating_nogo.py [--quick] [--model M] [--tag T]`` (``M``: any ``nexus_mlx.load`` spec, default SmolLM2; the result records the model run and goes
to ``results/gating_nogo[_<tag>].json``). For each context kind (``on``: system prompt
+ GitHub conversation; ``off``: unrelated prose) and depth n_past in {256, 1024, 2048}:
- proxy, per (layer, KV head): the variance over the context's tokens of its cached (rotated)
  keys, averaged over the head dimension. It needs no reference, which is why a gate on it
  would be attractive;
- truth, per (layer, KV head): blocks compiled from GitHub MCP schemas at anchor 0 with no
  context are bare-spliced (``curve=None``) after the context; their key rows are compared with
  the key rows of a text prefill of the same schema tokens after the same context: the mean over
  block tokens of ||k_splice - k_prefill|| / ||k_prefill||, averaged over the tools;
- Spearman's rho between proxy and truth across heads (average ranks for ties, then Pearson),
  with a bootstrap 95% CI over heads, and as a baseline the rho of truth against layer depth.
Layer 0 is left out: its keys depend only on the token and its position, so its drift is zero
by construction (re-anchoring rounding only) whatever the context.

JSON ``{"rows": [{"n_past", "context", "spearman", "spearman_ci", "depth_spearman"}],
"mean_spearman", ...}``; PNG: drift against the proxy, one panel per context kind.
``--quick``: n_past 256 only, one tool. Nothing here is timed.
"""

from __future__ import annotations

from common import (  # first: loads nexus_mlx + fast BLAS
    add_model_argument,
    add_tag_argument,
    arg_parser,
    emit,
    model_record,
    paper_reference,
    tagged_name,
)

from typing import Any

import mlx.core as mx
import numpy as np
import plots
from splice_workload import context_ids, load_tools, schema_text

from nexus_mlx import NexusCache, forward, load, make_cache
from nexus_mlx.blocks.compile import compile_block
from nexus_mlx.blocks.splicing import splice

NAME = "gating_nogo"
DEPTHS = [256, 1024, 2048]
QUICK_DEPTHS = [256]
CONTEXTS = {"on": "system prompt + GitHub conversation", "off": "unrelated prose"}
TOOLS = ["add_sub_issue", "create_issue", "push_files"]
QUICK_TOOLS = TOOLS[:1]
FIRST_LAYER = 1  # layer 0 drifts by construction not at all
PAPER_SPEARMAN = paper_reference()[NAME]["values"]["spearman"]
N_BOOT = 2000


def ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of ``x``, ties sharing their average rank."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="mergesort")
    raw = np.empty(x.size, dtype=np.float64)
    raw[order] = np.arange(1, x.size + 1)
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    out: np.ndarray = (np.bincount(inverse, weights=raw) / counts)[inverse]
    return out


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho: the Pearson correlation of the (tie-averaged) ranks."""
    rx, ry = ranks(x), ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denom = np.sqrt((rx * rx).sum() * (ry * ry).sum())
    return float((rx * ry).sum() / denom) if denom > 0 else float("nan")


def spearman_ci(x: np.ndarray, y: np.ndarray, seed: int = 0) -> list[float]:
    """Percentile-bootstrap 95% interval of rho, resampling heads."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(N_BOOT, x.size))
    boots = np.array([spearman(x[i], y[i]) for i in idx])
    lo, hi = np.nanquantile(boots, [0.025, 0.975])
    return [float(lo), float(hi)]


def key_variance(cache: NexusCache) -> np.ndarray:
    """Per (layer, KV head) variance of the cached keys over tokens, mean over dims ``(L, H)``."""
    out = []
    for layer in range(cache.num_layers):
        k = np.array(cache.keys(layer)[0], dtype=np.float64)  # (H, n, D)
        out.append(k.var(axis=1).mean(axis=-1))
    return np.stack(out)


def block_keys(cache: NexusCache, r0: int, r1: int) -> list[np.ndarray]:
    """Key rows ``[r0, r1)`` of every layer, ``(H, S, D)`` float64 each."""
    return [np.array(cache.keys(layer)[0, :, r0:r1], dtype=np.float64)
            for layer in range(cache.num_layers)]


def key_drift(model, base: NexusCache, block) -> np.ndarray:
    """Per (layer, KV head) mean relative L2 distance between bare-spliced and prefilled block
    keys ``(L, H)``."""
    n = base.n_past
    spliced = base.fork()
    result = splice(model, spliced, block, curve=None)
    assert result.path == "bare" and result.rows == (n, n + block.num_tokens)
    prefilled = base.fork()
    mx.eval(forward(model, list(block.tokens), prefilled, logits="last"))
    prefilled.evaluate()
    got = block_keys(spliced, n, n + block.num_tokens)
    ref = block_keys(prefilled, n, n + block.num_tokens)
    per_layer = []
    for ks, kr in zip(got, ref, strict=True):
        rel = np.linalg.norm(ks - kr, axis=-1) / np.linalg.norm(kr, axis=-1)  # (H, S)
        per_layer.append(rel.mean(axis=-1))  # (H,)
    return np.stack(per_layer)


def measure(model, tokenizer, blocks, kind: str, n_past: int) -> dict[str, Any]:
    base = make_cache(model)
    mx.eval(forward(model, context_ids(tokenizer, kind, n_past), base, logits="last"))
    base.evaluate()
    proxy = key_variance(base)
    drift = np.mean([key_drift(model, base, b) for b in blocks.values()], axis=0)
    layer0_drift = float(drift[0].max())
    proxy, drift = proxy[FIRST_LAYER:], drift[FIRST_LAYER:]  # (L-1, H)
    depth = np.broadcast_to(np.arange(FIRST_LAYER, FIRST_LAYER + proxy.shape[0])[:, None],
                            proxy.shape)
    x, y = proxy.reshape(-1), drift.reshape(-1)
    return {
        "n_past": n_past, "context": kind, "spearman": spearman(x, y),
        "spearman_ci": spearman_ci(x, y), "depth_spearman": spearman(depth.reshape(-1), y),
        "heads": int(x.size), "layer0_max_drift": layer0_drift,
        "drift_median": float(np.median(y)), "drift_max": float(y.max()),
        "proxy": x.tolist(), "drift": y.tolist(),
    }


def draw(rows: list[dict[str, Any]], name: str, quick: bool) -> None:
    kinds = [k for k in CONTEXTS if any(r["context"] == k for r in rows)]
    fig, axes = plots.figure(len(kinds))
    axes = np.atleast_1d(axes)
    for ax, kind in zip(axes, kinds, strict=True):
        for r in (r for r in rows if r["context"] == kind):
            ax.scatter(r["proxy"], r["drift"], s=12, alpha=0.7,
                       label=f"n_past {r['n_past']}: rho {r['spearman']:.2f}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("context key variance per head (proxy)")
        ax.set_ylabel("spliced-key drift per head (mean rel. L2)")
        ax.set_title(f"{kind}-topic context ({CONTEXTS[kind]})")
        ax.legend(fontsize=8)
    plots.save(fig, name, quick)


def main() -> dict[str, object]:
    parser = arg_parser(__doc__.splitlines()[0])
    add_model_argument(parser)
    add_tag_argument(parser)
    args = parser.parse_args()
    depths = QUICK_DEPTHS if args.quick else DEPTHS
    names = QUICK_TOOLS if args.quick else TOOLS
    model, tokenizer = load(args.model)
    tools = load_tools()
    blocks = {n: compile_block(model, tokenizer, schema_text(tools[n]), anchor=0) for n in names}
    rows: list[dict[str, Any]] = []
    for kind in CONTEXTS:
        for n_past in depths:
            rows.append(measure(model, tokenizer, blocks, kind, n_past))
            r = rows[-1]
            print(f"{kind:3s} n_past {n_past:5d}: rho {r['spearman']:+.3f} "
                  f"[{r['spearman_ci'][0]:+.3f}, {r['spearman_ci'][1]:+.3f}] "
                  f"depth rho {r['depth_spearman']:+.3f}", flush=True)
    name = tagged_name(NAME, args.tag)
    draw(rows, name, args.quick)
    return emit(name, {
        **model_record(args.model, model),
        "tools": {n: b.num_tokens for n, b in blocks.items()},
        "layers": f"{FIRST_LAYER}..{len(model.layers) - 1}",
        "proxy": "variance over context tokens of cached keys, mean over head dim",
        "truth": "mean over block tokens of ||k_bare_splice - k_prefill|| / ||k_prefill||",
        "paper_spearman": PAPER_SPEARMAN,
        "mean_spearman": float(np.mean([r["spearman"] for r in rows])),
        "rows": rows,
    }, args.quick)


if __name__ == "__main__":
    main()
