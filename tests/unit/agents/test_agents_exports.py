"""The public surface of kernos.agents is what we mean it to be."""

from __future__ import annotations

import kernos.agents
from kernos.agents import api, guards

EXPECTED = {"HUMAN", "AgentRuntime", "Agents", "FileAccess", "FileLimitExceeded", "Grant",
            "Limits", "Registry", "RunResult", "ToolVersion"}


def test_agents_exports_are_the_intended_ones() -> None:
    assert set(kernos.agents.__all__) == EXPECTED
    assert len(kernos.agents.__all__) == len(EXPECTED)
    for name in kernos.agents.__all__:
        assert hasattr(kernos.agents, name), name
    assert kernos.agents.HUMAN == "human"


def test_importing_the_package_installs_the_agent_calls() -> None:
    for name, function in api.CALLS.items():
        assert guards.AGENT_BUILTINS[name] is function
    assert sorted(api.CALLS) == ["call", "context", "define_tool", "delegate", "emit",
                                 "grants", "llm", "read", "recall", "remember", "revoke",
                                 "spawn", "spend", "subscribe", "unsubscribe", "whoami",
                                 "write"]
