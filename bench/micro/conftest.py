"""Fixtures for the pytest-benchmark micro-benchmarks (``pytest bench/micro``; not collected by
the default ``pytest`` run, whose ``testpaths`` is ``tests``).

``import nexus_mlx`` comes first so MLX loads with the fast BLAS. Every benchmark checks its
result against a reference before it times anything. Models here are random-weight mlx-lm
models with SmolLM2-135M's K/V geometry (30 layers, 3 KV heads of width 64) and a tiny rest, so
copies move real-sized K/V while forward passes stay cheap; the real tokenizer and tool data are
used where masks depend on them (skipped when absent). The ``--benchmark-json`` file keeps each
benchmark's statistics but not its raw per-round timings (tens of thousands of numbers).
"""

import nexus_mlx  # noqa: F401  (must precede mlx imports)

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import mlx.core as mx  # noqa: E402
import pytest  # noqa: E402

from nexus_mlx.models.build import model_classes

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for its common helpers
from common import shared_data  # noqa: E402

GITHUB = shared_data("github-mcp", "tools.json")
VOCAB = 256

# SmolLM2-135M's cache geometry (layers, KV heads, head width, RoPE base); everything else tiny.
COPY_CONFIG = {
    "model_type": "llama", "hidden_size": 192, "num_hidden_layers": 30, "intermediate_size": 64,
    "num_attention_heads": 3, "num_key_value_heads": 3, "rms_norm_eps": 1e-5,
    "vocab_size": VOCAB, "max_position_embeddings": 8192, "rope_theta": 100000.0,
    "tie_word_embeddings": True,
}


@pytest.fixture(scope="session")
def copy_model():
    """Random float32 llama with SmolLM2-135M's K/V geometry (about 22 MB of weights)."""
    model_cls, args_cls = model_classes(COPY_CONFIG)
    mx.random.seed(0)
    model = model_cls(args_cls.from_dict(COPY_CONFIG))
    mx.eval(model.parameters())
    model.eval()
    return model


@pytest.fixture(scope="session")
def tokenizer():
    """The default model's tokenizer alone (rebuilt from the GGUF metadata, no weights)."""
    from nexus_mlx.models.gguf_format import parse_gguf
    from nexus_mlx.models.gguf_tokenizer import build_tokenizer
    from nexus_mlx.models.packages import resolve_package_spec

    try:
        path = resolve_package_spec("default")
    except Exception as exc:  # the model package is not installed
        pytest.skip(f"default model unavailable: {exc}")
    if path is None:
        pytest.skip("default model unavailable")
    return build_tokenizer(parse_gguf(path).metadata, path)


@pytest.fixture(scope="session")
def github_tools():
    """The 117 GitHub MCP tools (skipped when the shared data is absent)."""
    from nexus_mlx.tools.registry import load_tools

    if not GITHUB.is_file():
        pytest.skip(f"{GITHUB} not present")
    return load_tools(GITHUB)


def pytest_benchmark_update_json(config, benchmarks, output_json):
    """Drop the raw per-round timings from the JSON (the statistics stay): a committed result
    should be kilobytes, not megabytes."""
    for bench in output_json.get("benchmarks", []):
        bench.get("stats", {}).pop("data", None)
