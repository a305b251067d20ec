"""Weight twins: a float32 weight matrix stored again as one-byte codes that rebuild it exactly,
so that decode-step products read about a third of the bytes.

Why it exists: on the CPU a decode step is a handful of matrix-vector products whose time is
the weight bytes they stream from memory. Weights loaded from a quantized file (GGUF Q4/Q5/Q8,
and the 16-weight sub-blocks of Q6_K) take few distinct values per block: ``scale * integer +
offset``. Such a block is stored here as 16 or 32 one-byte codes and its scale and offset, and
every weight is rebuilt bit for bit as ``fma(code, scale, offset)`` in float32, so a product
that reads the twin computes with the same numbers as one that reads the float32 matrix (the
sums only run in another order).

Contract (three parts, house-style rule 5):

- :func:`encode_twin_reference(w) <encode_twin_reference>` (numpy, the specification) takes a
  float32 ``(n, k)`` matrix and returns a :class:`Twin` whose :func:`rebuild` equals ``w``
  exactly (every element, as float32 values), or None when some block is not such a grid (more
  than 256 levels, uneven steps, non-finite values) or ``k`` is not a multiple of 16. It tries
  blocks of 32 first, then 16; :func:`encode_twin` runs the same algorithm natively
  (``twin_encode`` in the shim, ~10x faster) where the shim has it.
- the native kernel: ``_platform/csrc/twin_gemm.h`` inside the BLAS shim. A product of 1 to 4
  rows against a matrix whose twin is registered (:func:`register`) reads the twin
  (AVX-512F, or AVX2 + FMA; elsewhere it declines and the float32 matrix is read);
- the reference :func:`twin_matmul_reference`, ``x @ rebuild(twin).T``, and the dispatch,
  which is the shim's own: a product is routed by the address of its weight matrix, so MLX's
  graphs, laziness and modules are unchanged (``blas.set_twin_routing`` turns the reading off
  and on for the process).

:func:`register` keeps the registered array (and its twin) alive until :func:`unregister`, so
the address the shim matches is never reused by another array meanwhile; a row slice of a
registered array (the fused q/k/v weights' views) can be registered as a view of its twin,
sharing its codes. It knows nothing about models, layers or files
(:mod:`nexus_mlx.models.twins` chooses which matrices of a model get twins).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from nexus_mlx._platform import blas
from nexus_mlx.errors import ArgumentError

BLOCKS = (32, 16)  # block sizes tried, in order (Q6_K's sub-blocks are 16 weights)
LEVELS = 256  # distinct codes a block may use
FIRST_DIVISORS = 12  # divisors of the gap above a block's offset tried first (csrc: the same)
DIVISORS = 12  # divisors of the smallest gap between its sorted values tried next
GCD_STEPS = 64  # Euclid steps per value before the last stage, the gaps' gcd, gives up
_ROWS_PER_PASS = 2048  # rows encoded at a time (bounds the float64 temporaries)


@dataclass(frozen=True)
class Twin:
    """``w[j, p] = fma(codes[j, p], scale[j, p // block], offset[j, p // block])``."""

    codes: np.ndarray  # (n, k) uint8
    scale: np.ndarray  # (n, k // block) float32
    offset: np.ndarray  # (n, k // block) float32
    block: int

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.codes.shape[0]), int(self.codes.shape[1]))

    @property
    def nbytes(self) -> int:
        return int(self.codes.nbytes + self.scale.nbytes + self.offset.nbytes)


