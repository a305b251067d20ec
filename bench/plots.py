"""Matplotlib helpers for the benchmark figures (headless: the Agg backend).

Contract: ``figure(ncols)`` returns a new figure and its axes; ``save(fig, name, quick)`` writes
``results/<name>.png`` (``results/quick/<name>.png`` with ``--quick``), next to the JSON that
``common.emit`` writes, closes the figure and returns the path. ``error_bars`` turns medians and
``[lo, hi]`` intervals into the asymmetric error array matplotlib wants; ``series_styles`` and
``budget_axis`` keep many-series budget plots legible; ``ratio_bars`` draws one paired ratio
and its interval per case, against a line at 1.

matplotlib is imported here only, so scripts import this module after ``common``. It does not
know what a benchmark measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (after selecting the backend)
import numpy as np  # noqa: E402
from common import result_path  # noqa: E402


def figure(ncols: int = 1, width: float = 5.5, height: float = 4.0) -> tuple[Any, Any]:
    """A figure with ``ncols`` side-by-side axes (one axes object when ``ncols == 1``)."""
    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=True)
    return fig, axes


def error_bars(medians: Sequence[float], cis: Sequence[Sequence[float]]) -> np.ndarray:
    """``(2, N)`` distances from each median down to ``lo`` and up to ``hi``."""
    med = np.asarray(medians, dtype=np.float64)
    ci = np.asarray(cis, dtype=np.float64).reshape(-1, 2)
    return np.stack([np.maximum(med - ci[:, 0], 0.0), np.maximum(ci[:, 1] - med, 0.0)])


def series_styles(n: int) -> list[dict[str, Any]]:
    """``n`` distinct line styles (20 colours, then markers cycle) for many-series plots."""
    colours = plt.get_cmap("tab20").colors
    markers = "osD^v<>pXh"
    return [{"color": colours[i % len(colours)], "marker": markers[i // 2 % len(markers)]}
            for i in range(n)]


def budget_axis(ax: Any, budgets: Sequence[float]) -> None:
    """A log x axis labelled at exactly ``budgets`` (no overlapping minor labels)."""
    ax.set_xscale("log")
    ax.set_xticks(list(budgets), [f"{b:g}" for b in budgets])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def save(fig: Any, name: str, quick: bool) -> Path:
    """Write ``fig`` as the PNG beside the benchmark's JSON and close it."""
    path = result_path(name, quick).with_suffix(".png")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def ratio_bars(cases: dict[str, dict[str, Any]], ylabel: str, title: str, name: str,
               quick: bool) -> Path:
    """A bar per case of its ``ratio`` with its ``ratio_ci``, a line at 1; saved as ``name``."""
    fig, ax = figure()
    names = list(cases)
    ratios = [cases[n]["ratio"] for n in names]
    ax.bar(names, ratios, yerr=error_bars(ratios, [cases[n]["ratio_ci"] for n in names]),
           capsize=4)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return save(fig, name, quick)


def median_bars(arms: dict[str, Sequence[float]], ylabel: str, title: str, name: str,
                quick: bool) -> Path:
    """A bar per arm of its ``[median, lo, hi]`` with the CI as error bars; saved as ``name``."""
    fig, ax = figure(width=5.0)
    medians = [values[0] for values in arms.values()]
    ax.bar(list(arms), medians, yerr=error_bars(medians, [v[1:] for v in arms.values()]))
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    return save(fig, name, quick)
