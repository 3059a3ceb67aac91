"""Capabilities: what a principal may do, as grants the runtime holds.

A capability is written ``KIND:TARGET``:

=================  ==========================================================
``call:TOOL``      call the tool TOOL (``call:*``: any tool; only the human
                   can grant a wildcard)
``read:NAME``      read the human namespace's NAME through a read-only view
``write:NAME``     read NAME and change it through the view's mutators
``spend:UNIT``     spend up to ``limit`` of UNIT (``spend:USD`` with 50)
``llm:MODEL``      use the language model MODEL up to ``limit`` tokens
                   (MODEL as litellm names it, ``openai/gpt-4o-mini``; see
                   ``kernos.llm``)
``agents:spawn``   create sub-agents (which start with no grants)
``emit:PATTERN``   emit events whose topic PATTERN matches (``emit:orders.*``)
``subscribe:PAT``  subscribe with patterns that PAT covers (``subscribe:orders.**``)
``memory:read``    recall from its own memory (``kernos.memory``): its ops, its
                   facts, its names, and the names its ``read:`` grants cover
``memory:write``   store facts in its memory (``remember``)
``file:read:GLOB``   read, list and test for the files GLOB matches, relative
                   to the files root (``file:read:data/**``); globs are
                   :mod:`kernos.agents.globs`' (``*`` stays within a
                   component, ``**`` crosses them)
``file:write:GLOB``  write, append to and delete those files, and read them
                   (as ``write:NAME`` implies ``read:NAME``).  An agent's own
                   ``agents/NAME/`` subtree needs no grant (kernos.agents.files)
=================  ==========================================================

A :class:`Grant` lives in the runtime's registry, never in agent code: an
agent names its grants by id and the runtime looks the id up *for that
principal*, so an id is worth nothing to anyone else.  A grant can be
revoked; a grant *derived* from another (an attenuation, delegated to a
sub-agent) is revoked with it, and can never exceed it: the same kind and
target and at most the parent's remaining limit.

Amounts are validated exactly: an ``int`` or ``decimal.Decimal`` (never a
subclass, a ``bool``, a ``float`` or a string), finite, non-negative, at most
:data:`MAX_AMOUNT`, with at most :data:`kernos.amounts.PLACES` decimal places;
they are added and subtracted only in :data:`kernos.amounts.EXACT`, so no
amount is ever rounded away.
"""

from __future__ import annotations

import decimal
import re
from dataclasses import dataclass, field

from kernos import amounts
from kernos.agents.globs import check_glob, glob_matches
from kernos.errors import InvalidGrant

__all__ = ["FILE_KINDS", "KINDS", "MAX_AMOUNT", "Grant", "amount", "parse_capability"]

KINDS = frozenset({"call", "read", "write", "spend", "llm", "agents", "emit", "subscribe",
                   "memory", "file"})
FILE_KINDS = frozenset({"file:read", "file:write"})
"""The kinds of file grants, whose target is a glob (``file:read:reports/*``)."""
EVENT_KINDS = frozenset({"emit", "subscribe"})
LIMITED_KINDS = frozenset({"spend", "llm"})
MAX_AMOUNT = decimal.Decimal(10) ** 15
_TARGET = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]{0,63}|\*")
_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-/:@]{0,127}")


def amount(value: object, *, what: str = "amount") -> decimal.Decimal:
    """An exact, finite, non-negative amount, or InvalidGrant naming the problem."""
    kind = type(value)
    if kind is int:
        assert isinstance(value, int)
        result = decimal.Decimal(value)
    elif kind is decimal.Decimal:
        assert isinstance(value, decimal.Decimal)
        if not value.is_finite():
            raise InvalidGrant(f"the {what} {value} is not finite; give a finite int or Decimal")
        result = value
    else:
        raise InvalidGrant(
            f"the {what} must be an int or a decimal.Decimal, not {kind.__name__}"
            " (floats round, strings and subclasses are not accepted)")
    if result < 0:
        raise InvalidGrant(f"the {what} {result} is negative; give zero or more")
    if result > MAX_AMOUNT:
        raise InvalidGrant(f"the {what} {result} is over the maximum of {MAX_AMOUNT}")
    if amounts.places(result) > amounts.PLACES:
        raise InvalidGrant(f"the {what} {str(result)[:60]} has more than {amounts.PLACES} "
                           f"decimal places; amounts are exact to {amounts.QUANTUM} "
                           "(round it to that yourself)")
    return result


