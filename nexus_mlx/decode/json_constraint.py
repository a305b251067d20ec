"""Schema-constrained JSON arguments: a tool's input schema compiled to an llguidance grammar.

Contract: ``compile_schema(schema)`` turns a JSON Schema into a :class:`CompiledSchema` (an
llguidance grammar, cached per schema and options); ``JsonConstraint(compiled, tokenizer)`` is one
matcher over it with ``allowed_mask() -> (V,) bool``, ``accept_token(id) -> bool`` (``False``
leaves the state unchanged), ``forced_tokens()``, ``is_complete()``, ``reset()`` and an mlx-lm
``logits_processor()``. Everything is torch-free: llguidance fills an int32 bitmask in numpy.

Output style is fixed (``{"a": 1, "b": [true, null]}``: ``", "`` and ``": "`` separators, no other
whitespace), which also bounds what a sampler can wander into. Compilation modes, tried in order:

1. ``strict``: the schema after :func:`prepare_schema` (objects that declare ``properties`` are
   *closed* with ``additionalProperties: false`` unless they say otherwise: a tool call should not
   invent parameters; required properties come first). It accepts a subset of the original, so
   every completed output parses and validates against the original schema.
2. ``lenient``: llguidance rejected a keyword or format (``not``, an unknown ``format``, ...); it
   is compiled with llguidance's ``lenient`` option, which ignores unsupported keywords. Output is
   well-formed JSON; the ignored keywords are checked afterwards by :func:`check_arguments`
   (``jsonschema``), and callers must look at its result.
3. ``any_object``: even that failed (too large, unresolvable ``$ref``): any JSON object, checked
   afterwards the same way. :attr:`CompiledSchema.notes` says why each fallback happened.
A schema that is not valid JSON Schema (per its meta-schema) raises :class:`ToolError`.

Placeholder guard: small models copy type names and template markers from the prompt into values
(``{"owner": "string"}``, ``"<value>"``). :class:`PlaceholderPolicy` defines them (the empty string;
a type spelling such as ``string``/``integer[]``/``string|null``; ``<...>``, ``{...}``, ``${...}``, ``%s``; ``...``,
``value``, ``placeholder``, ``todo``, ``tbd``, ``xxx``; ``your_...``; a value *echoing a prompt
name*: one of the schema's property names or a caller-given name such as the tool's, alone or as
``owner_name``/``owner_id``/``owner_value`` (digits may follow: ``owner_1``) or ``your_owner``/
``the_owner``, comparisons ignoring case,
spaces, ``_``, ``-`` and ``.``; a value starting with a caller-given name, e.g. a tool's). The
matcher bans any token that would *close* a string value as a placeholder or complete such a name
prefix, unless the schema names that string (``enum``/``const``/``default``/``examples``) or
the grammar leaves no other choice, and :func:`find_placeholders` re-checks a finished value.
Given ``quoted`` (the text the call answers), a value found in it is never a placeholder: the
user's own words (a comment ``"Your fix works"``) are not refused.
Keys are never judged (closed objects only allow declared ones).

It does not sample, run models or know about prompts (:mod:`.tool_call`).
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal, cast

import jsonschema
import llguidance
import llguidance.numpy
import mlx.core as mx
import numpy as np

from nexus_mlx.decode.json_scan import JsonScanner, decode_json_string, ids_with_prefix, quote_ids
from nexus_mlx.decode.name_fsm import (
    TokenVocab,
    backend_tokenizer,
    history_tracker,
    mask_logits,
    vocab_of,
)
from nexus_mlx.decode.placeholders import PlaceholderPolicy
from nexus_mlx.decode.restraint import member_ids
from nexus_mlx.errors import ToolError

Mode = Literal["strict", "lenient", "any_object"]
JSON_STYLE: dict[str, Any] = {
    "whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ",
}
_COMBINERS = ("allOf", "anyOf", "oneOf", "$ref", "not", "if", "then", "else")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")


# ----------------------------------------------------------------------------- compile


def prepare_schema(schema: Any, *, closed: bool = True, required_first: bool = True) -> Any:
    """A copy of ``schema`` shaped for tool calls; it accepts a subset of what ``schema`` does.

    ``closed``: object schemas declaring ``properties`` get ``additionalProperties: false``,
    except those that already set ``additionalProperties``/``patternProperties``/
    ``unevaluatedProperties``, that combine ``properties`` with ``allOf``/``anyOf``/``$ref``/...
    (closing one branch would reject the others' keys) or whose ``required`` names an undeclared
    property. ``required_first``: ``properties`` are reordered required first, then optional,
    each group in schema order (llguidance emits properties in map order; this matches the IR
    signature and lets a model stop after the required ones). Nothing under ``allOf``/``not``/
    ``if`` is changed."""
    if not isinstance(schema, Mapping):
        return schema
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), Mapping):
            out[key] = {k: prepare_schema(v, closed=closed, required_first=required_first)
                        for k, v in out[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [prepare_schema(v, closed=closed, required_first=required_first)
                        for v in out[key]]
    for key in ("items", "additionalProperties", "contains"):
        if isinstance(out.get(key), Mapping):
            out[key] = prepare_schema(out[key], closed=closed, required_first=required_first)
    props = out.get("properties")
    required = out.get("required", [])
    if not isinstance(props, Mapping) or not isinstance(required, list):
        return out
    if required_first:
        first = [k for k in props if k in required]
        out["properties"] = {k: props[k] for k in [*first, *(k for k in props if k not in first)]}
    open_keys = ("additionalProperties", "patternProperties", "unevaluatedProperties")
    if (
        closed
        and not any(k in out for k in open_keys)
        and not any(k in out for k in _COMBINERS)
        and all(r in props for r in required)
    ):
        out["additionalProperties"] = False
    return out


@dataclass(frozen=True)
class CompiledSchema:
    """An llguidance grammar for ``schema`` (see the module docstring for ``mode``)."""

    schema: Mapping[str, Any] | bool
    grammar: str
    mode: Mode
    notes: tuple[str, ...] = ()
    leading_space: bool = False
    after: str = ""

    @property
    def exact(self) -> bool:
        """Every completed output validates by construction (``strict`` mode)."""
        return self.mode == "strict"


def _lark(schema: Any, options: dict[str, Any], leading_space: bool, after: str) -> str:
    body = dict(schema) if isinstance(schema, Mapping) else schema
    if isinstance(body, dict):
        body["x-guidance"] = options
    lead = '" "? ' if leading_space else ""
    tail = f" {json.dumps(after)}" if after else ""
    return f"start: {lead}args{tail}\nargs: %json {json.dumps(body)}\n"


def _check(grammar: str) -> str | None:
    """llguidance's error for ``grammar`` (warnings count: they mean ignored keywords), or None."""
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error or messages:
        return "; ".join(messages) or "rejected"
    return None


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else "rejected"


@lru_cache(maxsize=512)
def _compile_cached(
    text: str, closed: bool, required_first: bool, leading_space: bool, after: str
) -> CompiledSchema:
    schema = json.loads(text)
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "<root>"
        raise ToolError(f"invalid JSON Schema at {where}: {exc.message}") from None
    target = prepare_schema(schema, closed=closed, required_first=required_first)
    notes: list[str] = []
    grammar = _lark(target, JSON_STYLE, leading_space, after)
    problem = _check(grammar)
    if problem is None:
        return CompiledSchema(schema, grammar, "strict", (), leading_space, after)
    notes.append(f"strict: {_first_line(problem)}")
    grammar = _lark(target, {**JSON_STYLE, "lenient": True}, leading_space, after)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if not is_error:
        notes.extend(f"lenient: {_first_line(m)}" for m in messages)
        return CompiledSchema(schema, grammar, "lenient", tuple(notes), leading_space, after)
    notes.append(f"lenient: {_first_line('; '.join(messages))}")
    grammar = _lark({"type": "object"}, JSON_STYLE, leading_space, after)
    return CompiledSchema(schema, grammar, "any_object", tuple(notes), leading_space, after)


def compile_schema(
    schema: Mapping[str, Any] | bool,
    *,
    closed: bool = True,
    required_first: bool = True,
    leading_space: bool = False,
    after: str = "",
) -> CompiledSchema:
    """Compile ``schema`` (strict, else lenient, else any object; cached).

    ``leading_space`` allows one optional space before the JSON (after ``"arguments":`` the
    canonical tokenization merges it into the opening ``{``); ``after`` is literal text required
    after it (``"}"`` to close an enclosing object). ``closed`` and ``required_first`` go to
    :func:`prepare_schema`."""
    if not isinstance(schema, (Mapping, bool)):
        raise ToolError(f"a schema must be an object or a boolean, got {schema!r:.60}")
    try:
        text = json.dumps(schema, sort_keys=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ToolError(f"schema is not JSON data: {exc}") from None
    return _compile_cached(text, bool(closed), bool(required_first), bool(leading_space),
                           str(after))


_LL_TOKENIZERS: weakref.WeakKeyDictionary[Any, llguidance.LLTokenizer] = (
    weakref.WeakKeyDictionary()
)


def ll_tokenizer(tokenizer: Any) -> llguidance.LLTokenizer:
    """An ``llguidance.LLTokenizer`` over the ``tokenizers`` backend of ``tokenizer`` (~1 s to
    build; cached per tokenizer object). End-of-sequence ids come from the tokenizer."""
    if isinstance(tokenizer, llguidance.LLTokenizer):
        return tokenizer
    try:
        return _LL_TOKENIZERS[tokenizer]
    except (KeyError, TypeError):
        pass
    eos = list(vocab_of(tokenizer).eos_ids) or None
    built = llguidance.LLTokenizer(backend_tokenizer(tokenizer).to_str(), eos_token=eos)
    try:
        _LL_TOKENIZERS[tokenizer] = built
    except TypeError:
        pass
    return built


# ----------------------------------------------------------------------------- matcher


@dataclass
class MaskStats:
    """Time spent computing masks (seconds per call), for overhead reports."""

    seconds: list[float] = field(default_factory=list)


class JsonConstraint:
    """One generation under a :class:`CompiledSchema` (see the module docstring)."""

    def __init__(
        self,
        compiled: CompiledSchema,
        tokenizer: Any,
        *,
        guard_placeholders: bool = True,
        names: Iterable[str] = (),
        ll_tok: llguidance.LLTokenizer | None = None,
        quoted: str | None = None,
    ) -> None:
        self.compiled = compiled
        self.vocab = vocab_of(tokenizer)
        self.ll_tokenizer = ll_tok if ll_tok is not None else ll_tokenizer(tokenizer)
        if self.ll_tokenizer.vocab_size != self.vocab.size:
            raise ToolError(
                f"llguidance sees {self.ll_tokenizer.vocab_size} tokens, the tokenizer "
                f"{self.vocab.size}: they must be built from the same vocabulary")
        self.guard = guard_placeholders
        self.policy = PlaceholderPolicy(compiled.schema, names, quoted)
        self._matcher = llguidance.LLMatcher(self.ll_tokenizer, compiled.grammar, log_level=0)
        if self._matcher.is_error():
            raise ToolError(f"llguidance: {self._matcher.get_error()}")
        self._bits = np.zeros((1, (self.vocab.size + 31) // 32), dtype=np.int32)
        self.reset()

    def reset(self) -> None:
        """Back to the start of the grammar."""
        self._matcher.reset()
        self._scanner = JsonScanner()
        self._mask: np.ndarray | None = None
        self._text = bytearray()
        self.tokens: list[int] = []

    # -- state -----------------------------------------------------------------------------
    def is_complete(self) -> bool:
        """The grammar is finished: nothing but end-of-sequence could follow."""
        return bool(self._matcher.is_stopped())

    def can_stop(self) -> bool:
        """The text so far is a complete match (more may still be allowed)."""
        return bool(self._matcher.is_accepting())

    @property
    def text(self) -> str:
        """Everything accepted so far, decoded (invalid UTF-8 replaced)."""
        return self._text.decode("utf-8", errors="replace")

    def json_text(self) -> str:
        """The JSON part of :attr:`text` (without the optional leading space and ``after``)."""
        text = self.text
        if self.compiled.after and text.endswith(self.compiled.after):
            text = text[: -len(self.compiled.after)]
        return text[1:] if self.compiled.leading_space and text.startswith(" ") else text

    def value(self) -> Any:
        """The parsed JSON value (``json.JSONDecodeError`` while incomplete)."""
        return json.loads(self.json_text())

    # -- masks -----------------------------------------------------------------------------
    def _spoils(self, token: int, before: str | None) -> bool:
        """Whether ``token`` closes a placeholder value or makes an open value start with a
        caller name it did not start with (``before``: the open value, if any)."""
        policy = self.policy
        twin = self._scanner.copy()
        for raw, key in twin.feed(self.vocab.token_bytes[token]):
            value = decode_json_string(raw)
            if value is not None and policy.is_placeholder(value, key):
                return True
        if twin.in_value_string and policy.names:
            after = decode_json_string(bytes(twin.raw))
            started = [n for n in policy.names if after is not None and after.startswith(n)]
            return any(before is None or not before.startswith(n) for n in started)
        return False

    def _open_value(self) -> str | None:
        scan = self._scanner
        return decode_json_string(bytes(scan.raw)) if scan.in_value_string else None

    def _banned(self, mask: np.ndarray) -> np.ndarray | None:
        """The allowed ids :meth:`_spoils` rejects: quote-bearing tokens, and inside a string
        value the tokens completing a caller-name prefix (looked up, not simulated)."""
        if not self.guard:
            return None
        scan = self._scanner
        quotes, single, tails, heads = quote_ids(self.vocab)
        keep = mask[quotes]
        content = self._open_value()
        plain = content is not None and not scan.escape
        banned: list[int] = []
        if plain or (scan.in_string and scan.is_key and not scan.escape):
            # a single quote just closes the open string: judge content + the bytes before it
            keep &= ~single
            if plain and self.policy.may_become(cast(str, content), scan.key):
                raw, verdicts = bytes(scan.raw), {}
                for index in np.flatnonzero(mask[quotes] & single).tolist():
                    tail = tails[index]
                    if tail not in verdicts:
                        value = decode_json_string(raw + tail)
                        verdicts[tail] = value is not None and self.policy.is_placeholder(
                            value, scan.key)
                    if verdicts[tail]:
                        banned.append(int(quotes[index]))
        elif not scan.in_string:
            # a single quote only opens a string: it spoils nothing unless what follows the
            # quote already starts with a caller name
            keep &= ~single
            names = tuple(n.encode("utf-8") for n in self.policy.names)
            if names:
                for index in np.flatnonzero(mask[quotes] & single).tolist():
                    if heads[index].startswith(names):
                        banned.append(int(quotes[index]))
        banned.extend(t for t in quotes[keep].tolist() if self._spoils(t, content))
        if plain:
            for rest in self.policy.name_rests(cast(str, content)):
                ids = ids_with_prefix(self.vocab, rest)
                banned.extend(ids[mask[ids]].tolist())
        return np.array(banned, dtype=np.int64) if banned else None

    def release_guard(self) -> None:
        """Turn the placeholder guard off from here on (a decoder that must close the JSON
        within a budget: a placeholder it cannot otherwise close is better finished and
        reported by :func:`find_placeholders` than left open)."""
        self.guard = False
        self._mask = None

    def allowed_mask(self) -> np.ndarray:
        """``(V,)`` bool of the tokens the grammar (and the placeholder guard) allow next.

        Cached until the next accepted token; do not modify it."""
        if self._mask is not None:
            return self._mask
        llguidance.numpy.fill_next_token_bitmask(self._matcher, self._bits)
        bits = np.unpackbits(self._bits.view(np.uint8), count=self.vocab.size, bitorder="little")
        mask = bits.view(bool)
        banned = self._banned(mask)
        if banned is not None:
            guarded = mask.copy()
            guarded[banned] = False
            if guarded.any():  # if the grammar forces the placeholder, it is the schema's value
                mask = guarded
        mask.flags.writeable = False
        self._mask = mask
        return mask

    def forced_tokens(self) -> list[int]:
        """Tokens the grammar forces next (llguidance fast-forward; may be empty)."""
        if self.is_complete():
            return []
        return [int(t) for t in self._matcher.compute_ff_tokens()]

    # -- transitions -----------------------------------------------------------------------
    def accept_token(self, token: int) -> bool:
        """Advance by ``token``; ``False`` (state unchanged) when it is not allowed."""
        token = int(token)
        if not 0 <= token < self.vocab.size or not self.allowed_mask()[token]:
            return False
        if not self._matcher.consume_token(token):  # cannot happen after the mask check
            raise AssertionError(f"llguidance refused allowed token {token}: "
                                 f"{self._matcher.get_error()}")
        data = self.vocab.token_bytes[token]
        self._scanner.feed(data)
        self._text += data
        self.tokens.append(token)
        self._mask = None
        return True

    def accept_tokens(self, tokens: list[int]) -> int:
        """Accept tokens in order until one is rejected; returns how many were accepted."""
        for n, token in enumerate(tokens):
            if not self.accept_token(token):
                return n
        return len(tokens)

    def member_choice(self, depth: int = 1) -> tuple[np.ndarray, np.ndarray] | None:
        """Where the object ``depth`` levels down (1: the top-level object; 2: an object that
        is a member of it, e.g. a call's ``arguments``), innermost now, may both end and take
        another member: the allowed ids that end it (text ``}``, or ``"}`` closing its last
        string value) and those that go on (``,`` or a key's ``"``; ``",`` from inside the last
        value), each non-empty; else None. For restraint on optional arguments
        (:func:`~.restraint.restrained`)."""
        scanner = self._scanner
        if scanner.kinds != ["o"] * depth or scanner.escape:
            return None
        if scanner.in_string and scanner.is_key:
            return None
        mask = self.allowed_mask()
        ends, goes_on = member_ids(self.vocab, scanner.in_string)
        ends, goes_on = ends[mask[ends]], goes_on[mask[goes_on]]
        return (ends, goes_on) if ends.size and goes_on.size else None

    def closing_token(self) -> int | None:
        """An allowed token that heads for completion, else ``None``.

        Used to finish within a token budget: inside a string, close it (:data:`CLOSE_IN_STRING`);
        elsewhere close containers, separate, then the shortest literals (:data:`CLOSE_OUTSIDE`),
        never opening a container."""
        mask = self.allowed_mask()
        for token in _closer_ids(self.vocab, self._scanner.in_string):
            if mask[token]:
                return token
        return None

    def logits_processor(self) -> Callable[[mx.array, mx.array], mx.array]:
        """An mlx-lm logits processor (same protocol as ``NameFSM.logits_processor``)."""
        new_tokens = history_tracker()

        def process(tokens: mx.array, logits: mx.array) -> mx.array:
            for token in new_tokens(tokens):
                self.accept_token(token)
            if self.is_complete():  # only end-of-sequence remains
                only = np.zeros(self.vocab.size, dtype=bool)
                only[list(self.vocab.eos_ids)] = True
                return mask_logits(logits, mx.array(only))
            return mask_logits(logits, mx.array(self.allowed_mask()))

        return process


CLOSE_IN_STRING = ('"}', '"]', '"', '",', "a", "0")
"""Texts :meth:`JsonConstraint.closing_token` prefers inside a string, in order. A letter comes
before a digit: when the placeholder guard forbids closing an echo such as ``"owner"``, digits
would keep it an echo (``"owner00"``) while a letter ends the echo and lets the string close."""
CLOSE_OUTSIDE = ("}", "]", ",", '"', "0", "1", "true", "false", "null", ":")
"""Texts :meth:`JsonConstraint.closing_token` prefers outside strings, in order."""


@lru_cache(maxsize=8)
def _closer_ids(vocab: TokenVocab, in_string: bool) -> tuple[int, ...]:
    out: list[int] = []
    for text in CLOSE_IN_STRING if in_string else CLOSE_OUTSIDE:
        ids = vocab.by_bytes.get(text.encode("utf-8"), ())
        out.extend(ids[:1])
    return tuple(out)
