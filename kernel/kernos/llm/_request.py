"""The canonical LLM request, its allowlisted parameters, and its hash.

A request is a model, a list of messages and parameters taken from
:data:`PARAMS` only.  Every other name (``api_key``, ``api_base``,
``base_url``, ``headers``, ``callbacks``, ``n`` ...) is refused with an error
that lists the allowed ones: strings that come from agent code are hostile,
and a parameter that changes where a call goes or who pays for it is the
runtime's to set, never the caller's.

Values are normalized (numbers to their JSON type, tuples to lists) and
checked by exact type.  ``max_tokens`` is always present: given, or
:data:`DEFAULT_MAX_TOKENS`, so that a call's cost is bounded before it is
made.  The canonical form is ``{"model", "messages", "params"}`` in
canonical JSON (``kernos.audit.canonical``: sorted keys, no whitespace), and
its SHA-256 is the request's hash, the key of its recording.  ``stream`` is
not part of it: a streamed answer is recorded whole, so a streamed and a
plain request for the same thing share one recording.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from kernos.audit.canonical import canonical, check_json, digest
from kernos.errors import EventError, InvalidGrant, LLMRequestInvalid
from kernos.llm.schema import check_schema

__all__ = ["DEFAULT_MAX_TOKENS", "MODEL_PATTERN", "PARAMS", "Request", "build_request"]

DEFAULT_MAX_TOKENS = 1024
"""``max_tokens`` when a request gives none: every call has a bounded completion."""
MAX_MESSAGES = 1000
MAX_TOOLS = 128
MAX_REQUEST_BYTES = 4 * 1024 * 1024
MODEL_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-/:@]{0,127}")
"""A model name as litellm spells it (``gpt-4o-mini``, ``anthropic/claude-3-5-haiku``)."""
ROLES = frozenset({"system", "user", "assistant", "tool"})
MESSAGE_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id"})
_TOOL_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_\-]{0,63}")

PARAMS: dict[str, str] = {
    "temperature": "a number from 0 to 2",
    "top_p": "a number from 0 to 1",
    "max_tokens": "an int from 1 to 1,000,000: the most completion tokens",
    "stop": "a str, or a list of at most 4 str",
    "seed": "an int",
    "presence_penalty": "a number from -2 to 2",
    "frequency_penalty": "a number from -2 to 2",
    "tools": "a list of tools the model may call (names or function specs)",
    "tool_choice": "'none', 'auto', 'required' or {'type': 'function', ...}",
    "response_format": "a dict, such as {'type': 'json_object'}",
    "stream": "a bool: stream the answer (it is consumed and returned whole)",
    "mock_response": "a str or dict: litellm answers with it and calls no provider",
    "mock_tool_calls": "a list of tool calls for the mock answer",
}
"""The parameters a caller may set, and what each takes."""


@dataclass(frozen=True, kw_only=True)
class Request:
    """One LLM request, checked and normalized."""

    model: str
    """The model, as litellm names it."""
    messages: list[dict[str, Any]]
    """The conversation (plain JSON)."""
    params: dict[str, Any]
    """Allowlisted parameters, normalized; ``max_tokens`` always set, ``stream`` not here."""
    stream: bool = False
    """Whether the provider streams the answer (it is consumed and recorded whole)."""
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Tool name -> the argument schema, for checking the tool calls of the answer."""

    def canonical(self) -> dict[str, Any]:
        """What the hash covers (and what is stored as the request's recording)."""
        return {"model": self.model, "messages": self.messages, "params": self.params}

    @property
    def hash(self) -> str:
        """SHA-256 of the canonical JSON: equal requests, equal hashes, whatever the key order."""
        return digest(canonical(self.canonical()))

    @property
    def max_tokens(self) -> int:
        value: int = self.params["max_tokens"]
        return value

    def litellm_arguments(self) -> dict[str, Any]:
        """The keyword arguments of ``litellm.completion`` (no credentials: litellm reads them
        from the environment)."""
        return {"model": self.model, "messages": self.messages, **self.params,
                "stream": self.stream}


