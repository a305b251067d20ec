"""The ``.atb`` file format: one compiled tool block in a self-checking binary file.

Contract:
- ``write_block(path, block)`` writes a :class:`~nexus_mlx.blocks.block.CompiledBlock`
  atomically: a temporary file in the target's directory, fsync, then ``os.replace``; a failure
  at any point leaves the previous file untouched and no temporary file.
- ``read_header`` reads and verifies the header and metadata only; ``read_block`` also maps the
  file and copies K and V out of it. Before any K/V byte is touched every header field is checked
  against the file size, so truncated, corrupted or lying files raise :class:`FormatError`
  naming the field, never read out of bounds and never raise anything else. A header read from a
  file carries its :class:`~nexus_mlx.blocks.block.BlockLayout`.

File layout, version 1, little-endian throughout (gaps are zero padding, sparse where the file
system allows; the file ends exactly where V ends):

=================================  ==========================================================
bytes                              section
=================================  ==========================================================
``[0, 128)``                       header (table below)
``[128, 128 + meta_size)``         metadata: UTF-8 JSON ``{"fingerprint": {...},
                                   "rope_specs": [{...} per layer], "tokens": [...],
                                   "context": [...]}`` (context: the token ids at
                                   positions ``0..m0-1`` when compiled, or empty)
``[k_offset, k_offset + k_size)``  K ``(layers, kv_heads, S, head_dim)``, C order
``[v_offset, v_offset + v_size)``  V ``(layers, kv_heads, S, head_dim)`` (row layout) or
                                   ``(layers, kv_heads, head_dim, S)`` (transposed layout)
=================================  ==========================================================

``k_offset`` and ``v_offset`` are multiples of 2 MiB (:data:`ALIGNMENT`); K follows the
metadata and V follows K without overlap; ``k_size == v_size == layers * kv_heads * S *
head_dim * itemsize``.

Header (``struct`` format :data:`HEADER_FORMAT`):

======  ======  ==================  =========================================================
offset  type    field               meaning
======  ======  ==================  =========================================================
0       8s      magic               ``89 'A' 'T' 'B' 0D 0A 1A 0A`` (catches text-mode mangling)
8       u16     version             1
10      u16     header_size         128
12      u8      dtype               1 = float16, 2 = float32
13      u8      v_layout            0 = row, 1 = transposed
14      u8      rope_traditional    layer 0's ``traditional`` (0 or 1)
15      u8      rope_scaling        layer 0's scaling type, index in ``SUPPORTED_SCALING``
16      12s     architecture        ASCII, NUL-padded
28      u16     num_layers
30      u16     n_kv_heads
32      u16     head_dim
34      u16     rope_dims           layer 0's rotated dims
36      u32     vocab_size
40      u32     meta_size           bytes of metadata right after the header
44      u32     m0                  RoPE anchor: position of the block's first token
48      u32     num_tokens          S
52      f64     rope_base           layer 0's base
60      f32     rope_scale          layer 0's scaling ``factor`` (1.0 without one)
64      u64     k_offset
72      u64     k_size
80      u64     v_offset
88      u64     v_size
96      8s      weights_digest      first 8 bytes of the fingerprint's SHA-256 weights digest
104     8s      rope_digest         SHA-256[:8] of the canonical JSON of every layer's RopeSpec
112     8s      tokens_digest       SHA-256[:8] of the token ids as little-endian u32
120     8s      check_digest        SHA-256[:8] of header bytes [0, 120) + the metadata
======  ======  ==================  =========================================================

The header's RoPE scalars describe layer 0 only (layers may differ, e.g. gemma3's local and
global layers); every layer's full spec is in the metadata, bound to the header by
``rope_digest``. The metadata repeats the fingerprint and holds the token ids (a splice needs
them to repair the seam); on reading, it must agree with the header field by field.
``check_digest`` detects any changed header or metadata byte. K/V bytes carry no checksum:
hashing them would cost as much as reading them; a block whose K/V were corrupted on disk
still has a consistent structure.

It does not know the in-memory block's own rules (what a header may hold, cutting a block
out of a cache, checking it against the running model): that is :mod:`nexus_mlx.blocks.block`.
It does not splice, re-anchor or recompute anything, and does not know about routing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import struct
import tempfile
from pathlib import Path
from typing import IO, Any

import mlx.core as mx
import numpy as np

from nexus_mlx.blocks.block import ITEMSIZE, MX_DTYPES, BlockHeader, BlockLayout, CompiledBlock
from nexus_mlx.errors import FormatError
from nexus_mlx.kv.cache import MAX_POSITION, V_LAYOUTS
from nexus_mlx.kv.rope import SUPPORTED_SCALING, RopeSpec
from nexus_mlx.models.fingerprint import ModelFingerprint

MAGIC = b"\x89ATB\r\n\x1a\n"
VERSION = 1
HEADER_FORMAT = "<8sHHBBBB12sHHHHIIIIdfQQQQ8s8s8s8s"
HEADER_FIELDS = (
    "magic", "version", "header_size", "dtype", "v_layout", "rope_traditional", "rope_scaling",
    "architecture", "num_layers", "n_kv_heads", "head_dim", "rope_dims", "vocab_size",
    "meta_size", "m0", "num_tokens", "rope_base", "rope_scale", "k_offset", "k_size",
    "v_offset", "v_size", "weights_digest", "rope_digest", "tokens_digest", "check_digest",
)
HEADER_SIZE = struct.calcsize(HEADER_FORMAT)
CHECKED_PREFIX = HEADER_SIZE - 8  # check_digest covers header bytes [0, 120) + metadata
ALIGNMENT = 2 * 1024 * 1024
MAX_META_SIZE = 16 * 1024 * 1024
DTYPES = {1: "float16", 2: "float32"}
_DTYPE_CODES = {name: code for code, name in DTYPES.items()}

assert HEADER_SIZE == 128 and len(HEADER_FIELDS) == len(struct.unpack(HEADER_FORMAT, bytes(128)))
assert tuple(_DTYPE_CODES) == tuple(ITEMSIZE)  # every block dtype has a code


# ---- encoding ----------------------------------------------------------------------------------
def _digest8(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()[:8]


def _canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def rope_digest(specs: tuple[RopeSpec, ...]) -> bytes:
    """SHA-256[:8] of the canonical JSON of every layer's RoPE spec."""
    return _digest8(_canonical_json([spec.as_dict() for spec in specs]))