def _rebuilt(codes: np.ndarray, scale: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """``fma(codes, scale, offset)`` rounded once to float32 (float64 holds the product of a
    byte and a float32 exactly, and the sum of two nearby float32 values exactly)."""
    wide = codes.astype(np.float64) * scale.astype(np.float64)[..., None]
    return (wide + offset.astype(np.float64)[..., None]).astype(np.float32)


def _first_gaps(blocks: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """Each block's smallest value above its offset, minus the offset (1 for one value)."""
    above = np.where(blocks > offset[:, None], blocks - offset[:, None], np.inf).min(axis=1)
    return np.where(np.isfinite(above), above, 1.0).astype(np.float32)


def _sorted_gaps(blocks: np.ndarray) -> np.ndarray:
    """Each block's smallest positive gap between its sorted values (1 for one value)."""
    gaps = np.diff(np.sort(blocks, axis=1), axis=1)  # (B, b - 1)
    gaps = np.where(gaps > 0, gaps, np.inf).min(axis=1)
    return np.where(np.isfinite(gaps), gaps, 1.0).astype(np.float32)


def _gap_gcd(blocks: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """The greatest common divisor of each block's distances above its offset, by Euclid's
    algorithm on float32 (``fmod`` is exact, so exact multiples of a step give that step);
    0 where it does not settle within :data:`GCD_STEPS` steps per value."""
    g = np.zeros(blocks.shape[0], np.float32)
    settled = np.ones(blocks.shape[0], bool)
    for column in (blocks - offset[:, None]).T:
        a, b = g.copy(), column.astype(np.float32)
        for _ in range(GCD_STEPS):
            moving = b != 0
            if not moving.any():
                break
            r = np.zeros_like(b)
            r[moving] = np.fmod(a[moving], b[moving])
            a = np.where(moving, b, a)
            b = np.where(moving, r, b)
        settled &= b == 0
        g = a
    return np.where(settled, g, np.float32(0))


def _encode_blocks(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Codes, scales and offsets of ``blocks (B, b)``, each rebuilt exactly, or None: the
    specification of the native encoder (``twin_encode`` in ``csrc/twin_gemm.h``). A block's
    offset is its smallest value; its step the smallest gap above that divided by
    1..FIRST_DIVISORS, or failing that the smallest gap between its sorted values divided by
    1..DIVISORS, or failing that the gcd of its distances above the offset: the first step
    whose codes fit a byte and rebuild every value wins."""
    offset = blocks.min(axis=1)  # (B,)
    codes = np.zeros(blocks.shape, np.uint8)
    scale = np.zeros(blocks.shape[0], np.float32)
    todo = np.arange(blocks.shape[0])
    for stage, divisors in (("first", FIRST_DIVISORS), ("sorted", DIVISORS), ("gcd", 1)):
        rows = blocks[todo]
        gaps = (_first_gaps(rows, offset[todo]) if stage == "first" else
                _sorted_gaps(rows) if stage == "sorted" else _gap_gcd(rows, offset[todo]))
        for divisor in range(1, divisors + 1):
            step = (gaps / np.float32(divisor)).astype(np.float32)
            with np.errstate(invalid="ignore", divide="ignore"):
                levels = np.rint((blocks[todo] - offset[todo, None]) / step[:, None])
            fits = np.all((levels >= 0) & (levels < LEVELS), axis=1) & (step > 0)
            guess = np.where(fits[:, None], levels, 0).astype(np.uint8)
            exact = fits & np.all(_rebuilt(guess, step, offset[todo]) == blocks[todo], axis=1)
            codes[todo[exact]], scale[todo[exact]] = guess[exact], step[exact]
            todo, gaps = todo[~exact], gaps[~exact]
            if todo.size == 0:
                return codes, scale, offset
    return None


def _checked(w: np.ndarray) -> np.ndarray:
    if not isinstance(w, np.ndarray) or w.ndim != 2 or w.dtype != np.float32:
        raise ArgumentError(f"encode_twin takes a float32 (n, k) numpy matrix, got "
                            f"{getattr(w, 'dtype', type(w).__name__)} {getattr(w, 'shape', '')}")
    return np.ascontiguousarray(w)


def encode_twin_reference(w: np.ndarray) -> Twin | None:
    """The twin of the float32 matrix ``w (n, k)`` (module docstring), or None, in numpy."""
    w = _checked(w)
    n, k = w.shape
    if n == 0 or k % min(BLOCKS) or not np.all(np.isfinite(w)):
        return None
    for block in BLOCKS:
        if k % block:
            continue
        parts = [_encode_blocks(w[r:r + _ROWS_PER_PASS].reshape(-1, block))
                 for r in range(0, n, _ROWS_PER_PASS)]
        if all(p is not None for p in parts):
            codes, scale, offset = (np.concatenate([p[i] for p in parts if p is not None])
                                    for i in range(3))
            return Twin(codes.reshape(n, k), scale.reshape(n, k // block),
                        offset.reshape(n, k // block), block)
    return None


def _encode_native(w: np.ndarray, block: int) -> Twin | None | bool:
    """The shim's encoder on ``w`` for ``block``: a twin, None (not a grid) or False (no
    encoder here)."""
    n, k = w.shape
    twin = Twin(np.empty((n, k), np.uint8), np.empty((n, k // block), np.float32),
                np.empty((n, k // block), np.float32), block)
    failed = blas.twin_encode(_address(w), n, k, block, _address(twin.codes),
                              _address(twin.scale), _address(twin.offset))
    if failed is None:
        return False
    return twin if failed == 0 else None


def encode_twin(w: np.ndarray, *, use_kernel: bool = True) -> Twin | None:
    """The twin of the float32 matrix ``w (n, k)``, or None: the shim's encoder where it runs
    (``use_kernel``), else :func:`encode_twin_reference` (the same twins)."""
    w = _checked(w)
    n, k = w.shape
    if not use_kernel or n == 0 or k % min(BLOCKS):
        return encode_twin_reference(w)
    for block in BLOCKS:
        if k % block:
            continue
        twin = _encode_native(w, block)
        if twin is False:
            return encode_twin_reference(w)
        if twin is not None:
            return twin  # type: ignore[return-value]
    return None


def rebuild(twin: Twin) -> np.ndarray:
    """The float32 matrix ``(n, k)`` the twin stands for."""
    n, k = twin.shape
    blocks = twin.codes.reshape(n, k // twin.block, twin.block)
    return _rebuilt(blocks, twin.scale, twin.offset).reshape(n, k)


def twin_matmul_reference(x: np.ndarray, twin: Twin) -> np.ndarray:
    """``x (m, k) @ w.T`` with ``w`` rebuilt from the twin (the kernel's specification)."""
    return np.asarray(x, np.float32) @ rebuild(twin).T


# --------------------------------------------------------------------------- the shim's table


def _address(array: np.ndarray) -> int:
    return int(array.ctypes.data)


@dataclass(frozen=True)
class _Entry:
    source: mx.array  # kept alive: its address is the shim's key
    host: np.ndarray  # the same buffer seen from numpy
    twin: Twin


_entries: dict[tuple[int, int, int], _Entry] = {}
_lock = threading.Lock()


def host_matrix(array: mx.array) -> np.ndarray:
    """``array``'s own buffer as a numpy view (no copy), after checking it is one."""
    if not isinstance(array, mx.array) or array.ndim != 2 or array.dtype != mx.float32:
        raise ArgumentError(f"twins are for float32 (n, k) MLX arrays, got "
                            f"{getattr(array, 'dtype', type(array).__name__)}")
    mx.eval(array)
    host = np.asarray(array)
    if not host.flags["C_CONTIGUOUS"] or host.flags["OWNDATA"]:
        raise ArgumentError("the array's buffer is not one contiguous matrix")
    return host


def _check_layout(twin: Twin, shape: tuple[int, ...]) -> None:
    """The twin's arrays are what the kernel reads: C-contiguous, of its dtypes and shapes."""
    n, k = shape
    parts = ((twin.codes, np.uint8, (n, k)),
             (twin.scale, np.float32, (n, k // twin.block) if twin.block else None),
             (twin.offset, np.float32, (n, k // twin.block) if twin.block else None))
    if twin.block not in BLOCKS or k % twin.block or any(
            not isinstance(a, np.ndarray) or a.dtype != dtype or a.shape != want
            or not a.flags["C_CONTIGUOUS"] for a, dtype, want in parts):
        raise ArgumentError(f"the twin's arrays do not lay out a ({n}, {k}) matrix in blocks of "
                            f"{twin.block} (uint8 codes, float32 scales and offsets, C order)")


def _register(array: mx.array, host: np.ndarray, twin: Twin) -> bool:
    _check_layout(twin, host.shape)
    n, k = host.shape
    key = (_address(host), n, k)
    with _lock:
        if not blas.twin_register(key[0], n, k, twin.block, _address(twin.codes),
                                  _address(twin.scale), _address(twin.offset)):
            return False
        _entries[key] = _Entry(array, host, twin)
    return True


def register(array: mx.array, twin: Twin, *, check: bool = True) -> bool:
    """Let products against ``array`` (float32 ``(n, k)``) read ``twin``, which must rebuild it
    exactly (checked here unless ``check`` is False: a twin :func:`encode_twin` just built from
    this array was checked element by element as it was built); False when the shim cannot take
    it (not loaded, table full)."""
    host = host_matrix(array)
    if twin.shape != host.shape or (check and not np.array_equal(rebuild(twin), host)):
        raise ArgumentError("the twin does not rebuild the array it is registered for")
    return _register(array, host, twin)


def _first_row(host: np.ndarray, key: tuple[int, int, int]) -> int | None:
    """The row of the registered matrix ``key`` where ``host``'s rows begin, when ``host`` is
    whole rows of its buffer; else None."""
    address, rows, k = key
    n, width = host.shape
    start = _address(host) - address
    if width != k or start % (k * 4):
        return None
    r0 = start // (k * 4)
    return r0 if 0 <= r0 <= rows - n else None


def register_view(view: mx.array, parent: mx.array | None = None) -> bool:
    """Register ``view``, whole rows of a registered matrix's buffer (a row slice; of ``parent``
    when given, else of any registered matrix), as a view of that matrix's twin (shared codes);
    False when it is no such slice."""
    host = host_matrix(view)
    if parent is not None:
        whole = host_matrix(parent)
        keys = [(_address(whole), *whole.shape)]
    else:
        keys = list(_entries)
    for key in keys:
        entry, r0 = _entries.get(key), _first_row(host, key)
        if entry is not None and r0 is not None:
            t, n = entry.twin, host.shape[0]
            sub = Twin(t.codes[r0:r0 + n], t.scale[r0:r0 + n], t.offset[r0:r0 + n], t.block)
            return _register(view, host, sub)
    return False


def unregister(array: mx.array) -> bool:
    """Stop reading the twin of ``array``; whether it had one. Returns after any product reading
    it has finished."""
    host = np.asarray(array)
    return unregister_key((_address(host), *host.shape))


def unregister_key(key: tuple[int, int, int]) -> bool:
    """:func:`unregister` by ``(address, n, k)``, as :func:`registered_key` gives it."""
    with _lock:
        if key not in _entries:
            return False
        blas.twin_unregister(*key)
        del _entries[key]
    return True


def registered_key(array: mx.array) -> tuple[int, int, int] | None:
    """The table's key of ``array`` when it has a registered twin, else None."""
    host = np.asarray(array)
    key = (_address(host), *host.shape)
    return key if key in _entries else None