def build_request(model: object, messages: object, params: dict[str, object], *,
                  tools: list[dict[str, Any]] | None = None) -> Request:
    """Check and normalize a request; :class:`LLMRequestInvalid` names what is wrong.

    ``tools`` are function specs the caller resolved already (a runtime turns
    tool names into specs from its registry); ``params["tools"]`` may only
    hold specs here.
    """
    if type(model) is not str or not MODEL_PATTERN.fullmatch(model):
        raise LLMRequestInvalid(
            f"the model must be a str such as 'gpt-4o-mini' or 'anthropic/claude-3-5-haiku' "
            f"(letters, digits, '_.-/:@', at most 128), not {_shown(model)}")
    unknown = sorted(str(name)[:40] for name in params if name not in PARAMS)
    if unknown:
        raise LLMRequestInvalid(
            f"unknown LLM parameter{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
            f"the allowed ones are {', '.join(sorted(PARAMS))}. Credentials, endpoints and "
            "headers are set by the runtime from its environment, never by a request.")
    checked: dict[str, Any] = {}
    for name, value in params.items():
        if name in ("tools", "stream"):
            continue
        checked[name] = _check_param(name, value)
    checked.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
    stream = params.get("stream", False)
    if type(stream) is not bool:
        raise LLMRequestInvalid(f"stream must be a bool, not {_shown(stream)}")
    specs = list(tools or [])
    if "tools" in params:
        given = _plain(params["tools"], "tools")
        if type(given) is not list:
            raise LLMRequestInvalid(f"tools must be a list, not {_shown(given)}")
        specs += given
    schemas: dict[str, dict[str, Any]] = {}
    if specs:
        if len(specs) > MAX_TOOLS:
            raise LLMRequestInvalid(f"at most {MAX_TOOLS} tools may be offered in one call")
        checked["tools"] = [_check_tool(spec, schemas) for spec in specs]
    if "tool_choice" in checked and not specs:
        raise LLMRequestInvalid("tool_choice needs tools")
    request = Request(model=model, messages=_check_messages(messages), params=checked,
                      stream=stream, tools=schemas)
    size = len(canonical(request.canonical()))
    if size > MAX_REQUEST_BYTES:
        raise LLMRequestInvalid(f"the request is {size:,} bytes, over {MAX_REQUEST_BYTES:,}")
    return request


def _shown(value: object) -> str:
    if type(value) is str:
        return repr(value[:80])
    return f"a {type(value).__name__}"


def _plain(value: object, what: str) -> Any:
    """Plain JSON (tuples become lists), or LLMRequestInvalid naming the part that is not."""
    value = _lists(value, 0)
    try:
        check_json(value, what=what)
    except EventError as error:
        raise LLMRequestInvalid(str(error)) from None
    return value


def _lists(value: object, depth: int) -> object:
    if depth > 40:
        return value  # check_json reports the depth
    if type(value) in (list, tuple):
        assert isinstance(value, (list, tuple))
        return [_lists(item, depth + 1) for item in value]
    if type(value) is dict:
        assert isinstance(value, dict)
        return {key: _lists(item, depth + 1) for key, item in value.items()}
    return value


def _number(name: str, value: object, low: float, high: float) -> float:
    if type(value) not in (int, float):
        raise LLMRequestInvalid(f"{name} must be {PARAMS[name]}, not {_shown(value)}")
    assert isinstance(value, (int, float))
    if not math.isfinite(value) or not low <= value <= high:
        raise LLMRequestInvalid(f"{name} must be {PARAMS[name]}, not {value!r}")
    return float(value)


