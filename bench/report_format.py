"""Markdown formatting for the benchmark report: numbers, CIs, tables, tolerant JSON access.

Contract: every helper tolerates missing or mistyped values (rendered as :data:`NA`), and output
is deterministic (fixed float formats, sorted keys). It knows nothing about benchmarks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

NA = "n/a"


def number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def fmt(value: Any, spec: str = ".3f") -> str:
    """One table cell: ``n/a`` for missing values, yes/no for booleans, ints as ints."""
    if value is None or isinstance(value, dict | list | tuple):
        return NA
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        return format(value, spec)
    return cell(str(value))


def fmt_ci(value: Any, spec: str = ".3f") -> str:
    """``[lo, hi]`` from a two-number list, else ``n/a``."""
    if isinstance(value, list | tuple) and len(value) == 2:
        lo, hi = (number(v) for v in value)
        if lo is not None and hi is not None:
            return f"[{fmt(lo, spec)}, {fmt(hi, spec)}]"
    return NA


def fmt_pct(value: Any) -> str:
    """A share as a percentage: fractions (<= 1) are scaled, larger values taken as percent."""
    x = number(value)
    if x is None:
        return NA
    return f"{x * 100 if abs(x) <= 1 else x:.1f}%"


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def get(obj: Any, *path: Any) -> Any:
    """``obj[path[0]][path[1]]...`` or None when any step is missing or of the wrong type."""
    for key in path:
        if isinstance(obj, dict):
            obj = obj.get(key)
        elif isinstance(obj, list) and isinstance(key, int) and -len(obj) <= key < len(obj):
            obj = obj[key]
        else:
            return None
    return obj


def mapping(obj: dict[str, Any], key: str) -> dict[str, Any]:
    """``obj[key]`` when it is a JSON object, else an empty dict."""
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


def records(value: Any) -> list[dict[str, Any]]:
    """The dict items of a list (anything else dropped)."""
    return [r for r in value if isinstance(r, dict)] if isinstance(value, list) else []


def as_float(value: Any) -> float | None:
    """A number, or a string holding one (JSON object keys such as budgets), else None."""
    x = number(value)
    if x is None and isinstance(value, str):
        try:
            x = float(value)
        except ValueError:
            return None
    return x


def order_key(value: Any) -> tuple[int, float, str]:
    x = as_float(value)
    if x is not None:
        return (0, x, str(value))
    return (1, 0.0, value) if isinstance(value, str) else (2, 0.0, "")


def sort_by(rows: Iterable[dict[str, Any]], *keys: str) -> list[dict[str, Any]]:
    """Rows sorted by ``keys`` (numbers first, numerically; then strings; missing last)."""
    return sorted(rows, key=lambda r: tuple(order_key(r.get(k)) for k in keys))


def sorted_keys(mapping: Any) -> list[str]:
    return sorted(mapping, key=order_key) if isinstance(mapping, dict) else []


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A markdown table (empty rows -> a one-line note)."""
    if not rows:
        return ["_(no rows)_", ""]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines + [""]


def scalar_rows(data: dict[str, Any], skip: Iterable[str] = ()) -> list[list[str]]:
    """``[key, value]`` for every top-level scalar field, sorted by key."""
    skipped = {"name", "quick", "machine", *skip}
    return [[cell(k), fmt(v, ".4g")] for k, v in sorted(data.items())
            if k not in skipped and not isinstance(v, dict | list)]
