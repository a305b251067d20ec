"""The GGUF container (llama.cpp's model file format): metadata, tensor table, tensor data.

Contract: ``parse_gguf(path)`` reads the header, every metadata value and the tensor table,
checking each count, offset and size against the file before using it, so a missing, empty,
truncated or corrupt file raises :class:`ModelFormatError` naming the path (never a crash, a
hang, or a giant allocation). Tensor data stays memory-mapped until ``convert_tensor`` decodes
one tensor: F32 / F16 / BF16 as floats; Q4_0, Q4_1 and Q8_0 repacked losslessly into MLX affine
triplets (4 or 8 bits, group size 32, bit-identical to what ``mx.load`` returns for them); every
other type the ``gguf`` package can dequantize (K-quants, Q5_0/Q5_1, IQ*) dequantized; anything
else raises :class:`ModelFormatError` naming the tensor and its type.

Why neither ``mx.load`` nor ``gguf.GGUFReader`` reads the file: ``mx.load`` rejects a whole file
when any tensor is Q5_0/Q5_1/Q3_K/Q5_K/IQ* (the gemma3-270m Q4_K_M file has Q5_0), returns Q4_K /
Q6_K as float16 and narrows BF16 to float16; ``GGUFReader`` spends 4 s (SmolLM2) to 15 s
(Gemma 3) building per-item views of the tokenizer arrays (this parser: 0.1 s / 0.3 s).

It does not know tensor names, architectures, configs or tokenizers (``gguf``, ``gguf_tokenizer``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import mlx.core as mx
import numpy as np

from nexus_mlx.errors import ModelFormatError

QType = gguf.GGMLQuantizationType
_MAX_DEPTH = 4  # nesting of metadata arrays we follow; real files use 1
_MAX_DIMS = 4  # GGML_MAX_DIMS

# --------------------------------------------------------------------------- container


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor table: ``shape`` in numpy (row-major) order."""

    name: str
    shape: tuple[int, ...]
    qtype: QType
    offset: int  # absolute byte offset in the file
    nbytes: int


@dataclass(frozen=True)
class GGUFFile:
    """A parsed GGUF container: metadata values and the tensor table over a read-only map."""

    path: Path
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]
    data: np.ndarray = field(repr=False)  # np.memmap of the whole file, uint8

    def raw(self, info: TensorInfo) -> np.ndarray:
        """The tensor's bytes, one row of blocks per row: ``(rows, row_bytes)`` uint8."""
        rows = int(np.prod(info.shape[:-1], dtype=np.int64))
        return self.data[info.offset : info.offset + info.nbytes].reshape(rows, -1)


