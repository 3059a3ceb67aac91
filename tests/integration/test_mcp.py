"""``kernos mcp`` driven by a real MCP client (the SDK's ClientSession), over stdio and HTTP.

One workspace for the module, prepared through the harness client: an agent
``alice`` who may read ``ledger`` and call the registry tool ``summarize``, but
not ``reset_ledger`` nor read ``secret``.  Each test starts ``python -m
kernos.mcp`` as a subprocess: over stdio it uses the kernel already running on
the workspace (and leaves it running); over HTTP it starts its own kernel and
stops it when it exits.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from kernos.client import run_kernel

pytestmark = pytest.mark.kernel

TIMEOUT = 120
ENV = {"KERNOS_DURABILITY": "process"}
SUMMARIZE_SCHEMA = {"type": "object", "properties": {"amounts": {"type": "array"}},
                    "required": ["amounts"]}
SETUP = f"""
ledger = {{"entries": [40, 25]}}
secret = "s3cr3t"

def summarize(amounts):
    return {{"count": len(amounts), "total": sum(amounts)}}

def reset_ledger():
    ledger["entries"] = []

agents.register_tool("summarize", summarize, schema={SUMMARIZE_SCHEMA!r},
                     description="Count and total a list of amounts")
agents.register_tool("reset_ledger", reset_ledger, effect="image",
                     schema={{"type": "object", "properties": {{}}}},
                     description="Empty the ledger")
