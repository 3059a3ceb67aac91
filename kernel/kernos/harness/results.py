"""Typed forms of the harness protocol's results (see ``kernos.harness.protocol``).

Both sides use them: the service builds an :class:`OpResult` and sends its
JSON; the client turns the JSON back into one.  Frozen dataclasses with one
docstring line per field; ``from_json`` ignores fields it does not know, so a
newer kernel's extra facts do not break an older client.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["COMMITTED", "CONFLICT", "ErrorInfo", "ObjectInfo", "OpResult", "Value"]

COMMITTED = "committed"
CONFLICT = "conflict"


@dataclass(frozen=True, kw_only=True)
class ErrorInfo:
    """Why an op did not commit, or why a request was refused."""

    kind: str
    """A stable word to switch on (see ``protocol.ERROR_KINDS``, or the op's status)."""
    message: str
    """What was wrong and what to do."""
    data: dict[str, Any] = field(default_factory=dict)
    """The facts: exception type, names, current versions, ..."""

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "data": dict(self.data)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ErrorInfo:
        return cls(kind=str(data.get("kind", "")), message=str(data.get("message", "")),
                   data=dict(data.get("data") or {}))


@dataclass(frozen=True, kw_only=True)
class Value:
    """An op's value: always a bounded, safe repr; JSON too when the value is JSON-able."""

    repr: str
    """A bounded repr (never the object's own ``__repr__`` for agent-made objects)."""
    json: Any = None
    """The value as JSON, when it is plain JSON data (see ``has_json``)."""
    has_json: bool = False
    """Whether ``json`` holds the value (``None`` is a JSON value too)."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"repr": self.repr}
        if self.has_json:
            out["json"] = self.json
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Value:
        return cls(repr=str(data.get("repr", "")), json=data.get("json"),
                   has_json="json" in data)


@dataclass(frozen=True, kw_only=True)
class OpResult:
    """The outcome of one op sent by a harness."""

    status: str
    """committed, rolled back, conflict, rejected, denied, failed, interrupted or vetoed."""
    principal: str
    """Who the op ran as."""
    op: int | None = None
    """The op number (also for ops that did not commit; None if none was assigned)."""
    commit: str | None = None
    """The snapshot a committed op wrote."""
    value: Value | None = None
    """The value of the code's final expression, if any."""
    output: str = ""
    """What the op printed (bounded)."""
    error: ErrorInfo | None = None
    """Why it did not commit."""
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    """The events it committed, as external subscribers receive them."""
    versions: dict[str, int | None] = field(default_factory=dict)
    """Current versions of the names its preconditions named (and of what it changed)."""
    duplicate: bool = False
    """True when its idempotency key matched an earlier committed op: nothing ran."""
    timings_ms: dict[str, float] = field(default_factory=dict)
    audit: dict[str, Any] = field(default_factory=dict)
    """Its audit record: ``index`` and ``hash``."""
    checkout: dict[str, Any] | None = None
    """For a checkout: what was checked out."""
    failed: dict[str, str] | None = None
    """For an op kept although its code raised (``on_error: keep``): the error."""
    undone: dict[str, Any] | None = None
    """For an op that rolled back: what it undid (added, rebound, deleted and reloaded
    names, names it could not reset, whether the random generators were put back)."""

    @property
    def committed(self) -> bool:
        return self.status == COMMITTED

    @property
    def conflict(self) -> bool:
        return self.status == CONFLICT

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, (Value, ErrorInfo)):
                value = value.to_json()
            out[item.name] = value
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> OpResult:
        known = {item.name for item in fields(cls)}
        kwargs = {key: value for key, value in data.items() if key in known}
        if kwargs.get("value") is not None:
            kwargs["value"] = Value.from_json(kwargs["value"])
        if kwargs.get("error") is not None:
            kwargs["error"] = ErrorInfo.from_json(kwargs["error"])
        return cls(**kwargs)


@dataclass(frozen=True, kw_only=True)
class ObjectInfo:
    """One name in the image, as ``objects`` and ``object`` describe it."""

    name: str
    type: str
    size: int
    """Bytes stored for its group."""
    version: int
    """Rises each time an op commits a new value for it."""
    op: int
    """The op that last changed it."""
    principal: str
    """Who ran that op."""
    changed_at: str
    summary: str
    """A short, bounded description."""
    preview: Value | None = None
    """A bounded preview (``object`` only)."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ObjectInfo:
        known = {item.name for item in fields(cls)}
        kwargs = {key: value for key, value in data.items() if key in known}
        if kwargs.get("preview") is not None:
            kwargs["preview"] = Value.from_json(kwargs["preview"])
        return cls(**kwargs)