class _Cursor:
    """Bounds-checked little-endian reads over the mapped file."""

    def __init__(self, buf: memoryview, path: Path) -> None:
        self.buf, self.path, self.pos = buf, path, 0

    def check(self, n: int, what: str) -> None:
        """Raise unless ``n`` more bytes exist (bounds loops driven by counts in the file)."""
        if n < 0 or self.pos + n > len(self.buf):
            raise ModelFormatError(
                f"GGUF file {self.path} is truncated or corrupt: {what} at byte {self.pos} "
                f"needs {n} bytes, the file has {len(self.buf)}"
            )

    def need(self, n: int, what: str) -> int:
        self.check(n, what)
        start, self.pos = self.pos, self.pos + n
        return start

    def scalar(self, fmt: str, what: str) -> Any:
        start = self.need(struct.calcsize(fmt), what)
        return struct.unpack_from(fmt, self.buf, start)[0]

    def string(self, what: str) -> str:
        n = self.scalar("<Q", what)
        start = self.need(n, what)
        try:
            return str(self.buf[start : start + n].tobytes().decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise ModelFormatError(f"GGUF file {self.path}: {what} is not UTF-8: {exc}") from exc


# metadata value type id -> (struct format, numpy dtype); 8 is string, 9 is array
_SCALARS: dict[int, tuple[str, str]] = {
    0: ("<B", "<u1"), 1: ("<b", "<i1"), 2: ("<H", "<u2"), 3: ("<h", "<i2"), 4: ("<I", "<u4"),
    5: ("<i", "<i4"), 6: ("<f", "<f4"), 7: ("<?", "<u1"), 10: ("<Q", "<u8"), 11: ("<q", "<i8"),
    12: ("<d", "<f8"),
}
_STRING, _ARRAY, _BOOL = 8, 9, 7


def _read_value(cur: _Cursor, vtype: int, key: str, depth: int = 0) -> Any:
    if vtype in _SCALARS:
        return cur.scalar(_SCALARS[vtype][0], key)
    if vtype == _STRING:
        return cur.string(key)
    if vtype != _ARRAY or depth >= _MAX_DEPTH:
        raise ModelFormatError(f"GGUF file {cur.path}: metadata {key!r} has unknown type {vtype}")
    itype, count = cur.scalar("<I", key), cur.scalar("<Q", key)
    if itype in _SCALARS:
        dtype = np.dtype(_SCALARS[itype][1])
        start = cur.need(count * dtype.itemsize, key)
        values = np.frombuffer(cur.buf, dtype, count, start).copy()
        return values.astype(bool) if itype == _BOOL else values
    cur.check(count * 8, key)  # every string / array item starts with an 8-byte count
    if itype == _STRING:
        return [cur.string(key) for _ in range(count)]
    if itype == _ARRAY:
        return [_read_value(cur, _ARRAY, key, depth + 1) for _ in range(count)]
    raise ModelFormatError(f"GGUF file {cur.path}: metadata {key!r} has items of unknown type {itype}")


def _read_tensor_info(cur: _Cursor) -> tuple[str, tuple[int, ...], int, int]:
    name = cur.string("tensor name")
    n_dims = cur.scalar("<I", f"rank of tensor {name!r}")
    if not 1 <= n_dims <= _MAX_DIMS:
        raise ModelFormatError(f"GGUF file {cur.path}: tensor {name!r} has rank {n_dims}")
    ne = [cur.scalar("<Q", f"shape of tensor {name!r}") for _ in range(n_dims)]
    qtype = cur.scalar("<I", f"type of tensor {name!r}")
    offset = cur.scalar("<Q", f"offset of tensor {name!r}")
    return name, tuple(reversed(ne)), qtype, offset


def _tensor_layout(path: Path, name: str, shape: tuple[int, ...], type_id: int) -> tuple[QType, int]:
    """The tensor's type and byte size, or the error saying why it cannot be loaded."""
    try:
        qtype = QType(type_id)
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise ModelFormatError(
            f"tensor {name!r} in {path} has GGML type id {type_id}, which nexus-mlx cannot load"
        ) from None
    if any(d <= 0 for d in shape) or shape[-1] % block:
        raise ModelFormatError(
            f"GGUF file {path}: tensor {name!r} of type {qtype.name} has shape {shape}, whose "
            f"rows are not a whole number of {block}-element blocks"
        )
    n = int(np.prod(shape, dtype=np.float64))
    return qtype, n // block * type_size


def parse_gguf(path: str | Path) -> GGUFFile:
    """Parse and validate the container; tensor data stays on disk (memory-mapped)."""
    path = Path(path)
    if not path.is_file():
        raise ModelFormatError(f"GGUF file {path} does not exist or is not a regular file")
    if path.stat().st_size == 0:
        raise ModelFormatError(f"GGUF file {path} is empty")
    data = np.memmap(path, dtype=np.uint8, mode="r")
    cur = _Cursor(memoryview(data), path)  # type: ignore[arg-type]  # memmap is a buffer
    magic = bytes(cur.buf[cur.need(4, "magic") : 4])
    if magic != b"GGUF":
        raise ModelFormatError(f"{path} is not a GGUF file (magic {magic!r}, expected b'GGUF')")
    version = cur.scalar("<I", "version")
    if version not in (2, 3):
        raise ModelFormatError(f"GGUF file {path} has version {version}; supported: 2, 3")
    n_tensors, n_kv = cur.scalar("<Q", "tensor count"), cur.scalar("<Q", "metadata count")
    cur.check((n_tensors + n_kv) * 8, "tensor and metadata tables")  # bounds the loops below
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string("metadata key")
        if key in metadata:
            raise ModelFormatError(f"GGUF file {path}: metadata key {key!r} appears twice")
        metadata[key] = _read_value(cur, cur.scalar("<I", f"type of {key!r}"), key)
    table = [_read_tensor_info(cur) for _ in range(n_tensors)]
    align = metadata.get("general.alignment", 32)
    if not isinstance(align, int) or align <= 0 or align & (align - 1):
        raise ModelFormatError(f"GGUF file {path}: general.alignment {align!r} is not a power of 2")
    data_start = -(-cur.pos // align) * align
    tensors: dict[str, TensorInfo] = {}
    for name, shape, type_id, offset in table:
        qtype, nbytes = _tensor_layout(path, name, shape, type_id)
        start = data_start + offset
        if name in tensors or offset % align or start + nbytes > len(data):
            raise ModelFormatError(
                f"GGUF file {path} is truncated or corrupt: tensor {name!r} ({qtype.name}, "
                f"{nbytes} bytes at {start}) is duplicated, misaligned or past the end "
                f"({len(data)} bytes)"
            )
        tensors[name] = TensorInfo(name, shape, qtype, start, nbytes)
    return GGUFFile(path, metadata, tensors, data)


# --------------------------------------------------------------------------- tensor types

# Q4_0: d * (q - 8); Q4_1: d * q + m; Q8_0: d * q (q signed). Blocks of 32, elements 0..15 in
# the low nibbles of qs, 16..31 in the high nibbles.
_Q4_0 = np.dtype([("d", "<f2"), ("qs", "u1", 16)])
_Q4_1 = np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", 16)])
_Q8_0 = np.dtype([("d", "<f2"), ("qs", "i1", 32)])
MLX_NATIVE = (QType.Q4_0, QType.Q4_1, QType.Q8_0)  # repacked, not dequantized
_BLOCKS = {QType.Q4_0: _Q4_0, QType.Q4_1: _Q4_1, QType.Q8_0: _Q8_0}


def _pack_nibbles(qs: np.ndarray) -> np.ndarray:
    """GGML nibble order -> MLX 4-bit order (element i at bits 4*(i%8) of uint32 word i//8)."""
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # (blocks, 32): element order
    return np.ascontiguousarray(q[:, 0::2] | (q[:, 1::2] << 4)).view("<u4")  # (blocks, 4)


def repack_to_mlx(raw: np.ndarray, qtype: QType) -> tuple[mx.array, mx.array, mx.array, int]:
    """Q4_0 / Q4_1 / Q8_0 rows of blocks -> MLX affine ``(packed, scales, biases, bits)``.

    Lossless: Q4_0 ``d*(q-8)`` = scale d, bias -8d; Q4_1 ``d*q+m`` = scale d, bias m; Q8_0
    ``d*q`` (signed) = scale d, bias -128d on ``q+128``; scales and biases stay float16.
    """
    rows = raw.shape[0]
    blocks = np.ascontiguousarray(raw).view(_BLOCKS[qtype]).reshape(-1)
    d = blocks["d"]
    if qtype == QType.Q8_0:
        packed = (blocks["qs"].view(np.uint8) ^ 0x80).view("<u4")  # q + 128, 4 per word
        biases, bits = d * np.float16(-128), 8
    else:
        packed = _pack_nibbles(blocks["qs"])
        biases = blocks["m"] if qtype == QType.Q4_1 else d * np.float16(-8)
        bits = 4
    w, scales, b = (mx.array(np.ascontiguousarray(a).reshape(rows, -1)) for a in (packed, d, biases))
    return w, scales, b, bits


def convert_tensor(
    file: GGUFFile, info: TensorInfo, dequantize_dtype: mx.Dtype
) -> tuple[dict[str, mx.array], tuple[int, int] | None]:
    """One tensor as ``{suffix: array}`` (``weight``, or ``weight``/``scales``/``biases``) and
    its ``(group_size, bits)`` when it stays quantized."""
    raw = np.ascontiguousarray(file.raw(info))
    if info.qtype in (QType.F32, QType.F16):
        return {"weight": mx.array(raw.view("<f4" if info.qtype == QType.F32 else "<f2"))
                .reshape(info.shape)}, None
    if info.qtype == QType.BF16:
        return {"weight": mx.array(raw.view("<u2")).view(mx.bfloat16).reshape(info.shape)}, None
    if info.qtype in MLX_NATIVE:
        packed, scales, biases, bits = repack_to_mlx(raw, info.qtype)
        return {"weight": packed, "scales": scales, "biases": biases}, (32, bits)
    try:
        values = gguf.quants.dequantize(raw, info.qtype)
    except NotImplementedError:
        raise ModelFormatError(
            f"tensor {info.name!r} in {file.path} has type {info.qtype.name}, which nexus-mlx "
            f"cannot load (supported: F32, F16, BF16, {', '.join(t.name for t in MLX_NATIVE)}, "
            "and the types gguf.quants.dequantize implements)"
        ) from None
    return {"weight": mx.array(values).reshape(info.shape).astype(dequantize_dtype)}, None
