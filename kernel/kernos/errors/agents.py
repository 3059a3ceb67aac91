"""Errors of agents: unknown principals and tools, malformed grants, refused code,
denied capabilities, open circuit breakers, values that may not cross a boundary.

Part of the tree drawn in ``kernos.errors``, which is where they are imported from.
"""

from __future__ import annotations

from kernos.errors.base import KernosError, UsageError

__all__ = ["AgentCodeRejected", "BoundaryError", "CapabilityDenied", "CircuitOpen", "InvalidGrant",
           "UnknownAgent", "UnknownTool"]


class UnknownAgent(UsageError):
    """A principal name that the image does not know."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = known
        listed = ", ".join(known) if known else "none yet"
        super().__init__(
            f"There is no agent {name!r} (agents: {listed}). Add it with "
            f"`%kernos agent add {name}` or `agents.add({name!r})`."
        )


class UnknownTool(UsageError):
    """A tool name with no version visible to the op."""

    def __init__(self, name: str, known: list[str], *, detail: str = "") -> None:
        self.name = name
        self.known = known
        self.detail = detail
        listed = ", ".join(known) if known else "none yet"
        super().__init__(
            f"There is no tool {name!r}{detail} (tools: {listed}). Register it with "
            "`agents.register_tool(...)`, or let an agent define it with `define_tool(...)`."
        )


class InvalidGrant(UsageError):
    """A capability, amount, limit or tool schema that is not well formed."""


class AgentCodeRejected(UsageError):
    """Agent code that the restricted dialect does not accept; nothing ran."""

    def __init__(self, principal: str, problems: list[str]) -> None:
        self.principal = principal
        self.problems = problems
        super().__init__(
            f"The code for agent {principal!r} was refused before it ran: "
            + "; ".join(problems) + ". Agent code is a restricted Python dialect: no "
            "imports, no names or attributes starting with '_', bounded size and nesting."
        )


class CapabilityDenied(KernosError):
    """A principal tried to use a capability it was not granted (or that was revoked).

    Agent code may catch it, but the op is rolled back at commit regardless.
    """

    def __init__(self, principal: str, capability: str, *, detail: str = "") -> None:
        self.principal = principal
        self.capability = capability
        self.detail = detail
        grantable = capability.count(":") == 1 and " " not in capability
        super().__init__(
            f"{principal!r} does not hold the capability {capability!r}"
            + (f" ({detail})" if detail else "")
            + ". The op will roll back."
            + (f" A human can grant it with `%kernos grant {principal} {capability}`."
               if grantable else "")
        )


class CircuitOpen(KernosError):
    """A supervisor policy tripped: every op of the agent is refused until a human resets it."""

    def __init__(self, agent: str, policy: str, message: str) -> None:
        self.agent = agent
        self.policy = policy
        self.message = message
        super().__init__(
            f"{agent!r}'s circuit is open ({message}), so its op was refused before it ran "
            f"and rolls back. Only a human closes it: `agents.reset({agent!r})` once the "
            "cause is dealt with.")
        self.sub_agent: str | None = None
        """The sub-agent whose op was refused, when the open circuit is an ancestor's."""

    @classmethod
    def for_sub_agent(cls, sub_agent: str, ancestors: list[str], agent: str, policy: str,
                      message: str, *, via: str) -> CircuitOpen:
        """``sub_agent``'s op (or ``via``: its tool) refused because ``agent``, reached
        through ``ancestors`` (nearest first, ending at ``agent``), has an open circuit."""
        error = cls(agent, policy, message)
        error.sub_agent = sub_agent
        chain = ", ".join(f"a sub-agent of {name!r}" for name in ancestors)
        what = (f"{sub_agent!r}'s op was refused before it ran and rolls back" if via == "op"
                else f"{sub_agent!r}'s {via} was refused before it ran and the op rolls back")
        error.args = (
            f"{sub_agent!r} is {chain}, whose circuit is open ({message}), so {what} (a "
            "sub-agent stops while an ancestor's circuit is open). Once the cause is dealt "
            f"with, only a human closes it: `agents.reset({agent!r})` in a cell or `kernos "
            f"agent reset {agent}` in a shell; then {sub_agent!r} runs again.",)
        return error


class BoundaryError(KernosError):
    """A value that may not pass between an agent and the host (only plain data may)."""
