"""Rotary position embeddings at arbitrary positions, and re-anchoring of rotated keys.

Contract:
- :class:`RopeSpec` is a frozen description of one RoPE regime (rotated dims, base, linear scale,
  interleaving, scaling type and parameters). ``fingerprint()`` hashes it; ``validate(other)``
  raises :class:`ModelMismatchError` naming every differing field.
- :func:`apply_rope` rotates ``x (B, H, T, D)`` so that token ``t`` sits at ``positions[t]``; the
  positions may be any integers (non-contiguous, unsorted, repeated).
- :func:`reanchor` rotates already-rotated rows by the same ``delta``: for every spec,
  ``reanchor(apply_rope(x, p), d) == apply_rope(x, p + d)`` up to float32 rounding.

Angles are computed in float64 on the host and only the cos/sin tables are cast to the compute
dtype. ``mx.fast.rope`` forms ``position * frequency`` in float32, whose rounding (~1e-4 rad at
position 4,000) would make re-anchoring inexact. With explicit tables the *angles* compose
exactly: re-anchoring a key stored at ``p`` by ``d`` turns it by exactly the angle that separates
``p`` from ``p + d``, so one re-anchor is within one float32 rotation's rounding (about an ulp
of the key) of a fresh rotation at ``p + d``, whatever ``p`` and ``d``. The rotated *values* do
not compose exactly: every ``reanchor`` of already rotated float32 keys rounds again, so ``n``
successive re-anchors of the same keys (e.g. repeated cache shifts) drift by up to about
``n * 2**-22 * max|x|``. Re-anchor once from the stored anchor (a compiled block's ``m0``) to
stay within one rounding.
The scaling variants follow the formulas mlx-lm implements (default, linear, llama3, yarn,
longrope, proportional). Dynamic NTK is rejected: its frequencies depend on the sequence length,
so a cached key has no single well-defined rotation.

This module does not know about models, caches or layers.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any

import mlx.core as mx
import numpy as np

from nexus_mlx.errors import ModelFormatError, ModelMismatchError, PositionError

SUPPORTED_SCALING = ("default", "linear", "llama3", "yarn", "longrope", "proportional")
_SCALING_ALIASES = {"mrope": "default", "deepseek_yarn": "yarn", "su": "longrope"}


def _freeze(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, float | int) and not isinstance(value, bool):
        return float(value)
    return value


@dataclass(frozen=True)
class RopeSpec:
    """One RoPE regime. ``dims`` is the number of rotated features per head (the rest pass
    through); ``head_dim`` the full head width."""

    head_dim: int
    dims: int
    base: float
    traditional: bool = False
    scaling_type: str = "default"
    scaling: tuple[tuple[str, Any], ...] = ()
    max_position_embeddings: int | None = None

    def __post_init__(self) -> None:
        if self.dims <= 0 or self.dims % 2 or self.dims > self.head_dim:
            raise ModelFormatError(
                f"rotated dims {self.dims} must be even and in (0, head_dim={self.head_dim}]"
            )
        if self.scaling_type not in SUPPORTED_SCALING:
            raise ModelFormatError(
                f"RoPE scaling {self.scaling_type!r} is not supported at explicit positions; "
                f"supported: {SUPPORTED_SCALING}"
            )

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_config(
        cls,
        head_dim: int,
        base: float,
        traditional: bool = False,
        scaling_config: Mapping[str, Any] | None = None,
        max_position_embeddings: int | None = None,
        partial_rotary_factor: float = 1.0,
    ) -> RopeSpec:
        """Build a spec from HF/mlx-lm config values (``rope_theta``, ``rope_scaling``...)."""
        cfg = dict(scaling_config or {})
        kind = str(cfg.pop("type", None) or cfg.pop("rope_type", None) or "default")
        cfg.pop("rope_type", None)
        kind = _SCALING_ALIASES.get(kind, kind)
        if kind == "dynamic":
            raise ModelFormatError(
                "dynamic NTK RoPE depends on the sequence length, so keys cannot be placed at "
                "explicit positions or re-anchored"
            )
        dims = head_dim
        if kind == "proportional":
            dims = head_dim  # rotated width handled through infinite periods
        elif partial_rotary_factor != 1.0:
            dims = int(head_dim * partial_rotary_factor)
        keep = {k: _freeze(v) for k, v in cfg.items() if k != "rope_theta" and v is not None}
        return cls(
            head_dim=head_dim,
            dims=dims,
            base=float(base),
            traditional=bool(traditional),
            scaling_type=kind,
            scaling=tuple(sorted(keep.items())),
            max_position_embeddings=max_position_embeddings,
        )

    # ---- identity -----------------------------------------------------------------------
    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def fingerprint(self) -> str:
        """A short stable hash of every field (16 hex chars)."""
        blob = json.dumps(self.as_dict(), sort_keys=True, default=list).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def mismatches(self, other: RopeSpec) -> list[str]:
        """Human-readable ``field: mine != theirs`` for every differing field."""
        return [
            f"{f.name}: {getattr(self, f.name)!r} != {getattr(other, f.name)!r}"
            for f in fields(self)
            if getattr(self, f.name) != getattr(other, f.name)
        ]

    def validate(self, other: RopeSpec) -> None:
        """Raise :class:`ModelMismatchError` listing every field where ``other`` differs."""
        diff = self.mismatches(other)
        if diff:
            raise ModelMismatchError("RoPE specs differ: " + "; ".join(diff))

    # ---- derived frequencies ------------------------------------------------------------
    def _param(self, key: str, default: Any = None) -> Any:
        return dict(self.scaling).get(key, default)

    @cached_property
    def inv_freq(self) -> np.ndarray:
        """Angular frequency per rotated pair, float64 ``(dims // 2,)``; angle = pos * inv_freq."""
        half = np.arange(0, self.dims, 2, dtype=np.float64)
        periods = self.base ** (half / self.dims)  # (dims/2,)
        kind = self.scaling_type
        if kind == "linear":
            periods = periods * float(self._param("factor"))
        elif kind == "llama3":
            periods = _llama3_periods(periods, dict(self.scaling))
        elif kind == "yarn":
            periods = _yarn_periods(self.dims, self.base, dict(self.scaling))
        elif kind == "longrope":
            periods = np.asarray(self._param("long_factor", 1.0), dtype=np.float64) * periods
        elif kind == "proportional":
            rotated = int(self.head_dim * float(self._param("partial_rotary_factor", 1.0)))
            exps = np.arange(0, rotated, 2, dtype=np.float64) / self.head_dim
            periods = np.concatenate(
                [float(self._param("factor", 1.0)) * self.base**exps,
                 np.full((self.head_dim - rotated) // 2, np.inf)]
            )
        return 1.0 / periods

    @cached_property
    def input_scale(self) -> float:
        """Factor applied to the rotated features before rotation (yarn / longrope mscale)."""
        if self.scaling_type == "yarn":
            factor = float(self._param("factor", 1.0))
            return _yarn_mscale(factor, float(self._param("mscale", 1.0))) / _yarn_mscale(
                factor, float(self._param("mscale_all_dim", 0.0))
            )
        if self.scaling_type == "longrope":
            orig = float(self._param("original_max_position_embeddings"))
            factor = (self.max_position_embeddings or orig) / orig
            if factor <= 1.0:
                return 1.0
            return math.sqrt(1 + math.log(factor) / math.log(orig))
        return 1.0


def _llama3_periods(periods: np.ndarray, cfg: dict[str, Any]) -> np.ndarray:
    factor = float(cfg["factor"])
    low = float(cfg.get("low_freq_factor", 1.0))
    high = float(cfg.get("high_freq_factor", 4.0))
    old_len = float(cfg.get("original_max_position_embeddings", 8192))
    wavelens = 2 * np.pi * periods
    scaled = np.where(wavelens > old_len / low, periods * factor, periods)
    medium = (wavelens > old_len / high) & (wavelens < old_len / low)
    smooth = (old_len / wavelens - low) / (high - low)
    smooth_periods = scaled / ((1 - smooth) / factor + smooth)
    return np.where(medium, smooth_periods, scaled)


def _yarn_mscale(scale: float, mscale: float) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_periods(dims: int, base: float, cfg: dict[str, Any]) -> np.ndarray:
    factor = float(cfg["factor"])
    orig = float(cfg.get("original_max_position_embeddings", 4096))
    beta_fast = float(cfg.get("beta_fast", 32))
    beta_slow = float(cfg.get("beta_slow", 1))

    def correction_dim(rotations: float) -> float:
        return dims * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high: float = min(math.ceil(correction_dim(beta_slow)), dims - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dims // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extra = base ** (np.arange(0, dims, 2, dtype=np.float64) / dims)
    inter = factor * extra
    mask = 1.0 - ramp
    return (inter * extra) / (inter * mask + extra * (1 - mask))


# ---- rotation ----------------------------------------------------------------------------
def rope_tables(positions: np.ndarray, spec: RopeSpec, dtype: mx.Dtype) -> tuple[mx.array, mx.array]:
    """cos and sin tables ``(T, dims // 2)`` for integer ``positions``, angles in float64."""
    pos = np.asarray(positions, dtype=np.float64).reshape(-1)
    angles = pos[:, None] * spec.inv_freq[None, :]  # (T, dims/2)
    return mx.array(np.cos(angles), dtype=dtype), mx.array(np.sin(angles), dtype=dtype)


def rotate(x: mx.array, cos: mx.array, sin: mx.array, spec: RopeSpec) -> mx.array:
    """Rotate the last axis of ``x (..., T, D)`` by tables ``(T, dims // 2)`` (no input scale)."""
    dims = spec.dims
    rot, rest = x[..., :dims], x[..., dims:]
    if spec.traditional:
        pairs = rot.reshape(*rot.shape[:-1], dims // 2, 2)
        a, b = pairs[..., 0], pairs[..., 1]
        out = mx.stack([a * cos - b * sin, b * cos + a * sin], axis=-1).reshape(rot.shape)
    else:
        a, b = rot[..., : dims // 2], rot[..., dims // 2 :]
        out = mx.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)
    if rest.shape[-1]:
        out = mx.concatenate([out, rest], axis=-1)
    return out


def apply_rope(x: mx.array, positions: np.ndarray | mx.array, spec: RopeSpec) -> mx.array:
    """Rotate ``x (B, H, T, D)`` so that token ``t`` is at absolute ``positions[t]``."""
    pos = np.asarray(positions).reshape(-1)
    if pos.shape[0] != x.shape[-2]:
        raise PositionError(f"{pos.shape[0]} positions for {x.shape[-2]} tokens")
    if spec.input_scale != 1.0:
        x = mx.concatenate([x[..., : spec.dims] * spec.input_scale, x[..., spec.dims :]], axis=-1)
    cos, sin = rope_tables(pos, spec, x.dtype)
    return rotate(x, cos, sin, spec)


def reanchor(keys: mx.array, delta: int, spec: RopeSpec) -> mx.array:
    """Move already-rotated key rows ``(..., T, D)`` by ``delta`` positions (any sign)."""
    if delta == 0:
        return keys
    cos, sin = rope_tables(np.array([delta]), spec, keys.dtype)  # (1, dims/2) broadcasts
    return rotate(keys, cos, sin, spec)
