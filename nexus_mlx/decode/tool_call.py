"""Generate one tool call: the tool name under the trie FSM, then its arguments under the schema.

Contract: ``generate_tool_call(model, tokenizer, cache, prompt_tokens, tools)`` continues a prompt
that ends with :data:`CALL_PREFIX` (``{"name": "``; :func:`tool_call_prompt` builds one) and
returns a :class:`ToolCallResult`. The generated text is always::

    {"name": "<one of the tools>", "arguments": {<JSON valid for that tool's input schema>}}

1. Name: with several candidate tools, a :class:`~.name_fsm.NameFSM` over their qualified names
   with terminator :data:`NAME_GLUE` (``", "arguments":``) masks every step; once one candidate is
   left, the rest of it is forced in its canonical tokenization (one batched forward, no
   sampling). With one candidate the name is forced outright: fed with the prompt, and with
   what the argument grammar forces first (``{"`` and a required key), in one pass.
2. Arguments: the tool's ``input_schema`` compiled by :func:`~.json_constraint.compile_schema`
   (optional leading space, then the JSON object, then the closing ``}``) drives a
   :class:`~.json_constraint.JsonConstraint`; tokens llguidance forces are fed without sampling.
   After ``max_argument_tokens`` argument tokens the decoder closes the JSON: it takes
   :meth:`~.json_constraint.JsonConstraint.closing_token` whenever that has a choice and asks
   the model only where it has none, for at most ``closing_budget`` more tokens; past half of
   them the placeholder guard is off (a value no continuation saves, such as a runaway
   ``"your-..."``, is finished and reported in ``errors`` rather than left open); output that
   still is not complete is reported (``complete=False``), not raised. With
   ``optional_margin`` > 0, wherever the arguments object may end or take another member, a
   sampled token that goes on must beat the best token that ends the object by that many nats
   (logits), else the ending is taken: a member past the required ones is added only when the
   model prefers it clearly (small models fill optional arguments with invented values). Other
   tokens (a value still being written) are untouched. The default,
   :data:`DEFAULT_OPTIONAL_MARGIN`, was chosen on GitHub MCP queries and held out on Seal-Tools
   (Qwen2.5-Coder-0.5B: call accuracy 0.38 -> 0.62 there); 0 turns it off.
3. Grounding (``ground_optional``, on by default, given ``quoted`` text): once the arguments
   are complete, an optional argument whose value that text does not support is dropped from
   ``result.arguments`` and listed in ``result.dropped`` (:mod:`~.grounding`; the API's default
   then applies). ``text`` and ``tokens`` stay what the model wrote.

``result.errors`` is empty when the arguments parse, validate against the schema (``jsonschema``)
and hold no placeholder text. With a ``strict``-compiled schema (every GitHub MCP and sampled
Seal-Tools schema) validity holds for every completed call by construction, and so does the
absence of placeholders unless the grammar itself leaves no other string (e.g. a ``maxLength``
that only fits ``"any"``), which ``errors`` then reports. The cache is advanced like ``generate_tokens`` leaves it: the prompt and every
token of ``result.tokens`` but the last. Greedy by default; ``sampler`` is mlx-lm's. Greedy
ids come from the model's certified head where it has one and can prove the id
(:mod:`~.certified_head`; ``result.certified_tokens`` counts them): the same call. In a call
most ids are forced by the grammar or drafted, so it saves little: per generated token on
Qwen2.5-0.5B, 0.97x [0.94, 1.03] (``results/certified_head_qwen_tool_call.json``).

Prompt format (:func:`tool_call_prompt`): the tokenizer's chat template (``models.tokenizer.chat_text``:
its plain transcript fallback when the tokenizer has none) with a system message
listing one compressed-IR signature per tool (``routing.ir.tool_signature``, e.g.
``create_repository(name: string, private?: boolean)``; descriptions as ``// ...`` only when
``ir_options`` asks for them) and :data:`SYSTEM_PROMPT`'s instruction, the user's request as the
user message, and the assistant turn opened with :data:`CALL_PREFIX`. The system message depends
only on the tools, so requests over the same tools share its KV prefix (prefill it once, fork the
cache, pass the rest as ``prompt_tokens``).
``style="native"`` (:func:`native_call_prompt`) is instead the model's own tool-calling prompt:
its template with the tools' full definitions, the call opened as ``<tool_call>`` then
:data:`CALL_PREFIX`; longer, and it keeps the arguments' descriptions.

It does not choose candidate tools (routing does), execute calls or parse free-form model text.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from nexus_mlx.decode.call_format import CALL_OPEN, renders_tools, textual_messages
from nexus_mlx.decode.certified_head import CertifiedHead, HeadRow, full_logits
from nexus_mlx.decode.generate import Sampler, cache_lookahead, greedy
from nexus_mlx.decode.grounding import grounded_arguments
from nexus_mlx.decode.json_constraint import JsonConstraint, compile_schema, ll_tokenizer
from nexus_mlx.decode.lookahead import DEFAULT_DRAFT_TOKENS
from nexus_mlx.decode.name_fsm import NameFSM, mask_logits, vocab_of
from nexus_mlx.decode.placeholders import check_arguments
from nexus_mlx.decode.restraint import DEFAULT_OPTIONAL_MARGIN, checked_margin, restrained
from nexus_mlx.errors import ArgumentError
from nexus_mlx.kv.cache import NexusCache
from nexus_mlx.models.forward import make_cache
from nexus_mlx.models.tokenizer import chat_text
from nexus_mlx.tools.ir import IROptions, tool_signature
from nexus_mlx.tools.tool import Tool

CALL_PREFIX = '{"name": "'
"""The assistant turn opens with this (part of the prompt)."""
NAME_GLUE = '", "arguments":'
"""What follows the tool name (the name FSM's terminator)."""
CALL_SUFFIX = "}"
"""Closes the call object after the arguments (part of the argument grammar)."""
SYSTEM_PROMPT = (
    "You are a function-calling assistant. Tools:\n{signatures}\n"
    "Answer with a JSON object naming the tool to call and its arguments. Copy names, owners, "
    "repositories, places and other values exactly as they appear in the user's request."
)
"""System message; ``{signatures}`` gets one IR signature per line."""
DEFAULT_IR = IROptions()
"""Signatures without descriptions (routing has already used them; shorter prompts)."""


@dataclass(frozen=True)
class ToolCallTimings:
    """Wall-clock seconds per stage (compile: schema -> grammar -> matcher; prefill: the first
    pass, the prompt and, with one candidate, the forced name and arguments' opening)."""

    prefill_s: float = 0.0
    name_s: float = 0.0
    compile_s: float = 0.0
    arguments_s: float = 0.0
    total_s: float = 0.0


@dataclass(frozen=True)
class MaskOverhead:
    """Host time spent building masks: per masked step, in microseconds."""

    name_us: tuple[float, ...] = ()
    arguments_us: tuple[float, ...] = ()

    @property
    def total_ms(self) -> float:
        return (sum(self.name_us) + sum(self.arguments_us)) / 1e3

    @property
    def median_us(self) -> float:
        both = self.name_us + self.arguments_us
        return float(np.median(both)) if both else 0.0


@dataclass(frozen=True)
class ToolCallResult:
    """One generated call. ``text`` is the whole call object, :data:`CALL_PREFIX` included."""

    name: str
    arguments: dict[str, Any]
    text: str
    tokens: tuple[int, ...]
    timings: ToolCallTimings
    mask_overhead: MaskOverhead
    mode: str = "strict"
    complete: bool = True
    sampled_tokens: int = 0
    errors: tuple[str, ...] = field(default_factory=tuple)
    dropped: dict[str, Any] = field(default_factory=dict)  # ungrounded optional arguments
    drafted_tokens: int = 0  # copied ids forwarded ahead of the decoder (lookahead)
    accepted_tokens: int = 0  # of them, the ones the decoder chose
    certified_tokens: int = 0  # ids the certified head picked without the full projection

    @property
    def valid(self) -> bool:
        """Complete, schema-valid and placeholder-free."""
        return self.complete and not self.errors


PROMPT_STYLES = ("ir", "native")


def tool_call_prompt(
    tokenizer: Any,
    request: str | Sequence[dict[str, str]],
    tools: Sequence[Tool],
    *,
    ir_options: IROptions = DEFAULT_IR,
    style: str = "ir",
) -> list[int]:
    """Token ids of the prompt described in the module docstring (``style="ir"``), or of the
    model's own tool-calling prompt (``"native"``: :func:`native_call_prompt`).

    ``request`` is the user's text, or chat messages (without a system message: ours is put
    first) whose last one is the user's."""
    if style not in PROMPT_STYLES:
        raise ArgumentError(f"unknown prompt style {style!r}; choose one of {PROMPT_STYLES}")
    if not tools:
        raise ArgumentError("a tool-call prompt needs at least one tool")
    if style == "native":
        return native_call_prompt(tokenizer, request, tools)
    signatures = "\n".join(tool_signature(t, ir_options) for t in tools)
    messages: list[dict[str, str]] = [
        {"role": "system", "content": SYSTEM_PROMPT.format(signatures=signatures)}
    ]
    if isinstance(request, str):
        messages.append({"role": "user", "content": request})
    else:
        messages.extend(dict(m) for m in request)
    text = chat_text(tokenizer, messages)
    return list(tokenizer.encode(text + CALL_PREFIX, add_special_tokens=False))


def native_call_prompt(
    tokenizer: Any, request: str | Sequence[dict[str, str]], tools: Sequence[Tool]
) -> list[int]:
    """The prompt the model was trained to call tools from: its chat template with each tool's
    full definition (name, description, JSON schema with the arguments' descriptions), the
    request, and the assistant turn opened as a call (:func:`opened_call_prompt`). Longer than
    the IR prompt; see ``bench/function_calling.py --prompt``."""
    functions = [{"type": "function", "function": {
        "name": t.qualified_name, "description": t.description,
        "parameters": dict(t.input_schema)}} for t in tools]
    messages = [{"role": "user", "content": request}] if isinstance(request, str) else request
    return opened_call_prompt(tokenizer, messages, functions)


def opened_call_prompt(tokenizer: Any, messages: Sequence[Mapping[str, Any]],
                       functions: Sequence[Mapping[str, Any]], *,
                       native: bool | None = None) -> list[int]:
    """Token ids of ``messages`` with ``functions`` (OpenAI-style tools) offered, the assistant
    turn opened as a call up to the name (``<tool_call>``, newline, :data:`CALL_PREFIX`). The
    chat template shows the tools where it can (``native``; probed when None), else they go in
    the system message (:func:`~.call_format.textual_messages`)."""
    msgs = [dict(m) for m in messages]
    if renders_tools(tokenizer) if native is None else native:
        text = tokenizer.apply_chat_template(msgs, tools=list(functions),
                                             add_generation_prompt=True, tokenize=False)
    else:
        text = chat_text(tokenizer, textual_messages(msgs, functions))
    return list(tokenizer.encode(f"{text}{CALL_OPEN}\n{CALL_PREFIX}", add_special_tokens=False))


def _sample(logits: mx.array, mask: mx.array, sampler: Sampler) -> int:
    row = mask_logits(logits[None], mask)  # (1, V)
    logprobs = row - mx.logsumexp(row, axis=-1, keepdims=True)
    token = sampler(logprobs)
    mx.eval(token)
    return int(cast(int, token.item()))


class _Stream:
    """The model side: tokens waiting to be forwarded, and the next token's row once they
    are. Tokens go through a :class:`~.lookahead.Lookahead`: where the output copies the
    prompt (a value quoted from the request), the copy is drafted and verified, several tokens
    per pass. With a certified ``head`` (greedy decoding), rows are head rows: a masked step's
    greedy id comes from the head where it can prove it (``certified`` counts those), the full
    projection otherwise."""

    def __init__(self, model: nn.Module, cache: NexusCache, draft_tokens: int,
                 head: CertifiedHead | None) -> None:
        self.pending: list[int] = []
        self.row: HeadRow | mx.array | None = None
        self.lookahead = cache_lookahead(model, cache, draft_tokens, head)
        self.certified = 0
        self.first_pass_s = 0.0  # seconds of the first pass (the prompt's prefill)

    def push(self, tokens: Sequence[int]) -> None:
        self.pending.extend(int(t) for t in tokens)
        self.row = None if tokens else self.row

    def next_row(self) -> HeadRow | mx.array:
        """The row after every token pushed (logits ``(V,)`` or a head row)."""
        if self.pending:
            first, start = self.lookahead.stats.passes == 0, time.perf_counter()
            self.row = self.lookahead.feed(self.pending)
            self.pending = []
            if first:
                self.first_pass_s = time.perf_counter() - start
        assert self.row is not None, "nothing pushed yet"
        return self.row

    def next_logits(self) -> mx.array:
        """Logits ``(V,)`` after every token pushed."""
        return full_logits(self.next_row())

    def choose(self, mask: np.ndarray, sampler: Sampler) -> int:
        """The next id among ``mask``'s: certified by the head when it can, else sampled."""
        row = self.next_row()
        if isinstance(row, HeadRow):
            token = row.best(mask)
            if token is not None:
                self.certified += 1
                return token
        return _sample(full_logits(row), mx.array(mask), sampler)

    def settle(self) -> None:
        """Forward every pending token but the last (the cache convention of the module) and
        drop unconfirmed drafts."""
        if len(self.pending) > 1:
            self.lookahead.feed(self.pending[:-1], draft=False)
        self.lookahead.close()
        self.pending = []


def _check_prompt(tokenizer: Any, prompt_tokens: Sequence[int]) -> None:
    tail = tokenizer.decode(list(prompt_tokens[-8:]))
    if not str(tail).endswith(CALL_PREFIX):
        raise ArgumentError(f"the prompt must end with {CALL_PREFIX!r} (tool_call_prompt builds "
                            f"one); it ends with {str(tail)[-24:]!r}")


def generate_tool_call(
    model: nn.Module,
    tokenizer: Any,
    cache: NexusCache | None,
    prompt_tokens: Sequence[int],
    tools: Sequence[Tool],
    *,
    sampler: Sampler | None = None,
    max_argument_tokens: int = 160,
    closing_budget: int = 96,
    guard_placeholders: bool = True,
    optional_margin: float = DEFAULT_OPTIONAL_MARGIN,
    quoted: str | None = None,
    ground_optional: bool = True,
    draft_tokens: int = DEFAULT_DRAFT_TOKENS,
    certified_head: bool = True,
) -> ToolCallResult:
    """Generate one call to one of ``tools`` after ``prompt_tokens`` (module docstring).
    ``quoted``: the text the call answers (the request, tool results): values found in it are
    never refused as placeholders (:mod:`~nexus_mlx.decode.placeholders`), and with
    ``ground_optional`` an optional argument it does not support is dropped from the call
    (:mod:`~nexus_mlx.decode.grounding`; reported in ``result.dropped``). ``draft_tokens``:
    ids drafted per pass where the call copies its prompt (:mod:`~nexus_mlx.decode.lookahead`;
    the call is the same, sooner; 0: one id per pass). ``certified_head``: greedy ids come
    from the model's certified head where it proves them (:mod:`~.certified_head`; the same
    call; off: every step projects in full)."""
    if not tools:
        raise ArgumentError("generate_tool_call needs at least one candidate tool")
    by_name = {t.qualified_name: t for t in tools}
    if len(by_name) != len(tools):
        raise ArgumentError(f"duplicate tool names among {[t.qualified_name for t in tools]}")
    optional_margin = checked_margin(optional_margin)
    if max_argument_tokens < 0 or closing_budget < 0:
        raise ArgumentError(f"token budgets must be >= 0, got {max_argument_tokens}, "
                            f"{closing_budget}")
    _check_prompt(tokenizer, prompt_tokens)
    sampler = sampler or greedy
    cache = cache if cache is not None else make_cache(model)
    vocab = vocab_of(tokenizer)
    head = CertifiedHead.of(model) if certified_head and sampler is greedy else None
    stream = _Stream(model, cache, draft_tokens, head)
    start = time.perf_counter()
    name_tokens: list[int] = []
    name_us: list[float] = []
    sampled = 0

    # -- name ------------------------------------------------------------------------------
    stream.push(prompt_tokens)
    if len(by_name) == 1:  # the name, and what the grammar forces next, go with the prompt
        name = next(iter(by_name))
        name_tokens = list(tokenizer.encode(name + NAME_GLUE, add_special_tokens=False))
        stream.push(name_tokens)
    else:
        fsm = NameFSM(list(by_name), vocab, terminator=NAME_GLUE)
        stream.next_row()
        while not fsm.is_complete():
            rest = fsm.remaining()
            if rest is not None:  # one candidate left: force its canonical tokens
                ids = list(tokenizer.encode(rest.decode("utf-8", "replace"),
                                            add_special_tokens=False))
                if fsm.accept_tokens(ids) == len(ids):
                    name_tokens += ids
                    stream.push(ids)
                    break
                fsm.reset()
                fsm.accept_tokens(name_tokens)
            t0 = time.perf_counter()
            allowed = fsm.allowed_mask()
            name_us.append((time.perf_counter() - t0) * 1e6)
            token = stream.choose(allowed, sampler)
            sampled += 1
            if not fsm.accept_token(token):
                raise AssertionError(f"sampler chose masked token {token}")
            name_tokens.append(token)
            stream.push([token])
        name = cast(str, fsm.matched_name())
    name_s = time.perf_counter() - start - stream.first_pass_s

    # -- arguments -------------------------------------------------------------------------
    t_compile = time.perf_counter()
    tool = by_name[name]
    compiled = compile_schema(tool.input_schema, leading_space=True, after=CALL_SUFFIX)
    constraint = JsonConstraint(compiled, vocab, guard_placeholders=guard_placeholders,
                                names=list(by_name), ll_tok=ll_tokenizer(tokenizer),
                                quoted=quoted)
    compile_s = time.perf_counter() - t_compile
    args_us: list[float] = []
    budget_sampled = 0
    while not constraint.is_complete() and len(constraint.tokens) < (
        max_argument_tokens + closing_budget + 64
    ):
        forced = constraint.forced_tokens()
        if forced:
            n = constraint.accept_tokens(forced)
            stream.push(forced[:n])
            if n == len(forced):
                continue
        closing = budget_sampled >= max_argument_tokens
        if closing and budget_sampled >= max_argument_tokens + closing_budget:
            break
        if closing and constraint.guard and (
                budget_sampled >= max_argument_tokens + closing_budget // 2):
            constraint.release_guard()  # half the closing spent: finish even a placeholder
        t0 = time.perf_counter()
        token_or_none = constraint.closing_token() if closing else None
        if token_or_none is None:
            allowed = constraint.allowed_mask()
            choice = constraint.member_choice() if optional_margin > 0 else None
            args_us.append((time.perf_counter() - t0) * 1e6)
            if choice is None:
                token = stream.choose(allowed, sampler)
            else:  # the restraint weighs this step's member logits: the full projection
                logits = stream.next_logits()
                token = _sample(logits, mx.array(allowed), sampler)
                row = np.asarray(logits.astype(mx.float32))  # (V,)
                token = restrained(token, row, choice, optional_margin)
            sampled += 1
        else:
            token = token_or_none
        budget_sampled += 1
        if not constraint.accept_token(token):
            raise AssertionError(f"sampler chose masked token {token}")
        stream.push([token])
    stream.settle()
    total_s = time.perf_counter() - start

    complete = constraint.is_complete()
    arguments: dict[str, Any] = {}
    dropped: dict[str, Any] = {}
    errors: list[str] = []
    if complete:
        value = constraint.value()
        if isinstance(value, dict):
            arguments = value
            if ground_optional and quoted is not None:
                arguments, dropped = grounded_arguments(value, tool.input_schema, quoted)
                value = arguments
        errors = check_arguments(value, tool.input_schema, names=list(by_name), quoted=quoted)
    else:
        errors = [f"incomplete: no complete JSON within {max_argument_tokens} + "
                  f"{closing_budget} argument tokens"]
    tokens = tuple(name_tokens) + tuple(constraint.tokens)
    name_text = bytes(b"".join(vocab.token_bytes[t] for t in name_tokens)).decode("utf-8", "replace")
    text = CALL_PREFIX + name_text + constraint.text
    return ToolCallResult(
        name=name,
        arguments=arguments,
        text=text,
        tokens=tokens,
        timings=ToolCallTimings(stream.first_pass_s, name_s, compile_s,
                                total_s - stream.first_pass_s - name_s - compile_s, total_s),
        mask_overhead=MaskOverhead(tuple(name_us), tuple(args_us)),
        mode=compiled.mode,
        complete=complete,
        sampled_tokens=sampled,
        errors=tuple(errors),
        dropped=dropped,
        drafted_tokens=stream.lookahead.stats.drafted,
        accepted_tokens=stream.lookahead.stats.accepted,
        certified_tokens=stream.certified,
    )


def call_tool(
    model: nn.Module,
    tokenizer: Any,
    request: str | Sequence[dict[str, str]],
    tools: Sequence[Tool],
    *,
    ir_options: IROptions = DEFAULT_IR,
    style: str = "ir",
    **kwargs: Any,
) -> ToolCallResult:
    """:func:`tool_call_prompt` + :func:`generate_tool_call` on a fresh cache; the request is
    the ``quoted`` text unless one is given."""
    prompt = tool_call_prompt(tokenizer, request, tools, ir_options=ir_options, style=style)
    kwargs.setdefault("quoted", quoted_text(request))
    return generate_tool_call(model, tokenizer, None, prompt, tools, **kwargs)


def quoted_text(request: str | Sequence[Mapping[str, Any]]) -> str:
    """The text a call's values may quote: the request, or every non-system message's string
    content, one per line."""
    if isinstance(request, str):
        return request
    return "\n".join(str(m.get("content") or "") for m in request
                     if m.get("role") != "system" and isinstance(m.get("content"), str))


def describe(result: ToolCallResult) -> str:
    """One line for logs: name, arguments, validity and timings."""
    args = json.dumps(result.arguments, ensure_ascii=False)
    state = "ok" if result.valid else f"errors={list(result.errors)}"
    return (f"{result.name}({args}) {state} mode={result.mode} "
            f"total={result.timings.total_s * 1e3:.0f} ms "
            f"mask={result.mask_overhead.median_us:.1f} us/step")
