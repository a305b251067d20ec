"""The package's layout rules, checked on its source.

- Floors: every ``nexus_mlx`` module belongs to a *unit* (a top-level subpackage such as
  ``kv/`` or a top-level module such as ``errors.py``), every unit to a floor, and an import may
  only run to the same floor or down. Imports are read with ``ast`` from every module, at any
  depth (inside functions, under ``TYPE_CHECKING``), except ``nexus_mlx/__init__.py``: it is the
  lazy public surface and names everything. ``from nexus_mlx import name`` counts as an import of
  the module that defines ``name``; a bare ``import nexus_mlx`` as one of the whole flat API.
- No import circle between units.
- No module over 500 lines (house style: small files, one concept each).
- Every exception class lives in ``errors.py`` and derives from ``NexusError`` (warning
  categories, which are only ever passed to ``warnings.warn``, are not exceptions here).
- The flat API: every name in ``nexus_mlx.__all__`` resolves, and importing submodules never
  shadows a public function (``nx.splice`` stays the function after ``import
  nexus_mlx.blocks.splicing``).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

import nexus_mlx

PACKAGE = Path(nexus_mlx.__file__).resolve().parent
MAX_LINES = 500
# errors / metrics / _platform < kv < kernels < models < tools, sur < blocks, refresh, decode
# < routing < agent < server < cli
FLOORS: dict[str, int] = {
    "errors": 0, "metrics": 0, "_platform": 0,
    "kv": 1,
    "kernels": 2,
    "models": 3,
    "tools": 4, "sur": 4,
    "blocks": 5, "refresh": 5, "decode": 5,
    "routing": 6,
    "agent": 7,
    "server": 8,
    "cli": 9,
}
ROOT_FLOOR = max(FLOORS[m.split(".")[1]] for m in nexus_mlx._EXPORTS.values())  # the flat API


@dataclass(frozen=True)
class Arrow:
    source: str  # importing module, dotted
    target: str  # imported module, dotted ("nexus_mlx" for the whole flat API)
    where: str  # path:line

    def __str__(self) -> str:
        return f"{self.where}: {self.source} -> {self.target}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _targets(node: ast.AST, module: str, is_package: bool, modules: dict[str, Path]) -> list[str]:
    """The ``nexus_mlx`` modules one import statement imports (relative ones resolved)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "nexus_mlx"]
    assert isinstance(node, ast.ImportFrom)
    base = node.module or ""
    if node.level:
        anchor = module.split(".") if is_package else module.split(".")[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([base] if base else []))
    if base.split(".")[0] != "nexus_mlx":
        return []
    out = []
    for alias in node.names:
        full = f"{base}.{alias.name}"
        if full in modules:
            out.append(full)  # from pkg import submodule
        elif base == "nexus_mlx" and alias.name in nexus_mlx._EXPORTS:
            out.append(nexus_mlx._EXPORTS[alias.name])  # a flat-API name: its defining module
        else:
            out.append(base)
    return out


def import_arrows() -> list[Arrow]:
    modules = _modules()
    arrows = []
    for name, path in modules.items():
        if name == "nexus_mlx":
            continue  # the lazy public surface is exempt
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):  # every depth: functions, TYPE_CHECKING blocks, try/except
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target in _targets(node, name, path.name == "__init__.py", modules):
                    where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
                    arrows.append(Arrow(name, target, where))
    return arrows


def unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "nexus_mlx"


def floor(module: str) -> int:
    u = unit(module)
    return ROOT_FLOOR if u == "nexus_mlx" else FLOORS[u]


@pytest.fixture(scope="module")
def arrows() -> list[Arrow]:
    found = import_arrows()
    assert len(found) > 100  # the parser sees the package's imports
    return found


def test_the_parser_sees_nested_relative_and_flat_api_imports():
    source = textwrap.dedent(
        """
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from nexus_mlx.agent.orchestrator import Agent
        def f():
            import nexus_mlx.routing.slb
            from nexus_mlx import load, errors
            from . import rope
            from ..models import forward
        """
    )
    modules = _modules()
    tree = ast.parse(source)
    got = [t for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)
           for t in _targets(node, "nexus_mlx.kv.cache", False, modules)]
    assert sorted(got) == sorted([
        "nexus_mlx.agent.orchestrator", "nexus_mlx.routing.slb", "nexus_mlx.models.load",
        "nexus_mlx.errors", "nexus_mlx.kv.rope", "nexus_mlx.models.forward",
    ])


def test_every_unit_has_a_floor():
    units = {unit(m) for m in _modules()} - {"nexus_mlx"}
    assert units - set(FLOORS) == set(), "new top-level modules: give them a floor in FLOORS"
    assert set(FLOORS) - units == set(), "FLOORS names units that no longer exist"


def upward(arrows: list[Arrow]) -> list[str]:
    """The arrows that run up a floor, each with its floors."""
    return [f"{a}  (floor {floor(a.source)} {unit(a.source)} -> floor {floor(a.target)} "
            f"{unit(a.target)})" for a in arrows if floor(a.target) > floor(a.source)]


def circles(arrows: list[Arrow]) -> list[str]:
    """Import circles between units: the shortest one through each unit on one, each hop
    named by one arrow that makes it."""
    edges: dict[str, dict[str, Arrow]] = {}
    for a in arrows:
        s, t = unit(a.source), unit(a.target)
        if s != t:
            edges.setdefault(s, {}).setdefault(t, a)
    found_by_units: dict[frozenset[str], str] = {}
    for start in sorted(edges):  # breadth first from start back to start
        paths, seen, found = [[start]], {start}, None
        while paths and found is None:
            grown = []
            for path in paths:
                for nxt in sorted(edges.get(path[-1], {})):
                    if nxt == start and found is None:
                        found = [*path, start]
                    elif nxt not in seen:
                        seen.add(nxt)
                        grown.append([*path, nxt])
            paths = grown
        if found is not None and frozenset(found) not in found_by_units:
            found_by_units[frozenset(found)] = " -> ".join(found) + "\n    " + "\n    ".join(
                str(edges[a][b]) for a, b in zip(found, found[1:], strict=False))
    return list(found_by_units.values())