def _check_param(name: str, value: object) -> Any:
    if name == "temperature":
        return _number(name, value, 0, 2)
    if name == "top_p":
        return _number(name, value, 0, 1)
    if name in ("presence_penalty", "frequency_penalty"):
        return _number(name, value, -2, 2)
    if name == "max_tokens":
        if type(value) is not int or not 1 <= value <= 1_000_000:
            raise LLMRequestInvalid(f"max_tokens must be {PARAMS[name]}, not {_shown(value)}")
        return value
    if name == "seed":
        if type(value) is not int or abs(value) >= 2**63:
            raise LLMRequestInvalid(f"seed must be an int, not {_shown(value)}")
        return value
    if name == "stop":
        stop = _plain(value, "stop")
        if type(stop) is str:
            return stop
        if type(stop) is not list or len(stop) > 4 or any(type(s) is not str for s in stop):
            raise LLMRequestInvalid(f"stop must be {PARAMS[name]}")
        return stop
    if name == "tool_choice":
        choice = _plain(value, "tool_choice")
        if choice in ("none", "auto", "required"):
            return choice
        if (type(choice) is dict and choice.get("type") == "function"
                and type(choice.get("function")) is dict
                and type(choice["function"].get("name")) is str):
            return choice
        raise LLMRequestInvalid(f"tool_choice must be {PARAMS[name]}")
    if name == "response_format":
        shape = _plain(value, "response_format")
        if type(shape) is not dict or type(shape.get("type")) is not str:
            raise LLMRequestInvalid("response_format must be a dict with a 'type'")
        return shape
    if name == "mock_response":
        answer = _plain(value, "mock_response")
        if type(answer) not in (str, dict):
            raise LLMRequestInvalid(f"mock_response must be {PARAMS[name]}")
        return answer
    if name == "mock_tool_calls":
        calls = _plain(value, "mock_tool_calls")
        if type(calls) is not list or any(type(call) is not dict for call in calls):
            raise LLMRequestInvalid("mock_tool_calls must be a list of dicts")
        return calls
    raise AssertionError(name)  # every name in PARAMS is handled above


def _check_messages(messages: object) -> list[dict[str, Any]]:
    plain = _plain(messages, "messages")
    if type(plain) is not list or not plain or len(plain) > MAX_MESSAGES:
        raise LLMRequestInvalid(
            f"messages must be a non-empty list of at most {MAX_MESSAGES} dicts such as "
            "{'role': 'user', 'content': 'Hello'}")
    for index, message in enumerate(plain):
        where = f"messages[{index}]"
        if type(message) is not dict:
            raise LLMRequestInvalid(f"{where} must be a dict, not {_shown(message)}")
        extra = sorted(set(message) - MESSAGE_KEYS)
        if extra:
            raise LLMRequestInvalid(f"{where} has unknown keys {extra[:5]}; a message takes "
                                    f"{', '.join(sorted(MESSAGE_KEYS))}")
        if message.get("role") not in ROLES:
            raise LLMRequestInvalid(f"{where}['role'] must be one of {', '.join(sorted(ROLES))}")
        content = message.get("content")
        if content is not None and type(content) not in (str, list):
            raise LLMRequestInvalid(f"{where}['content'] must be a str, a list of parts or None")
    return plain


def _check_tool(spec: object, schemas: dict[str, dict[str, Any]]) -> dict[str, Any]:
    bad = ("a tool is {'type': 'function', 'function': {'name': ..., 'description': ..., "
           "'parameters': {'type': 'object', 'properties': {...}}}}")
    if type(spec) is not dict or spec.get("type") != "function" or set(spec) - {
            "type", "function"} or type(spec.get("function")) is not dict:
        raise LLMRequestInvalid(f"malformed tool: {bad}")
    function = spec["function"]
    name = function.get("name")
    if type(name) is not str or not _TOOL_NAME.fullmatch(name):
        raise LLMRequestInvalid(f"malformed tool name {_shown(name)}: {bad}")
    if set(function) - {"name", "description", "parameters"}:
        raise LLMRequestInvalid(f"tool {name!r} has unknown keys: {bad}")
    if name in schemas:
        raise LLMRequestInvalid(f"the tool {name!r} is offered twice")
    description = function.get("description", "")
    if type(description) is not str or len(description) > 1000:
        raise LLMRequestInvalid(f"the description of tool {name!r} must be a str of at most "
                                "1000 characters")
    parameters = function.get("parameters", {"type": "object", "properties": {}})
    try:
        schemas[name] = check_schema(parameters, tool=name)
    except InvalidGrant as error:
        raise LLMRequestInvalid(str(error)) from None
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": parameters}}
