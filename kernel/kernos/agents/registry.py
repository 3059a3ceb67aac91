"""The registry: principals, grants and tools, persisted in the image.

The registry is plain data plus tool functions.  It is stored as the
image's ``kernos:agents`` name, so it commits, rolls back and shows in
history with everything else.  Its methods are the *rules* (who may grant
what, what an attenuation may keep, which tool version an op sees); they
never run agent code, and never check *who is asking* beyond the
``granter`` argument, which the runtime fills in.

Tool versions are immutable once defined.  An op sees the versions that
were committed when it started (:meth:`Registry.tool_version`), so a new
version takes effect from the next op and an op in flight keeps the one it
started with.
"""

from __future__ import annotations

import decimal
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kernos.agents.capabilities import (
    FILE_KINDS,
    LIMITED_KINDS,
    Grant,
    amount,
    parse_capability,
)
from kernos.errors import (
    CapabilityDenied,
    InvalidGrant,
    KernosError,
    UnknownAgent,
    UnknownTool,
    UsageError,
)
from kernos.llm.schema import check_arguments, check_schema

__all__ = ["EFFECTS", "HUMAN", "Principal", "Registry", "ToolVersion", "check_arguments",
           "check_schema"]

HUMAN = "human"
EFFECTS = frozenset({"pure", "image", "external"})
_AGENT_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}(/[a-z][a-z0-9_]{0,31}){0,3}")
_TOOL_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


@dataclass(kw_only=True)
class Principal:
    """A named agent (the human is implicit and never stored)."""

    name: str
    """``alice``, or ``alice/helper`` for a sub-agent of ``alice``."""
    parent: str | None
    """The principal that created it: ``human`` or the parent agent."""
    created_op: int
    """The op that added it."""
    limits: dict[str, int] = field(default_factory=dict)
    """Overrides of the default resource limits (see ``kernos.agents.limits``)."""


@dataclass(kw_only=True)
class ToolVersion:
    """One immutable version of a tool."""

    name: str
    """The tool's name."""
    version: int
    """1, 2, ... in order of definition."""
    function: Callable[..., Any]
    """What runs: trusted Python (human tools) or restricted code (agent tools)."""
    schema: dict[str, Any]
    """JSON schema of the arguments (an object schema), for LLM tool calling."""
    description: str
    """One line for humans and models."""
    capability: str
    """What a caller must hold: ``call:NAME`` unless registered otherwise."""
    effect: str
    """``pure``, ``image`` (changes the image) or ``external`` (a side effect)."""
    author: str
    """The principal that defined it."""
    op: int
    """The op that defined it; ops after it see this version."""
    source: str | None = None
    """The source of an agent-written tool."""
    resolve: Callable[[str], tuple[bool, Any]] | None = None
    """For an external tool: asked, with an in-doubt effect's idempotency key, whether it
    happened: ``(True, result)`` or ``(False, None)`` (see kernos.effects)."""
    attempts: int = 3
    """For an external tool: how many times a raising implementation is tried."""
    backoff: float = 0.05
    """For an external tool: seconds before the second attempt, doubled for each later one."""
    timeout: float | None = 60.0
    """For an external tool: seconds an attempt may run (in a worker thread) before its
    effect is left in doubt and the kernel goes on; None runs it in the caller's thread,
    unbounded (for an implementation bound to its thread)."""

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "version": self.version, "description": self.description,
                "capability": self.capability, "effect": self.effect, "author": self.author,
                "op": self.op, "schema": self.schema}


def shown(value: object) -> str:
    """A value from agent code, safe to put in a message (no repr of big ints, bounded)."""
    if type(value) is str:
        return value[:80]
    return f"<a {type(value).__name__}>"