def test_the_checks_catch_an_upward_arrow_and_a_circle():
    ok = [Arrow("nexus_mlx.models.forward", "nexus_mlx.kv.cache", "a.py:1"),
          Arrow("nexus_mlx.sur.select", "nexus_mlx.tools.tool", "b.py:2")]  # same floor: fine
    assert upward(ok) == [] and circles(ok) == []
    up = Arrow("nexus_mlx.kv.cache", "nexus_mlx.models.forward", "nexus_mlx/kv/cache.py:9")
    assert upward([*ok, up]) == [
        "nexus_mlx/kv/cache.py:9: nexus_mlx.kv.cache -> nexus_mlx.models.forward  "
        "(floor 1 kv -> floor 3 models)"]
    back = Arrow("nexus_mlx.tools.ir", "nexus_mlx.sur.units", "nexus_mlx/tools/ir.py:7")
    assert circles([*ok, back]) == [
        "sur -> tools -> sur\n    b.py:2: nexus_mlx.sur.select -> nexus_mlx.tools.tool"
        "\n    nexus_mlx/tools/ir.py:7: nexus_mlx.tools.ir -> nexus_mlx.sur.units"]
    assert upward([back]) == []  # a circle on one floor is caught by the circle check alone
    root = Arrow("nexus_mlx.models.load", "nexus_mlx", "c.py:3")  # the whole flat API
    assert len(upward([root])) == 1


def test_no_import_runs_up_a_floor(arrows):
    bad = upward(arrows)
    assert not bad, "imports that run up a floor:\n" + "\n".join(bad)


def test_no_import_circle_between_units(arrows):
    bad = circles(arrows)
    assert not bad, "import circles between units:\n" + "\n".join(bad)


def test_no_module_is_over_500_lines():
    long = {str(p.relative_to(PACKAGE.parent)): n for p in sorted(PACKAGE.rglob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them): {long}"


def test_every_exception_is_in_errors_and_derives_from_nexus_error():
    from nexus_mlx import errors

    stray, orphans = [], []
    for name in _modules():
        if name.endswith("__main__"):
            continue  # running it would start the command line
        module = importlib.import_module(name)
        for cls_name, cls in vars(module).items():
            if not (inspect.isclass(cls) and issubclass(cls, BaseException)):
                continue
            if issubclass(cls, Warning):
                continue  # a warning category (warnings.warn), never raised
            if cls.__module__ != name:
                continue  # imported, not defined here
            if name != errors.__name__:
                stray.append(f"{name}.{cls_name}")
            elif not issubclass(cls, errors.NexusError):
                orphans.append(cls_name)
    assert not stray, f"exception classes outside nexus_mlx/errors.py: {stray}"
    assert not orphans, f"exceptions in errors.py not derived from NexusError: {orphans}"
    defined = {n for n, c in vars(errors).items() if inspect.isclass(c) and issubclass(c, Exception)}
    assert defined <= set(nexus_mlx.__all__), "every error is public: nx.<Name>"


def test_no_exception_class_is_defined_outside_errors_even_in_a_function():
    """The source scan: classes defined inside functions are no module attributes, so the
    import scan above cannot see them."""
    nested = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "errors.py" and path.parent == PACKAGE:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b).split(".")[-1] for b in node.bases]
                if any(b.endswith(("Error", "Exception")) for b in bases):
                    nested.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}")
    assert not nested, f"exception classes outside nexus_mlx/errors.py: {nested}"


def test_every_public_name_resolves():
    missing = []
    for name in nexus_mlx.__all__:
        try:
            getattr(nexus_mlx, name)
        except AttributeError as exc:
            missing.append(f"{name}: {exc}")
    assert not missing, missing
    assert set(nexus_mlx.__all__) <= set(dir(nexus_mlx))


def test_submodule_imports_do_not_shadow_the_flat_api():
    """In a fresh interpreter (``nx.name`` is cached on first access, so order matters): import
    the submodules first, then look the names up; and the other way round."""
    code = textwrap.dedent(
        """
        import importlib, inspect, sys
        import nexus_mlx as nx
        first, submodules = sys.argv[1] == "modules-first", sys.argv[2:]
        def modules():
            import nexus_mlx.blocks.splicing, nexus_mlx.refresh.budgeted  # noqa: F401
            for name in submodules:
                importlib.import_module(name)
        if first:
            modules()
        seen = {n: getattr(nx, n) for n in nx._EXPORTS}
        if not first:
            modules()
        bad = [n for n in nx._EXPORTS if inspect.ismodule(getattr(nx, n))
               or getattr(nx, n) is not seen[n]]
        assert not bad, bad
        assert inspect.isfunction(nx.splice) and nx.splice.__name__ == "splice"
        assert inspect.isfunction(nx.repair) and nx.repair.__name__ == "repair"
        print("ok")
        """
    )
    names = [m for m in _modules() if not m.endswith("__main__")]
    for order in ("modules-first", "names-first"):
        run = subprocess.run([sys.executable, "-c", code, order, *names], capture_output=True,
                             text=True, timeout=300, cwd=PACKAGE.parent)
        assert run.returncode == 0 and run.stdout.strip() == "ok", (order, run.stderr[-2000:])