def tokens_digest(tokens: tuple[int, ...]) -> bytes:
    """SHA-256[:8] of the token ids as little-endian u32."""
    return _digest8(np.asarray(tokens, dtype="<u4").tobytes())


def _rope_scale(spec: RopeSpec) -> float:
    factor = dict(spec.scaling).get("factor", 1.0)
    return float(factor) if isinstance(factor, int | float) else 1.0


def encode_metadata(header: BlockHeader) -> bytes:
    """The metadata section: canonical UTF-8 JSON of fingerprint, RoPE specs and tokens."""
    return _canonical_json({
        "fingerprint": header.fingerprint.as_dict(),
        "rope_specs": [spec.as_dict() for spec in header.rope_specs],
        "tokens": list(header.tokens),
        "context": list(header.context),
    })


def _align(offset: int) -> int:
    return -(-offset // ALIGNMENT) * ALIGNMENT


def plan_layout(header: BlockHeader, meta_size: int) -> BlockLayout:
    """Section offsets for a block: K and V each at the next 2 MiB boundary."""
    size = header.section_size
    k_offset = _align(HEADER_SIZE + meta_size)
    return BlockLayout(meta_size, k_offset, size, _align(k_offset + size), size)


def pack_header(header: BlockHeader, layout: BlockLayout, meta: bytes) -> bytes:
    """The 128 header bytes for ``header`` laid out as ``layout`` with metadata ``meta``."""
    fp, spec0 = header.fingerprint, header.rope_specs[0]
    prefix = struct.pack(
        HEADER_FORMAT, MAGIC, VERSION, HEADER_SIZE, _DTYPE_CODES[header.dtype],
        V_LAYOUTS.index(header.v_layout), int(spec0.traditional),
        SUPPORTED_SCALING.index(spec0.scaling_type), fp.architecture.encode("ascii"),
        fp.num_layers, fp.n_kv_heads, fp.head_dim, spec0.dims, fp.vocab_size, len(meta),
        header.m0, header.num_tokens, spec0.base, _rope_scale(spec0), layout.k_offset,
        layout.k_size, layout.v_offset, layout.v_size, bytes.fromhex(fp.weights_digest)[:8],
        rope_digest(header.rope_specs), tokens_digest(header.tokens), bytes(8),
    )[:CHECKED_PREFIX]
    return prefix + _digest8(prefix + meta)


# ---- writing -----------------------------------------------------------------------------------
def _host_array(arr: mx.array, dtype: str) -> np.ndarray:
    host = np.ascontiguousarray(np.asarray(arr.astype(MX_DTYPES[dtype])))
    return host.astype(host.dtype.newbyteorder("<"), copy=False)


def _write_section(f: IO[bytes], offset: int, data: np.ndarray) -> None:
    f.seek(offset)
    f.write(np.ascontiguousarray(data).data)


def _fsync_directory(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform can open a directory
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_block(path: str | os.PathLike[str], block: CompiledBlock) -> BlockLayout:
    """Write ``block`` to ``path`` atomically (temp file in the same directory, fsync,
    ``os.replace``, mode 0644). On any failure the previous file, if any, is untouched and the
    temporary file is removed (a killed process can leave a ``.<name>.*.tmp`` behind)."""
    target = Path(path)
    header = block.header
    meta = encode_metadata(header)
    if len(meta) > MAX_META_SIZE:
        raise FormatError(f"metadata of {len(meta)} bytes exceeds {MAX_META_SIZE}")
    layout = plan_layout(header, len(meta))
    head = pack_header(header, layout, meta)
    k_host, v_host = _host_array(block.k, header.dtype), _host_array(block.v, header.dtype)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(head + meta)
            _write_section(f, layout.k_offset, k_host)
            _write_section(f, layout.v_offset, v_host)
            f.truncate(layout.file_size)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_directory(target.parent)
    return layout


# ---- reading -----------------------------------------------------------------------------------
def _check_codes(raw: dict[str, Any]) -> None:
    if raw["magic"] != MAGIC:
        raise FormatError(f"bad magic {raw['magic']!r}, expected {MAGIC!r}: not an .atb file")
    if raw["version"] != VERSION:
        raise FormatError(f"format version {raw['version']} is not supported (only {VERSION})")
    if raw["header_size"] != HEADER_SIZE:
        raise FormatError(
            f"header_size {raw['header_size']} != {HEADER_SIZE} for format version {VERSION}"
        )
    if raw["dtype"] not in DTYPES:
        raise FormatError(f"dtype code {raw['dtype']} is not one of {DTYPES}")
    if raw["v_layout"] >= len(V_LAYOUTS):
        raise FormatError(f"v_layout code {raw['v_layout']} is not one of 0 (row), 1 "
                               "(transposed)")
    if raw["rope_traditional"] > 1:
        raise FormatError(f"rope_traditional {raw['rope_traditional']} is not 0 or 1")
    if raw["rope_scaling"] >= len(SUPPORTED_SCALING):
        raise FormatError(f"rope_scaling code {raw['rope_scaling']} is not an index into "
                               f"{SUPPORTED_SCALING}")


def _check_counts(raw: dict[str, Any]) -> None:
    zero = [n for n in ("num_layers", "n_kv_heads", "head_dim", "vocab_size", "num_tokens")
            if raw[n] == 0]
    if zero:
        raise FormatError(f"header fields {zero} are zero")
    dims, head_dim = raw["rope_dims"], raw["head_dim"]
    if dims == 0 or dims % 2 or dims > head_dim:
        raise FormatError(f"rope_dims {dims} must be even and in (0, head_dim={head_dim}]")
    last = raw["m0"] + raw["num_tokens"] - 1
    if last > MAX_POSITION:
        raise FormatError(f"positions m0={raw['m0']} .. {last} exceed {MAX_POSITION}")


def _check_sections(raw: dict[str, Any], file_size: int) -> None:
    meta_end = HEADER_SIZE + raw["meta_size"]
    if not 2 <= raw["meta_size"] <= MAX_META_SIZE:
        raise FormatError(f"meta_size {raw['meta_size']} is outside [2, {MAX_META_SIZE}]")
    if meta_end > file_size:
        raise FormatError(f"truncated: metadata ends at byte {meta_end} but the file has "
                               f"{file_size} bytes")
    want = (raw["num_layers"] * raw["n_kv_heads"] * raw["num_tokens"] * raw["head_dim"]
            * ITEMSIZE[DTYPES[raw["dtype"]]])
    for name in ("k", "v"):
        if raw[f"{name}_size"] != want:
            raise FormatError(
                f"{name}_size {raw[f'{name}_size']} != layers {raw['num_layers']} x kv_heads "
                f"{raw['n_kv_heads']} x S {raw['num_tokens']} x head_dim {raw['head_dim']} x "
                f"itemsize = {want}"
            )
        if raw[f"{name}_offset"] % ALIGNMENT:
            raise FormatError(
                f"{name}_offset {raw[f'{name}_offset']} is not a multiple of {ALIGNMENT}"
            )
    k_end, v_end = raw["k_offset"] + want, raw["v_offset"] + want
    if raw["k_offset"] < meta_end:
        raise FormatError(f"K section at {raw['k_offset']} overlaps the header and "
                               f"metadata [0, {meta_end})")
    if raw["v_offset"] < k_end:
        raise FormatError(f"V section at {raw['v_offset']} overlaps or precedes the K "
                               f"section [{raw['k_offset']}, {k_end})")
    for name, start, end in (("K", raw["k_offset"], k_end), ("V", raw["v_offset"], v_end)):
        if end > file_size:
            raise FormatError(f"truncated: {name} section [{start}, {end}) ends past the "
                                   f"end of the file ({file_size} bytes)")
    if v_end != file_size:
        raise FormatError(f"{file_size - v_end} trailing bytes after the V section")


def _decode_metadata(
    meta: bytes,
) -> tuple[ModelFingerprint, tuple[RopeSpec, ...], tuple[int, ...], tuple[int, ...]]:
    try:
        obj = json.loads(meta.decode("utf-8"))
        fp = ModelFingerprint(**obj["fingerprint"])
        specs = tuple(_rope_from_json(spec) for spec in obj["rope_specs"])
        tokens = tuple(obj["tokens"])
        context = tuple(obj.get("context", ()))
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        raise FormatError(f"unreadable metadata: {type(exc).__name__}: {exc}") from exc
    return fp, specs, tokens, context


def _tupled(value: Any) -> Any:
    return tuple(_tupled(v) for v in value) if isinstance(value, list) else value


def _rope_from_json(spec: dict[str, Any]) -> RopeSpec:
    scaling = tuple((str(k), _tupled(v)) for k, v in spec.pop("scaling"))
    return RopeSpec(scaling=scaling, **spec)


def _metadata_disagreements(
    raw: dict[str, Any], fp: ModelFingerprint, specs: tuple[RopeSpec, ...], tokens: tuple[int, ...]
) -> list[str]:
    arch = raw["architecture"].rstrip(b"\0").decode("ascii", "replace")
    pairs: list[tuple[str, Any, Any]] = [
        ("architecture", arch, fp.architecture),
        *((n, raw[n], getattr(fp, n)) for n in ("num_layers", "n_kv_heads", "head_dim",
                                                "vocab_size")),
        ("num_tokens", raw["num_tokens"], len(tokens)),
        ("tokens_digest", raw["tokens_digest"], _safe(lambda: tokens_digest(tokens))),
        ("weights_digest", raw["weights_digest"], _safe(lambda: bytes.fromhex(fp.weights_digest)[:8])),
        ("rope_digest", raw["rope_digest"], _safe(lambda: rope_digest(specs))),
    ]
    if specs:
        s0 = specs[0]
        scale = _safe(lambda: struct.unpack("<f", struct.pack("<f", _rope_scale(s0)))[0])
        pairs += [
            ("rope_dims", raw["rope_dims"], s0.dims),
            ("rope_base", raw["rope_base"], s0.base),
            ("rope_traditional", bool(raw["rope_traditional"]), s0.traditional),
            ("rope_scaling", SUPPORTED_SCALING[raw["rope_scaling"]], s0.scaling_type),
            ("rope_scale", raw["rope_scale"], scale),
        ]
    return [f"{name}: header {a!r} != metadata {b!r}" for name, a, b in pairs if a != b]


def _safe(compute: Any) -> Any:
    """A digest of metadata values, or None where they are of the wrong type."""
    try:
        return compute()
    except (ValueError, TypeError, OverflowError):
        return None


def _parse(head: bytes, meta_reader: Any, file_size: int) -> BlockHeader:
    """Verify the header against the file size, then the metadata against the header."""
    if file_size < HEADER_SIZE or len(head) < HEADER_SIZE:
        raise FormatError(f"truncated: the file has {file_size} bytes, the header alone "
                               f"needs {HEADER_SIZE}")
    raw = dict(zip(HEADER_FIELDS, struct.unpack(HEADER_FORMAT, head[:HEADER_SIZE]), strict=True))
    _check_codes(raw)
    _check_counts(raw)
    _check_sections(raw, file_size)
    meta = meta_reader(raw["meta_size"])
    if len(meta) != raw["meta_size"]:
        raise FormatError(f"truncated: read {len(meta)} of {raw['meta_size']} metadata bytes")
    if _digest8(head[:CHECKED_PREFIX] + meta) != raw["check_digest"]:
        raise FormatError("check_digest mismatch: the header or the metadata is corrupt")
    fp, specs, tokens, context = _decode_metadata(meta)
    problems = _metadata_disagreements(raw, fp, specs, tokens)
    if problems:
        raise FormatError("metadata disagrees with the header: " + "; ".join(problems))
    layout = BlockLayout(raw["meta_size"], raw["k_offset"], raw["k_size"], raw["v_offset"],
                         raw["v_size"])
    return BlockHeader(fp, specs, raw["m0"], tokens, DTYPES[raw["dtype"]],
                       V_LAYOUTS[raw["v_layout"]], layout, context=context)


def _read_verified_header(f: IO[bytes]) -> BlockHeader:
    file_size = os.fstat(f.fileno()).st_size
    f.seek(0)
    return _parse(f.read(HEADER_SIZE), f.read, file_size)


def read_header(path: str | os.PathLike[str]) -> BlockHeader:
    """The verified header and metadata of an ``.atb`` file (K/V are not read)."""
    with open(path, "rb") as f:
        return _read_verified_header(f)


def _load_section(mm: mmap.mmap, offset: int, dtype: str, shape: tuple[int, ...]) -> mx.array:
    count = int(np.prod(shape))
    view = np.frombuffer(mm, dtype=np.dtype(dtype).newbyteorder("<"), count=count, offset=offset)
    return mx.array(view.reshape(shape))  # copies out of the mapping


def read_block(path: str | os.PathLike[str]) -> CompiledBlock:
    """Read and verify an ``.atb`` file; K/V are copied out of a read-only memory map."""
    with open(path, "rb") as f:
        header = _read_verified_header(f)
        assert header.layout is not None
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            k = _load_section(mm, header.layout.k_offset, header.dtype, header.k_shape)
            v = _load_section(mm, header.layout.v_offset, header.dtype, header.v_shape)
    return CompiledBlock(header, k, v)
