"""A chat-completions request body, checked: a :class:`ChatRequest` or an :class:`ApiError`.

Contract: :func:`parse_chat_request` ``(body)`` checks every field of a decoded JSON body and
returns the request normalised, or the first problem as an :class:`ApiError` (HTTP 400, the
offending field in ``param``) — an expected rejection, so a return value. It accepts:

- ``model`` (a string; whether it is served is the app's check), ``messages``, ``tools``,
  ``tool_choice``, ``parallel_tool_calls`` (:mod:`.messages`);
- ``response_format``: ``text``, ``json_object`` or ``json_schema`` (``{"name", "schema",
  "strict"?, "description"?}``). With tools under ``tool_choice`` ``"auto"`` the reply is tool
  calls or content in the format, as the model chooses; a forced call has no content, so the
  format does not apply to its turn;
- ``stream`` and ``stream_options.include_usage``; ``max_tokens`` / ``max_completion_tokens``
  (the latter wins; both positive integers); ``temperature`` in [0, 2] (0 or absent: greedy),
  ``top_p`` in (0, 1] and ``seed`` (a 64-bit signed integer, as OpenAI's), which apply when
  sampling; ``stop``: a string or a list of up to 4. Stop strings end the reply's content,
  never a tool call (one written inside a call's text does not count); ``frequency_penalty``
  and ``presence_penalty`` in [-2, 2], ``logit_bias`` (token ids as decimal strings to biases in
  [-100, 100]), greedy or sampled (:func:`~.sampling.make_logits_processors`); ``logprobs``
  and ``top_logprobs`` (0 to 20; only with ``logprobs``); ``n`` (1 to 128): how many choices
  to generate for the conversation, one after another; ``prediction`` (``{"type": "content",
  "content": text or text parts}``): what the reply is expected to repeat, drafted and verified
  (:mod:`~nexus_mlx.decode.prediction`), so it changes the reply's speed, never its ids;
- fields OpenAI clients send that change nothing here (``user``, ``metadata``, ``store``,
  ``modalities: ["text"]``, ...). Any other field, or a value these cannot honour
  (``modalities: ["audio"]``), is refused by name rather than ignored.

It knows nothing about models, tokenizers, sessions or HTTP beyond the error body's shape.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nexus_mlx.agent.session_report import MAX_TOP_LOGPROBS
from nexus_mlx.errors import ArgumentError
from nexus_mlx.server.messages import NAME, check_messages, check_tool_choice, check_tools

MAX_STOP = 4
MAX_CHOICES = 128  # OpenAI's bound on n
SEED_MIN, SEED_MAX = -(1 << 63), (1 << 63) - 1  # OpenAI's range: a signed 64-bit integer
# fields that change nothing here, with the values that keep it so: those every OpenAI API
# has, then chat completions' own
SHARED_NO_OPS: dict[str, Callable[[Any], bool]] = {
    "user": lambda v: v is None or isinstance(v, str),
    "safety_identifier": lambda v: v is None or isinstance(v, str),
    "prompt_cache_key": lambda v: v is None or isinstance(v, str),  # the pool finds its cache
    "prompt_cache_retention": lambda v: v is None or isinstance(v, str),
    "metadata": lambda v: v is None or isinstance(v, dict),
    "store": lambda v: v in (None, False, True),
    "service_tier": lambda v: v is None or isinstance(v, str),
}
_NO_OPS: dict[str, Callable[[Any], bool]] = {
    **SHARED_NO_OPS,
    "modalities": lambda v: v is None or v == ["text"],
}


@dataclass(frozen=True)
class ApiError:
    """An OpenAI-style error answer."""

    status: int
    message: str
    param: str | None = None
    code: str | None = None
    type: str = "invalid_request_error"

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    response_format: dict[str, Any] | None = None  # None: plain text
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None  # None: the server's default, within the context
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    logprobs: bool = False
    top_logprobs: int = 0  # alternatives per id, with logprobs
    n: int = 1  # choices to generate
    prediction: str | None = None  # the predicted output's text
    prompt: str | tuple[int, ...] | None = None  # continued as is, no template (completions)
    score_prompt: bool = False  # also the raw prompt's own log probabilities (echo + logprobs)
    suffix: str = ""  # a raw prompt's suffix: fill in the middle (the model's FIM tokens)

    @property
    def calls_allowed(self) -> bool:
        """Whether the reply may hold tool calls."""
        return bool(self.tools) and self.tool_choice != "none"


def check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise ArgumentError(f"{name} must be a boolean, got {value!r}")
    return value


def check_positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ArgumentError(f"{name} must be a positive integer, got {value!r}")
    return value


def _number(value: Any, name: str, low: float, high: float, *, open_low: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ArgumentError(f"{name} must be a number, got {value!r}")
    if not (low < value <= high if open_low else low <= value <= high):
        bracket = "(" if open_low else "["
        raise ArgumentError(f"{name} must be in {bracket}{low:g}, {high:g}], got {value!r}")
    return float(value)


def _logit_bias(value: Any) -> dict[int, float]:
    """OpenAI's ``{"token id": bias}``: ids as decimal strings, biases in [-100, 100]. Whether
    the ids are in the vocabulary is the engine's check."""
    if not isinstance(value, Mapping):
        raise ArgumentError(f"logit_bias must be an object of token ids to biases, got "
                            f"{value!r:.80}")
    out = {}
    for key, bias in value.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit()):  # not '²', '٣'
            raise ArgumentError(f"logit_bias keys must be token ids (decimal strings), got "
                                f"{key!r:.40}")
        out[int(key)] = _number(bias, f"logit_bias[{key!r}]", -100.0, 100.0)
    return out


