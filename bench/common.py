"""Shared helpers for the benchmark scripts in bench/ (run as ``python bench/<name>.py [--quick]``).

Contract: importing this module makes ``nexus_mlx`` importable (adds the repository root to
``sys.path`` when it is not installed) and imports it, so a script that does ``from common import
...`` before ``import mlx.core`` gets the optimized BLAS. It provides timing (``time_ms``),
bootstrap statistics (``median_ci``, ``ratio_ci``, ``paired_ratio_ci``), machine description
(``machine_info``) and the result protocol: ``emit`` writes ``results/<name>.json``
(``results/quick/`` with ``--quick``) and prints the same object as one JSON line, the script's last
stdout line. ``shared_data(...)`` is the one spelling of the shared data folder (``../shared/data``
beside the repository), and ``paper_reference()`` reads ``bench/paper_reference.json``, the one copy
of the papers' numbers (JSON only: the report reads it without loading a model).
``add_model_argument`` gives a script the ``--model`` flag (any ``nexus_mlx.load`` spec) and
``model_record(spec, model)`` is what its result says about the model it ran (``"model"``: one line
for the report; ``"model_info"``: spec, file, architecture, layers, compute dtype, weights digest).

It does not know what is being benchmarked; ``time_ms`` only calls ``fn``, which must force its own
outputs (``mx.eval``) so lazy MLX work is inside the timed region.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import nexus_mlx  # noqa: E402  (must be imported before mlx: it loads the fast BLAS)
from nexus_mlx._platform.blas import BLAS_STATUS

_ENV_KEYS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_CORETYPE", "NEXUS_MLX_BLAS",
             "OPENBLAS_THREAD_TIMEOUT", "NEXUS_MLX_POSITION_ATTENTION")
PAPER_REFERENCE = Path(__file__).resolve().parent / "paper_reference.json"


def shared_data(*parts: str) -> Path:
    """``../shared/data`` beside the repository (the data sets every benchmark reads), or the
    path ``parts`` name inside it."""
    return ROOT.parent.joinpath("shared", "data", *parts)


def paper_reference() -> dict[str, dict[str, Any]]:
    """``bench/paper_reference.json`` by benchmark name (its ``_about`` note left out): each
    entry's ``source`` (which paper and table), ``summary`` (the report's citation line) and
    ``values`` (the numbers). Read afresh on every call, so callers may keep or change it."""
    data = json.loads(PAPER_REFERENCE.read_text(encoding="utf-8"))
    return {name: entry for name, entry in data.items() if not name.startswith("_")}


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, object]:
    """Describe the machine, versions and BLAS setup a result was measured on."""
    return {
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "mlx": _version("mlx"),
        "mlx_lm": _version("mlx-lm"),
        "numpy": np.__version__,
        "nexus_mlx": nexus_mlx.__version__,
        "blas": dataclasses.asdict(BLAS_STATUS),
        "env": {k: os.environ[k] for k in _ENV_KEYS if k in os.environ},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def time_ms(fn: Callable[[], object], warmup: int = 2, trials: int = 10) -> list[float]:
    """Call ``fn`` ``warmup`` times untimed, then ``trials`` times; return each trial in ms."""
    if warmup < 0 or trials < 1:
        raise ValueError(f"need warmup >= 0 and trials >= 1, got warmup={warmup}, trials={trials}")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(trials):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def _check(values: Sequence[float], name: str) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence, got shape {arr.shape}")
    return arr


def _boot_medians(arr: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    idx = rng.integers(0, arr.size, size=(n_boot, arr.size))
    medians: np.ndarray = np.median(arr[idx], axis=1)
    return medians


def median_ci(
    values: Sequence[float], n_boot: int = 2000, seed: int = 0, alpha: float = 0.05
) -> tuple[float, float, float]:
    """Median of ``values`` and its percentile-bootstrap ``1 - alpha`` interval: (median, lo, hi)."""
    arr = _check(values, "values")
    boots = _boot_medians(arr, n_boot, np.random.default_rng(seed))
    lo, hi = np.quantile(boots, [alpha / 2, 1 - alpha / 2])
    return float(np.median(arr)), float(lo), float(hi)


def ratio_ci(
    a_values: Sequence[float],
    b_values: Sequence[float],
    n_boot: int = 2000,
    seed: int = 0,
    alpha: float = 0.05,
) -> tuple[float, float, float]:
    """median(a) / median(b) and its bootstrap interval (a and b resampled independently)."""
    a = _check(a_values, "a_values")
    b = _check(b_values, "b_values")
    rng = np.random.default_rng(seed)
    boots = _boot_medians(a, n_boot, rng) / _boot_medians(b, n_boot, rng)
    lo, hi = np.quantile(boots, [alpha / 2, 1 - alpha / 2])
    return float(np.median(a) / np.median(b)), float(lo), float(hi)


def paired_ratio_ci(
    a_values: Sequence[float],
    b_values: Sequence[float],
    n_boot: int = 2000,
    seed: int = 0,
    alpha: float = 0.05,
) -> tuple[float, float, float]:
    """The median of the per-round ratios ``a[i] / b[i]`` and its bootstrap interval over rounds.

    For interleaved trials: round ``i`` timed both arms back to back, so their ratio cancels what
    the machine did to both (load from other processes, clock drift), and resampling whole
    rounds keeps each pair together. Prefer it to :func:`ratio_ci` wherever the arms alternate."""
    a = _check(a_values, "a_values")
    b = _check(b_values, "b_values")
    if a.size != b.size:
        raise ValueError(f"paired trials need equal counts, got {a.size} and {b.size}")
    if np.any(b <= 0) or np.any(a < 0):
        raise ValueError("paired ratios need a >= 0 and b > 0")
    return median_ci(a / b, n_boot, seed, alpha)


def switched_trials(switch: Callable[[bool], object], fn: Callable[[], Any], trials: int
                    ) -> tuple[list[float], list[float], list[tuple[bool, Any]]]:
    """Milliseconds of ``fn`` with ``switch(True)`` and ``switch(False)`` in force, one of each
    per trial, the order alternating (for :func:`paired_ratio_ci`), and ``(state, fn())`` of
    every run in order; the switch is left on."""
    on: list[float] = []
    off: list[float] = []
    outputs: list[tuple[bool, Any]] = []
    for trial in range(trials):
        for state in ((True, False) if trial % 2 == 0 else (False, True)):
            switch(state)
            start = time.perf_counter()
            outputs.append((state, fn()))
            (on if state else off).append((time.perf_counter() - start) * 1e3)
    switch(True)
    return on, off, outputs


def result_path(name: str, quick: bool) -> Path:
    """Where benchmark ``name`` writes its JSON: results/<name>.json or results/quick/<name>.json."""
    return ROOT / "results" / ("quick" if quick else "") / f"{name}.json"


def emit(name: str, payload: dict[str, object], quick: bool) -> dict[str, object]:
    """Add name, mode and machine info to ``payload``, write it, print it as one JSON line."""
    result: dict[str, object] = {"name": name, "quick": quick, **payload}
    result["machine"] = machine_info()
    path = result_path(name, quick)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result), flush=True)
    return result


def add_model_argument(parser: argparse.ArgumentParser, default: str = "default") -> None:
    """``--model SPEC``: a ``nexus_mlx.load`` spec (alias, ``.gguf`` file or model directory)."""
    parser.add_argument("--model", default=default,
                        help="model to run: an alias (default = SmolLM2-135M-Instruct, "
                             "qwen2.5-coder-0.5b, gemma3-270m), a .gguf file or a model directory")


def model_record(spec: str, model: Any) -> dict[str, object]:
    """``{"model": one-line label, "model_info": {...}}`` for a result payload (``**`` it in)."""
    from mlx.utils import tree_flatten

    import mlx.core as mx
    from nexus_mlx.models.fingerprint import model_fingerprint
    from nexus_mlx.models.packages import resolve_package_spec

    path = resolve_package_spec(spec)
    file = (path if path is not None else Path(spec)).name
    fingerprint = model_fingerprint(model)
    dtype = next((str(v.dtype).removeprefix("mlx.core.") for _, v in
                  tree_flatten(model.parameters()) if mx.issubdtype(v.dtype, mx.floating)), None)
    info = {"spec": spec, "file": file, "architecture": fingerprint.architecture,
            "num_layers": fingerprint.num_layers, "dtype": dtype,
            "weights_digest": fingerprint.weights_digest[:16]}
    label = f"{spec} ({file}, {fingerprint.architecture}, {fingerprint.num_layers} layers, {dtype})"
    return {"model": label, "model_info": info}


def add_tag_argument(parser: argparse.ArgumentParser) -> None:
    """``--tag T``: the run writes ``results/<name>_T.json`` (see :func:`tagged_name`)."""
    parser.add_argument("--tag", default="",
                        help="suffix of the result's name: results/<name>_TAG.json")


def tagged_name(name: str, tag: str) -> str:
    """``name`` with ``_tag`` appended when a tag is given."""
    return name + (f"_{tag}" if tag else "")


def arg_parser(description: str) -> argparse.ArgumentParser:
    """Argument parser with the ``--quick`` flag every benchmark accepts."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="small run (< 1 min) for smoke tests")
    return parser