def parse_capability(capability: object) -> tuple[str, str]:
    """``"call:search"`` -> ``("call", "search")``, or InvalidGrant saying what is wrong."""
    if type(capability) is not str:
        raise InvalidGrant(f"a capability is a string like 'call:search', not "
                           f"{type(capability).__name__}")
    assert isinstance(capability, str)
    kind, sep, target = capability.partition(":")
    if not sep or kind not in KINDS:
        raise InvalidGrant(
            f"{capability[:80]!r} is not a capability; write KIND:TARGET with KIND one of "
            f"{', '.join(sorted(KINDS))} (for example 'call:search' or 'spend:USD')")
    if kind == "file":
        access, sep, glob = target.partition(":")
        if not sep or access not in ("read", "write"):
            raise InvalidGrant(f"{capability[:80]!r}: the file capabilities are "
                               "'file:read:GLOB' and 'file:write:GLOB' (like "
                               "'file:write:reports/*')")
        return f"file:{access}", check_glob(glob)
    if kind in EVENT_KINDS:
        from kernos.audit.topics import compile_pattern
        from kernos.errors import EventError

        try:
            compile_pattern(target)
        except EventError as error:
            raise InvalidGrant(f"{capability[:80]!r}: {error}") from None
        return kind, target
    if kind == "llm" and _MODEL.fullmatch(target):
        return kind, target  # litellm's names: 'anthropic/claude-3-5-haiku', 'ollama/x:7b'
    if not _TARGET.fullmatch(target):
        raise InvalidGrant(f"{capability[:80]!r} has a bad target; use letters, digits, "
                           "'_', '.', '-' (at most 64), or '*'")
    if kind == "agents" and target != "spawn":
        raise InvalidGrant("the only 'agents' capability is 'agents:spawn'")
    if kind == "memory" and target not in ("read", "write"):
        raise InvalidGrant("the 'memory' capabilities are 'memory:read' and 'memory:write'")
    return kind, target


@dataclass(kw_only=True)
class Grant:
    """One capability held by one principal."""

    id: str
    """Stable id, unique in the image (``g12``)."""
    principal: str
    """Who holds it."""
    kind: str
    """``call``, ``read``, ``write``, ``spend``, ``llm``, ``agents``, ``emit``,
    ``subscribe``, ``memory``, ``file:read`` or ``file:write``."""
    target: str
    """The tool, name, unit or model it is about."""
    limit: decimal.Decimal | None = None
    """For ``spend`` and ``llm``: the most that may be used."""
    used: decimal.Decimal = field(default_factory=decimal.Decimal)
    """How much of ``limit`` has been used."""
    granted_by: str
    """The principal that granted it."""
    parent: str | None = None
    """The grant it was attenuated from, if any."""
    op: int
    """The op that granted it."""
    revoked_op: int | None = None
    """The op that revoked it (directly or through its parent), if any."""

    @property
    def capability(self) -> str:
        return f"{self.kind}:{self.target}"

    @property
    def active(self) -> bool:
        return self.revoked_op is None

    @property
    def remaining(self) -> decimal.Decimal | None:
        return None if self.limit is None else amounts.subtract(self.limit, self.used)

    def covers(self, kind: str, target: str) -> bool:
        if not self.active:
            return False
        if self.kind in EVENT_KINDS and self.kind == kind:
            from kernos.audit.topics import compile_pattern, covers

            return covers(compile_pattern(self.target), compile_pattern(target))
        if self.kind in FILE_KINDS:  # target: a file's path relative to the files root
            return (kind == self.kind or (self.kind, kind) == ("file:write", "file:read")) \
                and glob_matches(self.target, target)
        if self.kind == kind or (self.kind == "write" and kind == "read"):
            return self.target in (target, "*")
        return False

    def describe(self) -> dict[str, object]:
        """Plain data about the grant (what agents and frontends are shown)."""
        return {
            "id": self.id, "principal": self.principal, "capability": self.capability,
            "limit": None if self.limit is None else str(self.limit),
            "used": str(self.used) if self.limit is not None else None,
            "remaining": None if self.limit is None else str(self.remaining),
            "granted_by": self.granted_by, "parent": self.parent, "op": self.op,
            "active": self.active, "revoked_op": self.revoked_op,
        }
