"""Depth-adaptive curves calibrated per model, and the fit that turns measurements into one.

The paper's constants (M = 256, R_base = 5, K = 4) are tuple-specific: a model whose spliced
rows drift more needs more recompute at the same depth. This module keeps one curve per model.

Contract:

- ``curve_for(model)``: the curve stored for ``model``'s weights digest
  (:func:`~nexus_mlx.models.fingerprint.model_fingerprint`) in the user's table
  (``<cache dir>/curves.json``, :func:`~nexus_mlx.models.packages.cache_dir`), else in the
  packaged table (``curves.json`` beside this module), else the paper's ``Curve()``. The user's
  entry wins, so a local calibration overrides a shipped one.
- ``fit_curve(needs)``: ``needs`` maps a depth ``n_past`` to the recompute percent measured as
  enough there; the result is the curve of :data:`CURVE_GRID` whose ``percent(n)`` covers every
  need with the least recompute summed over those depths (ties: the smaller ``R_base``, then
  the larger ``M``, then the larger ``K``). Every need can be covered (``R_base = 100``).
- ``store_curve(model, curve, source=...)``: records ``curve`` for ``model`` in the user's table
  (written to a temporary file and renamed: a reader never sees half a table).
- ``read_table(path)``: a table file as ``{digest: entry}``; a missing file is empty, a
  malformed one raises :class:`~nexus_mlx.errors.FormatError` naming the file.

It knows nothing about splicing or caches; the measurement is ``bench/curve_calibration.py``'s.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mlx.nn as nn

from nexus_mlx._platform.atomic_file import write_json
from nexus_mlx.blocks.curve import Curve
from nexus_mlx.errors import ArgumentError, FormatError
from nexus_mlx.models.fingerprint import model_fingerprint
from nexus_mlx.models.packages import cache_dir

PACKAGED_TABLE = Path(__file__).resolve().with_name("curves.json")
TABLE_NAME = "curves.json"
CURVE_GRID: tuple[Curve, ...] = tuple(
    Curve(M=m, R_base=r, K=k)
    for m, r, k in itertools.product((64, 128, 256, 512, 1024, 2048),
                                     (0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 50.0, 75.0, 100.0),
                                     (1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0, 32.0))
)


def user_table() -> Path:
    """The user's table: ``<cache dir>/curves.json``."""
    return cache_dir() / TABLE_NAME


def read_table(path: Path) -> dict[str, dict[str, Any]]:
    """``{weights digest: {"M", "R_base", "K", ...}}`` from ``path`` (empty when absent)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise FormatError(f"curve table {path} is unreadable: {exc}") from exc
    try:
        table = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FormatError(f"curve table {path} is not JSON: {exc}") from exc
    if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
        raise FormatError(f"curve table {path} must map weight digests to objects")
    return table


def _entry_curve(entry: Mapping[str, Any], path: Path) -> Curve:
    try:
        return Curve(M=int(entry["M"]), R_base=float(entry["R_base"]), K=float(entry["K"]))
    except (KeyError, TypeError, ValueError, ArgumentError) as exc:
        raise FormatError(f"curve table {path} has a bad entry {dict(entry)!r}: {exc}") from exc


@functools.lru_cache(maxsize=8)
def _curves(path: Path, mtime_ns: int, size: int) -> dict[str, Curve]:
    """The curves of one table file as it is at ``(mtime_ns, size)`` (read and parsed once)."""
    return {digest: _entry_curve(entry, path) for digest, entry in read_table(path).items()}


def _table_curves(path: Path) -> dict[str, Curve]:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise FormatError(f"curve table {path} is unreadable: {exc}") from exc
    return _curves(path, stat.st_mtime_ns, stat.st_size)


def curve_for(model: nn.Module) -> Curve:
    """The calibrated curve of ``model`` (see the module docstring), else ``Curve()``. A table
    is re-read only when its file changes (a splice with ``curve="model"`` stats two files)."""
    digest = model_fingerprint(model).weights_digest
    for path in (user_table(), PACKAGED_TABLE):
        curve = _table_curves(path).get(digest)
        if curve is not None:
            return curve
    return Curve()


def fit_curve(needs: Mapping[int, float]) -> Curve:
    """The least-recompute grid curve covering every ``{n_past: percent}`` need."""
    if not needs:
        raise ArgumentError("fit_curve needs at least one measured depth")
    for n, need in needs.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 0 or not 0 <= need <= 100:
            raise ArgumentError(f"a need is a depth >= 0 and a percent in [0, 100], got {n}: {need}")

    def cost(curve: Curve) -> tuple[float, float, int, float]:
        return (sum(curve.percent(n) for n in needs), curve.R_base, -curve.M, -curve.K)

    covering = [c for c in CURVE_GRID if all(c.percent(n) >= need for n, need in needs.items())]
    return min(covering, key=cost)


def store_curve(model: nn.Module, curve: Curve, *, source: str = "",
                path: Path | None = None) -> Path:
    """Record ``curve`` for ``model`` in the user's table (or ``path``); returns the file."""
    target = user_table() if path is None else Path(path)
    table = read_table(target)
    table[model_fingerprint(model).weights_digest] = {
        "M": curve.M, "R_base": curve.R_base, "K": curve.K, "source": source}
    target.parent.mkdir(parents=True, exist_ok=True)
    return write_json(target, table, indent=1, sort_keys=True)
