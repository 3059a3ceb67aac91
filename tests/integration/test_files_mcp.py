"""The ``kernos-files-*`` tools through ``kernos mcp``, driven by a real MCP client.

The server runs as one principal for its whole life (``--principal``), and its
file tools take no principal: alice's server writes and reads her reports under
her ``file:write:reports/*`` grant, each write one committed op of hers; a
server run as bob (no write grant) is refused (``denied``) and nothing is
written; a bad path is refused by the kernel with a message that says why, and
bytes round-trip as base64.
"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import pytest
from mcp import ClientSession, stdio_client

from kernos.client import run_kernel
from mcp_support import ENV, server, text

pytestmark = pytest.mark.kernel

TIMEOUT = 120
FILE_TOOLS = {"kernos-files-read", "kernos-files-write", "kernos-files-append",
              "kernos-files-list", "kernos-files-exists", "kernos-files-delete"}


def test_file_tools_act_as_the_servers_principal_under_its_grants(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    report = workspace / "files" / "reports" / "r.md"
    blob = bytes(range(256)) + b"\x00\xff"

    async def scenario() -> None:
        async with run_kernel(workspace, env=ENV) as (_, kernel):
            for agent in ("alice", "bob"):
                await kernel.add_agent(agent)
            await kernel.grant("alice", "file:write:reports/*")
            await kernel.grant("bob", "file:read:reports/*")

            async with stdio_client(server(workspace, "alice")) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                tools = {tool.name: tool for tool in (await session.list_tools()).tools}
                assert set(tools) >= FILE_TOOLS
                assert all("principal" not in tools[name].input_schema["properties"]
                           for name in FILE_TOOLS)
                assert tools["kernos-files-read"].annotations.read_only_hint
                assert not tools["kernos-files-write"].annotations.read_only_hint

                wrote = await session.call_tool("kernos-files-write",
                                                {"path": "reports/r.md", "data": "# R\n"})
                assert not wrote.is_error, text(wrote)
                assert wrote.structured_content["files"]["added"] == ["reports/r.md"]
                assert "as alice" in text(wrote)
                last = (await kernel.log(limit=1))[0]
                assert (last["op"], last["principal"]) == (wrote.structured_content["op"],
                                                           "alice")
                appended = await session.call_tool("kernos-files-append",
                                                   {"path": "reports/r.md", "data": "more\n"})
                assert not appended.is_error, text(appended)
                got = await session.call_tool("kernos-files-read", {"path": "reports/r.md"})
                assert not got.is_error and text(got) == "# R\nmore\n", text(got)
                assert report.read_text() == "# R\nmore\n"

                encoded = base64.b64encode(blob).decode()
                wrote = await session.call_tool("kernos-files-write", {
                    "path": "reports/b.bin", "data": encoded, "encoding": "base64"})
                assert not wrote.is_error, text(wrote)
                got = await session.call_tool("kernos-files-read", {
                    "path": "reports/b.bin", "encoding": "base64"})
                assert base64.b64decode(got.structured_content["data"]) == blob
                as_text = await session.call_tool("kernos-files-read", {"path": "reports/b.bin"})
                assert as_text.is_error and "base64" in text(as_text), text(as_text)

                listed = await session.call_tool("kernos-files-list", {"prefix": "reports"})
                assert listed.structured_content["paths"] == ["reports/b.bin", "reports/r.md"]
                found = await session.call_tool("kernos-files-exists", {"path": "reports/r.md"})
                assert found.structured_content["exists"] is True

                head = (await kernel.log(limit=1))[0]["op"]
                for bad, why in (("../x", "'..'"), ("/etc/passwd", "absolute"),
                                 ("a\0b", "NUL")):
                    refused = await session.call_tool("kernos-files-write",
                                                      {"path": bad, "data": "x"})
                    assert refused.is_error and why in text(refused), text(refused)
                    assert refused.structured_content["error"]["kind"] == "invalid"
                outside = await session.call_tool("kernos-files-write",
                                                  {"path": "notes.md", "data": "x"})
                assert outside.is_error and "file:write" in text(outside), text(outside)
                assert outside.structured_content["error"]["kind"] == "denied"
                unknown = await session.call_tool("kernos-files-write", {
                    "path": "reports/r.md", "data": "x", "principal": "human"})
                assert unknown.is_error and "principal" in text(unknown), text(unknown)
                assert (await kernel.log(limit=1))[0]["op"] == head
                assert not (tmp_path / "x").exists() and not (workspace / "files" /
                                                              "notes.md").exists()

            async with stdio_client(server(workspace, "bob")) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                got = await session.call_tool("kernos-files-read", {"path": "reports/r.md"})
                assert not got.is_error and text(got) == "# R\nmore\n", text(got)
                head = (await kernel.log(limit=1))[0]["op"]
                for tool, arguments in (
                        ("kernos-files-write", {"path": "reports/r.md", "data": "by bob"}),
                        ("kernos-files-append", {"path": "reports/r.md", "data": "by bob"}),
                        ("kernos-files-delete", {"path": "reports/r.md"})):
                    refused = await session.call_tool(tool, arguments)
                    assert refused.is_error and "file:write" in text(refused), text(refused)
                    assert refused.structured_content["error"]["kind"] == "denied"
                assert (await kernel.log(limit=1))[0]["op"] == head
                assert report.read_text() == "# R\nmore\n"
                denied = [record for record in await kernel.audit(principal="bob", limit=5)
                          if record["status"] == "denied"]
                assert len(denied) == 3, denied

            async with stdio_client(server(workspace, "alice")) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                gone = await session.call_tool("kernos-files-delete", {"path": "reports/r.md"})
                assert not gone.is_error, text(gone)
                assert gone.structured_content["files"]["deleted"] == ["reports/r.md"]
                assert not report.exists()
                missing = await session.call_tool("kernos-files-read", {"path": "reports/r.md"})
                assert missing.is_error
                assert missing.structured_content["error"]["kind"] == "unknown_file"

    asyncio.run(asyncio.wait_for(scenario(), TIMEOUT))
