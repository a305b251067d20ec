"""Writing a JSON file so that a reader never sees half of it.

Contract: ``write_json(path, obj, **dump_options)`` dumps ``obj`` (``json.dump``'s options pass
through) to a temporary file in ``path``'s directory and renames it over ``path``
(``os.replace``): ``path`` holds the old content or the new, never a mix. On any failure the
temporary file is removed and ``path`` is left as it was; the error propagates (an ``OSError``
for a full disk, a ``TypeError`` for what JSON cannot hold). The directory must exist. No
``fsync``: a crash of the machine (not of the process) may lose the newest content.

It knows nothing about what the JSON means.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_json(path: str | os.PathLike[str], obj: Any, **dump_options: Any) -> Path:
    """Replace ``path`` by ``obj`` as JSON, atomically; returns the path."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, **dump_options)
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return target
