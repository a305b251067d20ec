"""Seal-Tools dev single-call rows as gold calls for the function-calling benchmark.

Contract: :func:`seal_gold_calls(rows, schemas)` turns decoded Seal-Tools ``dev.jsonl`` rows
into :class:`~tasks.call_scoring.GoldCall` objects, with the reason for every row it skips;
``schemas`` maps a registry tool name to its JSON input schema (the one
``nexus_mlx.tools.registry.load_seal_tools`` builds from ``tool.jsonl``).

- Only rows with exactly one call are used (the ``dev-easy`` ones); the gold name goes through
  ``sanitize_name`` as the registry's names do; a row whose tool the registry lacks is skipped.
- Values: Seal-Tools writes almost every value as a string whatever the parameter's type
  (``"age": "63"`` for an ``int``). A string given for an ``integer`` / ``number`` / ``boolean``
  property that reads as one (``int``/``float`` syntax; ``true``/``false`` in any case) becomes
  that JSON value, ``integer`` only when integral (``"19.0"`` -> 19): the API takes a number and
  the constrained decoder can only write one there. Anything else is kept as written.
- ``acceptable``: each gold parameter's (converted) value, and for every other parameter of the
  tool ``[""]`` (may be omitted) plus its schema ``default`` when it declares one: an argument
  the query does not ask for is right only when left out or set to what leaving it out means.
- ``id``: the row's id (``dev-easy-17``).

``python bench/tasks/seal_queries.py [--dev PATH] [--tools PATH] [--out PATH]`` writes them as
JSON lines (default: ``seal_dev_calls.jsonl`` in the benchmark cache folder, outside the
repository: the rows derive from the shared data and are not committed). The benchmark itself
converts ``dev.jsonl`` at run time, so the file is only a convenience for reading the gold.

It does not score calls or check schemas (``call_scoring.schema_problems`` does).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script: make ``tasks`` (in bench/) importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nexus_mlx.tools.tool import sanitize_name  # noqa: E402
from tasks.call_scoring import OMIT, GoldCall  # noqa: E402

_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def converted(value: Any, schema: Mapping[str, Any]) -> Any:
    """``value`` as the JSON type ``schema`` declares, when it is a string that reads as one."""
    kind = schema.get("type")
    if not isinstance(value, str):
        return value
    text = value.strip()
    if kind in ("integer", "number") and _FLOAT.fullmatch(text):
        number = float(text)
        if _INT.fullmatch(text):
            return int(text)
        if kind == "integer":
            return int(number) if number.is_integer() else value
        return number
    if kind == "boolean" and text.lower() in ("true", "false"):
        return text.lower() == "true"
    return value


def seal_gold_calls(rows: Iterable[Mapping[str, Any]], schemas: Mapping[str, Mapping[str, Any]]
                    ) -> tuple[list[GoldCall], dict[str, str]]:
    """(gold calls in row order, {row id: why it was skipped})."""
    calls: list[GoldCall] = []
    skipped: dict[str, str] = {}
    for number, row in enumerate(rows, start=1):
        row_id = str(row.get("id", f"row-{number}"))
        calling = row.get("calling") or []
        if len(calling) != 1:
            skipped[row_id] = f"{len(calling)} calls"
            continue
        name = sanitize_name(str(calling[0].get("api", "")))
        if name not in schemas:
            skipped[row_id] = f"tool {name!r} not in the registry"
            continue
        properties = schemas[name].get("properties") or {}
        arguments = {k: converted(v, properties.get(k) or {})
                     for k, v in (calling[0].get("parameters") or {}).items()}
        acceptable: dict[str, list[Any]] = {k: [v] for k, v in arguments.items()}
        for key, spec in properties.items():
            if key not in acceptable:
                acceptable[key] = [OMIT, spec["default"]] if "default" in spec else [OMIT]
        calls.append(GoldCall(row_id, str(row["query"]), name, arguments, acceptable))
    return calls, skipped


def main() -> None:
    import argparse
    import json
    import os

    from nexus_mlx.tools.registry import load_seal_tools
    from tasks.call_scoring import gold_row

    data = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "seal-tools"
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "nexus-mlx-bench"
    parser = argparse.ArgumentParser(description="Seal-Tools dev single-call rows as gold calls")
    parser.add_argument("--dev", type=Path, default=data / "dev.jsonl")
    parser.add_argument("--tools", type=Path, default=data / "tool.jsonl")
    parser.add_argument("--out", type=Path, default=cache / "seal_dev_calls.jsonl")
    args = parser.parse_args()
    schemas = {t.qualified_name: t.input_schema for t in load_seal_tools(args.tools)}
    rows = [json.loads(line) for line in args.dev.read_text("utf-8").splitlines() if line.strip()]
    calls, skipped = seal_gold_calls(rows, schemas)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(gold_row(c), ensure_ascii=False) + "\n"
                                for c in calls), "utf-8")
    print(f"{len(calls)} gold calls -> {args.out} ({len(skipped)} rows skipped)")


if __name__ == "__main__":
    main()