class Registry:
    """Principals, grants and tool versions.  Lives in the image as ``kernos:agents``."""

    def __init__(self) -> None:
        self.principals: dict[str, Principal] = {}
        self.grants: dict[str, Grant] = {}
        self.tools: dict[str, list[ToolVersion]] = {}
        self.next_grant = 1

    # -- principals ------------------------------------------------------------

    def add_agent(self, name: object, *, parent: str, op: int) -> Principal:
        if type(name) is not str or not _AGENT_NAME.fullmatch(name):
            raise UsageError(f"{shown(name)!r} is not a valid agent name: use lowercase "
                             "letters, digits and '_', starting with a letter (sub-agents: "
                             "'parent/child')")
        assert isinstance(name, str)
        if name == HUMAN or name in self.principals:
            raise UsageError(f"the agent {name!r} already exists")
        if "/" in name and name.rsplit("/", 1)[0] != parent:
            raise UsageError(f"{name!r} can only be created by {name.rsplit('/', 1)[0]!r}")
        principal = Principal(name=name, parent=parent, created_op=op)
        self.principals[name] = principal
        return principal

    def principal(self, name: object) -> Principal:
        if type(name) is not str or name not in self.principals:
            raise UnknownAgent(shown(name), sorted(self.principals))
        assert isinstance(name, str)
        return self.principals[name]

    def is_descendant(self, name: str, ancestor: str) -> bool:
        while True:
            parent = self.principals[name].parent if name in self.principals else None
            if parent is None:
                return False
            if parent == ancestor:
                return True
            name = parent

    # -- grants ----------------------------------------------------------------

    def grant(self, principal: str, capability: object, *, limit: object = None,
              granter: str, op: int, parent: Grant | None = None) -> Grant:
        """Record a grant.  The human may grant anything; agents only attenuate."""
        self.principal(principal)
        kind, target = parse_capability(capability)
        if kind in LIMITED_KINDS:
            if limit is None:
                raise InvalidGrant(f"{capability!r} needs a limit (an int or Decimal)")
            checked: decimal.Decimal | None = amount(limit, what="limit")
        elif limit is not None:
            raise InvalidGrant(f"{capability!r} takes no limit")
        else:
            checked = None
        if granter != HUMAN:
            if parent is None:
                raise CapabilityDenied(granter, shown(capability),
                                       detail="agents can only delegate grants they hold")
            if target == "*" and parent.target != "*":
                raise InvalidGrant("a wildcard cannot be derived from a narrower grant")
        grant = Grant(id=f"g{self.next_grant}", principal=principal, kind=kind, target=target,
                      limit=checked, granted_by=granter, parent=parent.id if parent else None,
                      op=op)
        self.next_grant += 1
        self.grants[grant.id] = grant
        return grant

    def attenuate(self, holder: str, grant_id: object, to: object, *, limit: object = None,
                  target: object = None, op: int) -> Grant:
        """Derive a narrower grant from ``holder``'s grant for one of its sub-agents."""
        parent = self.held(holder, grant_id)
        recipient = self.principal(to)
        if not self.is_descendant(recipient.name, holder):
            raise CapabilityDenied(holder, f"delegate to {recipient.name}",
                                   detail="grants can only be delegated to your sub-agents")
        new_target = parent.target if target is None else target
        if type(new_target) is not str:
            raise InvalidGrant("a target is a string")
        assert isinstance(new_target, str)
        wildcard = parent.target == "*" and parent.kind not in FILE_KINDS  # a file glob '*'
        if not wildcard and new_target != parent.target:  # covers only the top directory
            raise CapabilityDenied(holder, f"{parent.kind}:{new_target}",
                                   detail=f"grant {parent.id} covers only {parent.capability}")
        new_limit = limit
        if parent.limit is not None:
            remaining = parent.remaining
            assert remaining is not None
            new_limit = remaining if limit is None else amount(limit, what="limit")
            if new_limit > remaining:
                raise CapabilityDenied(holder, f"{parent.capability} up to {new_limit}",
                                       detail=f"grant {parent.id} has only {remaining} left")
        return self.grant(recipient.name, f"{parent.kind}:{new_target}", limit=new_limit,
                          granter=holder, op=op, parent=parent)

    def held(self, holder: str, grant_id: object) -> Grant:
        """``holder``'s own active grant by id; an id held by anyone else is unknown."""
        grant = self.grants.get(grant_id) if type(grant_id) is str else None
        if grant is None or grant.principal != holder or not grant.active:
            raise CapabilityDenied(holder, f"grant {shown(grant_id)}",
                                   detail="no such active grant is held by this principal")
        return grant

    def revoke(self, grant: Grant, *, op: int) -> list[Grant]:
        """Revoke a grant and everything derived from it; returns what was revoked."""
        revoked = []
        frontier = [grant]
        while frontier:
            current = frontier.pop()
            if current.active:
                current.revoked_op = op
                revoked.append(current)
            frontier += [child for child in self.grants.values() if child.parent == current.id]
        return revoked

    def matching(self, principal: str, capability: object) -> list[Grant]:
        kind, target = parse_capability(capability)
        return [grant for grant in self.grants.values()
                if grant.principal == principal and grant.active
                and grant.kind == kind and grant.target == target]

    def find(self, principal: str, kind: str, target: str) -> Grant | None:
        """The active grant that lets ``principal`` do ``kind`` on ``target``, if any."""
        for grant in self.grants.values():
            if grant.principal == principal and grant.covers(kind, target):
                return grant
        return None

    def of(self, principal: str | None = None) -> list[Grant]:
        return [grant for grant in self.grants.values()
                if principal is None or grant.principal == principal]

    def chain(self, grant: Grant) -> list[Grant]:
        """``grant`` and every grant it was derived from, nearest first."""
        chain = [grant]
        while chain[-1].parent is not None:
            chain.append(self.grants[chain[-1].parent])
        return chain

    def chains(self, grants: list[Grant]) -> list[Grant]:
        """Every grant of each one's chain, each once (an author's and a caller's may meet)."""
        return list({id(link): link for grant in grants for link in self.chain(grant)}.values())

    # -- tools -----------------------------------------------------------------

    def define_tool(self, *, name: object, function: Callable[..., Any], schema: object,
                    description: object, effect: object, author: str, op: int,
                    capability: object = None, source: str | None = None,
                    resolve: object = None, attempts: object = 3,
                    backoff: object = 0.05, timeout: object = 60.0) -> ToolVersion:
        if type(name) is not str or not _TOOL_NAME.fullmatch(name):
            raise UsageError(f"{shown(name)!r} is not a valid tool name: lowercase letters, "
                             "digits and '_', starting with a letter")
        assert isinstance(name, str)
        if type(description) is not str or len(description) > 1000:
            raise InvalidGrant(f"the description of tool {name!r} must be a string of at most "
                               "1000 characters")
        if type(effect) is not str or effect not in EFFECTS:
            raise InvalidGrant(f"the effect of tool {name!r} must be one of {sorted(EFFECTS)}")
        required = f"call:{name}" if capability is None else capability
        parse_capability(required)
        checked_schema = check_schema(schema, tool=name)
        if effect == "external":
            _check_external(name, function, checked_schema, resolve, attempts, backoff,
                            timeout)
        elif resolve is not None:
            raise UsageError(f"tool {name!r}: only an external tool has a resolve function")
        versions = self.tools.get(name, [])
        if versions and versions[-1].author != author and author != HUMAN:
            raise CapabilityDenied(author, f"define tool {name}",
                                   detail=f"it belongs to {versions[-1].author}")
        version = ToolVersion(
            name=name, version=len(versions) + 1, function=function,
            schema=checked_schema, description=str(description),
            capability=str(required), effect=str(effect), author=author, op=op, source=source,
            resolve=resolve if callable(resolve) else None,
            attempts=attempts if type(attempts) is int else 3,
            backoff=float(backoff) if isinstance(backoff, (int, float)) else 0.05,
            timeout=float(timeout) if isinstance(timeout, (int, float)) else None)
        self.tools[name] = [*versions, version]  # only once everything is checked
        return version

    def tool_version(self, name: object, *, before_op: int) -> ToolVersion:
        """The newest version of ``name`` defined by an op before ``before_op``."""
        versions = self.tools.get(name) if type(name) is str else None
        if not versions:
            raise UnknownTool(shown(name), sorted(self.tools))
        visible = [version for version in versions if version.op < before_op]
        if not visible:
            raise UnknownTool(shown(name), sorted(self.tools),
                              detail=" yet: it was defined in this op and can be called from "
                                     "the next op")
        return visible[-1]

    def as_seen_by(self, authority: list[str], error: KernosError) -> KernosError:
        """``error``, naming only the tools and agents every one of ``authority`` may use.

        An unknown tool or agent is reported with the names the grants let the
        running code use (tools it wrote or may call; itself and its
        sub-agents), never the whole registry; inside an agent-written tool,
        its author's grants bound that too.  Only the human's own code
        (``authority`` empty) sees every name.
        """
        if not authority:
            return error
        if isinstance(error, UnknownTool):
            usable = []
            for name, versions in self.tools.items():
                kind, target = parse_capability(versions[-1].capability)
                if all(versions[-1].author == principal or self.find(principal, kind, target)
                       for principal in authority):
                    usable.append(name)
            return UnknownTool(error.name, sorted(usable), detail=error.detail)
        if isinstance(error, UnknownAgent):
            return UnknownAgent(error.name, sorted(
                name for name in self.principals
                if all(name == principal or self.is_descendant(name, principal)
                       for principal in authority)))
        return error