def check_top_logprobs(value: Any, name: str = "top_logprobs") -> int:
    if isinstance(value, bool) or not isinstance(value, int) \
            or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise ArgumentError(f"{name} must be an integer in [0, {MAX_TOP_LOGPROBS}], got "
                            f"{value!r}")
    return value


def _choices(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CHOICES:
        raise ArgumentError(f"n must be an integer in [1, {MAX_CHOICES}], got {value!r}")
    return value


def _prediction(value: Any) -> str:
    """OpenAI's ``{"type": "content", "content": text or [{"type": "text", "text"}]}``."""
    if not isinstance(value, Mapping) or value.get("type") != "content" \
            or set(value) - {"type", "content"}:
        raise ArgumentError(f"prediction must be {{'type': 'content', 'content': ...}}, got "
                            f"{value!r:.80}")
    content = value.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
            isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content):
        return "".join(p["text"] for p in content)
    raise ArgumentError(f"prediction.content must be text or a list of text parts, got "
                        f"{content!r:.80}")


def _seed(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentError(f"seed must be an integer, got {value!r}")
    if not SEED_MIN <= value <= SEED_MAX:
        raise ArgumentError(f"seed must be in [{SEED_MIN}, {SEED_MAX}], got {value!r}")
    return value


def _stop(value: Any) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or len(items) > MAX_STOP or not all(
            isinstance(s, str) and s for s in items):
        raise ArgumentError(f"stop must be a non-empty string or a list of up to {MAX_STOP} "
                            f"non-empty strings, got {value!r}")
    return tuple(items)


def _response_format(value: Any) -> dict[str, Any] | None:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        raise ArgumentError("response_format must be {'type': 'text'}, {'type': 'json_object'} "
                            "or {'type': 'json_schema', 'json_schema': {...}}")
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise ArgumentError("response_format.json_schema must be an object with 'name' and "
                            "'schema'")
    unknown = sorted(set(spec) - {"name", "schema", "strict", "description"})
    if unknown:
        raise ArgumentError(f"response_format.json_schema has unknown fields {unknown}")
    name = spec.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise ArgumentError(f"response_format.json_schema.name must match [A-Za-z0-9_-]{{1,64}}, "
                            f"got {name!r}")
    schema = spec.get("schema", {})
    if not isinstance(schema, (dict, bool)):
        raise ArgumentError("response_format.json_schema.schema must be a JSON Schema object")
    if not isinstance(spec.get("strict", False), (bool, type(None))):
        raise ArgumentError("response_format.json_schema.strict must be a boolean")
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


def _include_usage(value: Any) -> bool:
    if not isinstance(value, dict) or set(value) - {"include_usage", "include_obfuscation"}:
        raise ArgumentError("stream_options must be {'include_usage': bool}")
    return check_bool(value.get("include_usage", False), "stream_options.include_usage")


def _error(exc: ArgumentError, param: str) -> ApiError:
    return ApiError(400, str(exc), param)


def field_problem(body: Mapping[str, Any], known: set[str],
                  no_ops: Mapping[str, Callable[[Any], bool]],
                  why: Mapping[str, str] | None = None) -> ApiError | None:
    """A field ``body`` has that is not ``known``, or a value of a field that changes nothing
    here (``no_ops``: name -> whether the value keeps it so) that it cannot honour, as an
    error naming the field (``why``: the reason, by field); None when there is neither."""
    unknown = sorted(set(body) - known)
    if unknown:
        return ApiError(400, f"unrecognized request argument(s) {unknown}", unknown[0],
                        "unknown_parameter")
    for name, ok in no_ops.items():
        if name in body and not ok(body[name]):
            reason = (why or {}).get(name, "is not supported by this server")
            return ApiError(400, f"{name}={body[name]!r:.80} {reason}", name,
                            "unsupported_value")
    return None


Check = tuple[str, str, Callable[[Any], Any]]  # body field, request field, its check
SAMPLING_CHECKS: list[Check] = [  # what the completions APIs share: streaming and sampling
    ("stream", "stream", lambda v: check_bool(v, "stream")),
    ("stream_options", "include_usage", _include_usage),
    ("temperature", "temperature", lambda v: _number(v, "temperature", 0.0, 2.0)),
    ("top_p", "top_p", lambda v: _number(v, "top_p", 0.0, 1.0, open_low=True)),
    ("seed", "seed", _seed),
    ("stop", "stop", _stop),
    ("frequency_penalty", "frequency_penalty",
     lambda v: _number(v, "frequency_penalty", -2.0, 2.0)),
    ("presence_penalty", "presence_penalty",
     lambda v: _number(v, "presence_penalty", -2.0, 2.0)),
    ("logit_bias", "logit_bias", _logit_bias),
    ("n", "n", _choices),
]


def check_fields(body: Mapping[str, Any], checks: list[Check], values: dict[str, Any]
                 ) -> ApiError | None:
    """Check each field ``body`` has (null reads as absent: the default) into ``values``; the
    first problem, naming its field, or None."""
    for key, target, check in checks:
        if body.get(key) is None:
            continue
        try:
            values[target] = check(body[key])
        except ArgumentError as exc:
            return _error(exc, key)
    return None


def stream_options_problem(values: Mapping[str, Any]) -> ApiError | None:
    if "include_usage" in values and not values.get("stream"):
        return ApiError(400, "stream_options is only allowed when stream is true",
                        "stream_options")
    return None


def head_problem(body: Any, known: set[str], no_ops: Mapping[str, Callable[[Any], bool]],
                 required: str) -> ApiError | None:
    """What is wrong with a body before its fields are checked: not a JSON object, a field
    not ``known`` or a no-op it cannot honour (:func:`field_problem`), no ``model`` string, no
    ``required`` field (or a null one); None when nothing is."""
    if not isinstance(body, Mapping):
        return ApiError(400, "the request body must be a JSON object")
    problem = field_problem(body, known, no_ops)
    if problem is not None:
        return problem
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return ApiError(400, "you must provide a model parameter (a string)", "model",
                        "missing_required_parameter" if model is None else None)
    if body.get(required) is None:
        return ApiError(400, f"missing required parameter '{required}'", required,
                        "missing_required_parameter")
    return None


def parse_chat_request(body: Any) -> ChatRequest | ApiError:
    """The checked request, or the first problem (see the module docstring)."""
    known = {"model", "messages", "tools", "tool_choice", "parallel_tool_calls",
             "response_format", "stream", "stream_options", "max_tokens",
             "max_completion_tokens", "temperature", "top_p", "seed", "stop",
             "frequency_penalty", "presence_penalty", "logit_bias", "logprobs",
             "top_logprobs", "n", "prediction", *_NO_OPS}
    problem = head_problem(body, known, _NO_OPS, "messages")
    if problem is not None:
        return problem
    values: dict[str, Any] = {"model": body["model"]}
    checks: list[Check] = [
        ("messages", "messages", check_messages),
        ("tools", "tools", check_tools),
        ("parallel_tool_calls", "parallel_tool_calls",
         lambda v: check_bool(v, "parallel_tool_calls")),
        ("response_format", "response_format", _response_format),
        ("max_tokens", "max_tokens", lambda v: check_positive_int(v, "max_tokens")),
        ("max_completion_tokens", "max_completion_tokens",
         lambda v: check_positive_int(v, "max_completion_tokens")),
        ("logprobs", "logprobs", lambda v: check_bool(v, "logprobs")),
        ("top_logprobs", "top_logprobs", check_top_logprobs),
        ("prediction", "prediction", _prediction),
        *SAMPLING_CHECKS,
    ]
    problem = check_fields(body, checks, values)
    if problem is not None:
        return problem
    if "tool_choice" in body and body["tool_choice"] is not None:
        try:
            values["tool_choice"] = check_tool_choice(body["tool_choice"], values.get("tools", []))
        except ArgumentError as exc:
            return _error(exc, "tool_choice")
    if values.get("top_logprobs") and not values.get("logprobs"):
        return ApiError(400, "top_logprobs needs logprobs set to true", "top_logprobs")
    problem = stream_options_problem(values)
    if problem is not None:
        return problem
    completion = values.pop("max_completion_tokens", None)
    if completion is not None:
        values["max_tokens"] = completion
    return ChatRequest(**values)
