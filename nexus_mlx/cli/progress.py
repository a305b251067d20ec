"""Progress on stderr for the command line's long stages (tqdm).

Contract: :class:`Stages` is one tqdm bar over a fixed number of named stages; ``start(label)``
marks the previous stage done and shows the new label with the elapsed time, so a command
that works for a minute says what it is doing. :func:`tool_bar` is the factory
:func:`~nexus_mlx.routing.router.build_router` and the compiler call for a per-tool bar.
Everything goes to stderr; stdout keeps only the results. It does not time anything itself.
"""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm


class Stages:
    def __init__(self, total: int, desc: str) -> None:
        self.desc, self.done = desc, -1
        self.bar = tqdm(total=total, file=sys.stderr, unit="stage", dynamic_ncols=True,
                        bar_format="{desc} [stage {n_fmt}/{total_fmt}, {elapsed}]")

    def start(self, label: str) -> None:
        """The next stage begins (the one before it, if any, is done)."""
        if self.done >= 0:
            self.bar.update(1)
        self.done += 1
        self.bar.set_description_str(f"{self.desc}: {label}")

    def close(self, *, finished: bool = True) -> None:
        """End the bar: full when ``finished`` (stages may have been skipped), else as it is."""
        if finished and self.done >= 0 and self.bar.n < self.bar.total:
            self.bar.update(self.bar.total - self.bar.n)
        self.bar.close()

    def __enter__(self) -> Stages:
        return self

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        self.close(finished=exc_type is None)


def tool_bar(desc: str, *, iterable: bool = False) -> Any:
    """A factory for a tqdm bar counting tools: ``total -> bar`` (closed by its user), or with
    ``iterable`` a wrapper ``items -> bar over items`` (``compile_directory``'s ``progress``)."""
    def make(total_or_items: Any) -> Any:
        kwargs = {"desc": desc, "unit": "tool", "file": sys.stderr, "leave": False,
                  "dynamic_ncols": True}
        if iterable:
            return tqdm(total_or_items, **kwargs)
        return tqdm(total=total_or_items, **kwargs)
    return make
