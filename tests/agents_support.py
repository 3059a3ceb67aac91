"""Helpers shared by the agent integration tests (tests/integration/test_agents_*.py).

They drive a real kernel (the ``Kernel`` of tests/integration/conftest.py) with
``%%agent`` cells, ``%kernos`` magics and the notebook's ``agents`` object, and
read state back from it in later cells.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

__all__ = [
    "agent", "committed", "define_tool", "denials", "error_text", "fails", "grant_row",
    "grants", "names_of", "used",
]


def agent(name: str, code: str) -> str:
    """A cell that runs ``code`` as agent ``name``."""
    return f"%%agent {name}\n{code}"


def error_text(result: Any) -> str:
    """Every error the cell reported (name and message), in one string."""
    return "\n".join(f"{error['ename']}: {error['evalue']}" for error in result.errors)


def committed(kernel: Any, code: str) -> Any:
    """Run a cell that must succeed and commit; returns its Result."""
    result = kernel.run(code)
    assert result.status == "ok", (code, error_text(result), result.stderr)
    assert result.committed, (code, result.kernos)
    return result


def fails(kernel: Any, code: str, ename: str, *fragments: str) -> Any:
    """Run a cell that must fail with ``ename`` and roll back; each fragment is in the message."""
    result = kernel.run(code)
    assert result.status == "error", (code, result.stdout, result.kernos)
    assert result.rolled_back, (code, result.kernos)
    assert result.errors, (code, result.stderr)
    error = result.errors[-1]
    assert error["ename"] == ename, (code, error_text(result))
    for fragment in fragments:
        assert fragment in error["evalue"], (fragment, error_text(result))
    return result


def grants(kernel: Any, who: str | None = None) -> dict[str, dict[str, Any]]:
    """The grants (of ``who``, or all), by id, as ``agents.grants()`` describes them."""
    listed = kernel.value(f"agents.grants({who!r})" if who else "agents.grants()")
    return {grant["id"]: grant for grant in listed}


def used(kernel: Any, grant_id: str) -> str:
    """How much of a limited grant has been used (a Decimal's str)."""
    return grants(kernel)[grant_id]["used"]


def names_of(kernel: Any, who: str) -> dict[str, Any]:
    """An agent's own names and their values (which must be Python literals)."""
    return kernel.value(f"dict(agents.namespace({who!r}))")


def define_tool(who: str, name: str, body: str, *, description: str = "a tool",
                schema: dict[str, Any] | None = None) -> str:
    """An agent cell that defines tool ``name(x)`` returning ``body``, printing its version."""
    source = f"def {name}(x):\n    return {body}\n"
    schema = schema if schema is not None else {
        "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    return agent(who, f"print('version', define_tool({name!r}, {source!r}, {schema!r}, "
                      f"{description!r}))")


def denials(workspace: Path) -> list[dict[str, Any]]:
    """Every denial the workspace's audit log records, oldest first, with its op."""
    path = Path(workspace) / "audit" / "chain.jsonl"
    if not path.exists():
        return []
    found = []
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        for denial in (record.get("grants") or {}).get("denied", []):
            found.append({**denial, "op": record["op"]})
    return found


def grant_row(table: str, grant_id: str) -> dict[str, str]:
    """One row of the ``%kernos grants`` table, by grant id, as a dict of its columns."""
    pattern = re.compile(
        rf"^{re.escape(grant_id)}\s+(?P<principal>\S+)\s+(?P<capability>\S+)\s+"
        r"(?:(?P<budget>\d[\d.]*/\d[\d.]*)\s+)?(?P<source>\S+(?: \(g\d+\))?)\s+"
        r"(?P<op>\d+)\s+(?P<state>active|revoked \(op \d+\))\s*$", re.M)
    match = pattern.search(table)
    assert match is not None, f"no row for {grant_id} in:\n{table}"
    return {key: value or "" for key, value in match.groupdict().items()}