def _check_external(name: str, function: Callable[..., Any], schema: dict[str, Any],
                    resolve: object, attempts: object, backoff: object,
                    timeout: object) -> None:
    """An external tool takes its effect's idempotency key, and says how to retry."""
    if "idempotency_key" in schema.get("properties", {}):
        raise UsageError(f"tool {name!r}: 'idempotency_key' is passed by Kernos, so it cannot be "
                         "an argument in the schema")
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        parameters = None
    if parameters is not None and "idempotency_key" not in parameters and not any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        raise UsageError(f"tool {name!r} is external, so it must accept the keyword argument "
                         "idempotency_key (pass it on to the service, so that a retry is not "
                         "done twice)")
    if resolve is not None and not callable(resolve):
        raise UsageError(f"tool {name!r}: resolve must be a function of the idempotency key")
    if type(attempts) is not int or not 1 <= attempts <= 20:
        raise UsageError(f"tool {name!r}: attempts must be an int from 1 to 20")
    if type(backoff) not in (int, float) or not 0 <= backoff <= 60:  # type: ignore[operator]
        raise UsageError(f"tool {name!r}: backoff must be a number of seconds from 0 to 60")
    if timeout is not None and (type(timeout) not in (int, float)
                                or not 0 < timeout <= 86400):  # type: ignore[operator]
        raise UsageError(f"tool {name!r}: timeout must be a number of seconds over 0 and at "
                         "most 86400, or None to run the implementation unbounded in the "
                         "kernel's thread")