"""
BUILTINS = {"kernos-op", "kernos-objects", "kernos-object", "kernos-log", "kernos-show",
            "kernos-diff", "kernos-checkout", "kernos-events", "kernos-recall",
            "kernos-remember", "kernos-loop", "kernos-files-read", "kernos-files-list",
            "kernos-files-exists", "kernos-files-write", "kernos-files-append",
            "kernos-files-delete"}
HUMAN_ONLY = {"kernos-show", "kernos-diff", "kernos-checkout"}


async def _prepare(workspace: Path) -> None:
    async with run_kernel(workspace, env=ENV) as (_, client):
        assert await client.add_agent("alice") == "alice"
        result = await client.op(SETUP)
        assert result.committed, result.error
        await client.grant("alice", "read:ledger")
        await client.grant("alice", "call:summarize")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mcp") / "workspace"
    asyncio.run(_prepare(path))
    return path


def _run(scenario: Any) -> None:
    asyncio.run(asyncio.wait_for(scenario, TIMEOUT))


def _text(result: Any) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


async def _tools(session: ClientSession) -> dict[str, Any]:
    return {tool.name: tool for tool in (await session.list_tools()).tools}


async def _head(session: ClientSession) -> int:
    result = await session.call_tool("kernos-log", {"limit": 1})
    assert not result.is_error, _text(result)
    return int(result.structured_content["snapshots"][0]["op"])


async def _refused(session: ClientSession, tool: str, arguments: dict[str, Any],
                   *fragments: str) -> str:
    result = await session.call_tool(tool, arguments)
    text = _text(result)
    assert result.is_error, f"{tool} {arguments} was not refused: {text}"
    assert result.structured_content["error"]["message"] == text
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} is not in the refusal: {text}"
    return text


def test_stdio_as_human(workspace: Path) -> None:
    """Over stdio, as human: every tool, an op committed, objects read, bad calls refused."""
    parameters = StdioServerParameters(
        command=sys.executable,
        args=["-m", "kernos.mcp", "--workspace", str(workspace), "--principal", "human"],
        env={**os.environ, **ENV})

    async def scenario() -> None:
        async with run_kernel(workspace, env=ENV) as (_, kernel):
            async with stdio_client(parameters) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                await _as_human(session)
            # The server used the running kernel, saw its ops commit, and left it running.
            assert (await kernel.log(limit=1))[0]["message"].startswith("checkout")
            assert (await kernel.object("ledger")).version == 1
            # Its argument errors are in the audit log, like the kernel's own refusals.
            refusals = [record for record in await kernel.audit(status="rejected",
                                                                 limit=100)
                        if '"via": "mcp"' in str((record.get("code") or {}).get("text"))]
            assert len(refusals) == 6, refusals
            assert {json.loads(record["code"]["text"])["what"] for record in refusals} == {
                "kernos-op", "kernos-object", "summarize"}
            assert all(record["principal"] == "human" and
                       "mcp refused" in record["error"]["message"] for record in refusals)

    _run(scenario())


async def _as_human(session: ClientSession) -> None:
    tools = await _tools(session)
    assert set(tools) == BUILTINS | {"summarize", "reset_ledger"}
    assert tools["summarize"].input_schema == SUMMARIZE_SCHEMA
    # No tool lets a client choose the principal.
    assert all("principal" not in tool.input_schema.get("properties", {})
               for tool in tools.values())
    before = await _head(session)

    result = await session.call_tool("kernos-op",
                                     {"code": "total = sum(ledger['entries'])\ntotal"})
    assert not result.is_error, _text(result)
    op = result.structured_content
    assert (op["status"], op["principal"], op["added"]) == ("committed", "human", ["total"])
    assert op["value"]["json"] == 65 and "committed as op" in _text(result)
    assert await _head(session) == op["op"] > before

    result = await session.call_tool("kernos-object", {"name": "total"})
    assert not result.is_error, _text(result)
    assert result.structured_content["preview"]["json"] == 65
    assert result.structured_content["op"] == op["op"]
    read = await session.read_resource("kernos://objects/total")
    assert json.loads(read.contents[0].text)["preview"]["json"] == 65
    listed = await session.list_resources()
    assert {"kernos://objects/total", "kernos://objects/secret"} <= {
        str(resource.uri) for resource in listed.resources}

    result = await session.call_tool("summarize", {"amounts": [1, 2, 3]})
    assert not result.is_error, _text(result)
    assert result.structured_content["status"] == "committed"
    assert result.structured_content["value"]["json"] == {"count": 3, "total": 6}

    # Bad arguments: a clear error naming what was wrong, and nothing changes.
    head = await _head(session)
    await _refused(session, "kernos-op", {"code": 42}, "'code'", "string", "integer")
    await _refused(session, "kernos-op", {"code": "x = 1", "principal": "alice"},
                   "unknown argument 'principal'")
    await _refused(session, "kernos-op", {}, "exactly one of 'code'")
    await _refused(session, "kernos-object", {}, "'name' is required")
    await _refused(session, "summarize", {"amounts": "many"}, "'amounts'", "array")
    await _refused(session, "summarize", {}, "'amounts' is required")
    await _refused(session, "kernos-diff", {"a": "no-such-ref"}, "no-such-ref")
    assert await _head(session) == head

    result = await session.call_tool("kernos-checkout", {"ref": f"@{before}"})
    assert not result.is_error, _text(result)
    assert "total" in result.structured_content["deleted"]
    await _refused(session, "kernos-object", {"name": "total"}, "'total'")


@pytest.fixture
def http_server(workspace: Path) -> Iterator[tuple[str, subprocess.Popen[str], list[str]]]:
    """``python -m kernos.mcp --transport http`` as alice: its URL, process and stderr."""
    process = subprocess.Popen(
        [sys.executable, "-m", "kernos.mcp", "-w", str(workspace), "--principal", "alice",
         "--transport", "http"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, env={**os.environ, **ENV})
    lines: list[str] = []
    found: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
            match = re.search(r"on (http://127\.0\.0\.1:\d+/mcp)$", line.strip())
            if match:
                found.put(match.group(1))

    threading.Thread(target=read, daemon=True).start()
    try:
        try:
            url = found.get(timeout=TIMEOUT)
        except queue.Empty:
            pytest.fail(f"kernos mcp printed no URL; its stderr:\n{''.join(lines)}")
        yield url, process, lines
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_http_as_agent(workspace: Path,
                       http_server: tuple[str, subprocess.Popen[str], list[str]]) -> None:
    """Over HTTP, as alice: only her tools and names; what she lacks is refused, unchanged."""
    url, process, stderr = http_server

    async def scenario() -> None:
        async with streamable_http_client(url) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            tools = await _tools(session)
            assert set(tools) == (BUILTINS - HUMAN_ONLY) | {"summarize"}

            result = await session.call_tool("summarize", {"amounts": [2, 3]})
            assert not result.is_error, _text(result)
            op = result.structured_content
            assert (op["status"], op["principal"]) == ("committed", "alice")
            assert op["value"]["json"] == {"count": 2, "total": 5}

            # A registry tool alice may not call: not listed, and refused by name.
            await _refused(session, "reset_ledger", {}, "no tool 'reset_ledger'",
                           "call:reset_ledger")
            await _refused(session, "kernos-checkout", {"ref": "HEAD"}, "only to the human")
            # The history, as far as her grants reach: her own op with its code, the
            # names she may read, never `secret` or another principal's code.
            result = await session.call_tool("kernos-op", {"code": "seen = 1"})
            assert result.structured_content["status"] == "committed", _text(result)
            result = await session.call_tool("kernos-log", {"limit": 50})
            assert not result.is_error, _text(result)
            snapshots = result.structured_content["snapshots"]
            names = {name for entry in snapshots for listed in entry["changes"].values()
                     for name in listed}
            assert "secret" not in names and "ledger" in names
            assert "secret" not in _text(result)
            assert [entry["message"] for entry in snapshots
                    if entry["principal"] == "alice"] == ["seen = 1", "call summarize"]
            assert all(entry["message"] is None for entry in snapshots
                       if entry["principal"] != "alice")
            # The kernel enforces her grants on code too.
            result = await session.call_tool("kernos-op", {"code": "write('ledger', {})"})
            assert result.is_error and result.structured_content["status"] != "committed"

            ledger = json.loads((await session.read_resource("kernos://objects/ledger"))
                                .contents[0].text)
            assert ledger["preview"]["json"] == {"entries": [40, 25]}
            uris = {str(resource.uri) for resource in (await session.list_resources()).resources}
            assert "kernos://objects/ledger" in uris
            assert "kernos://objects/secret" not in uris
            with pytest.raises(MCPError, match="secret"):
                await session.read_resource("kernos://objects/secret")
            result = await session.call_tool("kernos-objects", {})
            assert "secret" not in {item["name"] for item in
                                    result.structured_content["objects"]}

    _run(scenario())
    # SIGTERM stops the server, and with it the kernel it started.
    process.send_signal(signal.SIGTERM)
    assert process.wait(TIMEOUT) == 0, "".join(stderr)
    deadline = time.monotonic() + 10
    while (workspace / "kernel.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not (workspace / "kernel.json").exists(), "the server's kernel still runs"
