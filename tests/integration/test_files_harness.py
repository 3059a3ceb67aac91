"""Files through the harness client against a real kernel process (``files_*`` requests).

An agent with ``file:write:reports/*`` writes and reads ``reports/r.md``, each
request one committed op of its own that survives ``kill -9``; one without the
grant is refused (``denied``) with nothing written and no snapshot; bad paths
(``../x``, ``/etc/passwd``, a NUL byte) are refused with an error that says
why; bytes travel as base64 and come back equal.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kernos.client import KernosClient
from kernos.client.errors import RequestError

pytestmark = pytest.mark.kernel

ENV = {"KERNOS_DURABILITY": "process"}


def _head(client: KernosClient) -> object:
    return client.log(limit=1)[0]["commit"]


def test_an_agent_writes_its_report_under_its_grant_and_one_without_is_denied(
        tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    report = workspace / "files" / "reports" / "r.md"
    with KernosClient.start(workspace, env=ENV) as client:
        client.add_agent("alice")
        client.add_agent("bob")
        client.grant("alice", "file:write:reports/*")
        client.grant("bob", "file:read:reports/*")

        written = client.write_file("reports/r.md", "# Findings\n", principal="alice")
        assert written["files"]["added"] == ["reports/r.md"], written
        assert written["commit"] == _head(client)
        assert client.log(limit=1)[0]["principal"] == "alice"
        appended = client.append_file("reports/r.md", "- one\n", principal="alice",
                                      key="alice-append-1")
        again = client.append_file("reports/r.md", "- one\n", principal="alice",
                                   key="alice-append-1")
        assert again["duplicate"] and again["op"] == appended["op"]
        assert client.read_file("reports/r.md", principal="alice") == "# Findings\n- one\n"
        assert client.read_file("reports/r.md", principal="bob") == "# Findings\n- one\n"
        assert report.read_text() == "# Findings\n- one\n"
        assert client.list_files("reports", principal="bob") == ["reports/r.md"]
        assert client.file_exists("reports/r.md", principal="bob")
        assert not client.file_exists("reports/none.md", principal="bob")

        head = _head(client)
        with pytest.raises(RequestError) as denied:
            client.write_file("reports/r.md", "overwritten by bob", principal="bob")
        assert denied.value.kind == "denied" and "file:write" in denied.value.message
        with pytest.raises(RequestError) as denied:
            client.delete_file("reports/r.md", principal="bob")
        assert denied.value.kind == "denied"
        with pytest.raises(RequestError) as denied:
            client.write_file("notes/x.md", "x", principal="alice")  # outside her glob
        assert denied.value.kind == "denied"
        assert report.read_text() == "# Findings\n- one\n"
        assert not (workspace / "files" / "notes").exists()
        assert _head(client) == head
        statuses = [record["status"] for record in client.audit(limit=3)]
        assert statuses.count("denied") == 3, statuses

        # What committed survives kill -9; the next kernel serves it to the next client.
        client.manager.kill()
        client.manager.restart()
        assert client.read_file("reports/r.md", principal="alice") == "# Findings\n- one\n"
        deleted = client.delete_file("reports/r.md", principal="alice")
        assert deleted["files"]["deleted"] == ["reports/r.md"]
        assert not report.exists()
        with pytest.raises(RequestError) as missing:
            client.read_file("reports/r.md", principal="alice")
        assert missing.value.kind == "unknown_file"


def test_bad_paths_are_refused_with_a_clear_error_and_change_nothing(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    with KernosClient.start(workspace, env=ENV) as client:
        client.add_agent("alice")
        client.grant("alice", "file:write:*")
        head = _head(client)
        for principal in ("alice", "human"):
            for bad, why in (("../x", "'..'"), ("/etc/passwd", "absolute"),
                             ("a\0b", "NUL"), ("reports/../../x", "'..'")):
                with pytest.raises(RequestError) as refused:
                    client.write_file(bad, "x", principal=principal)
                assert refused.value.kind == "invalid", refused.value
                assert why in refused.value.message, refused.value.message
                assert "refused" in refused.value.message
        with pytest.raises(RequestError) as refused:
            client.read_file("/etc/passwd")
        assert refused.value.kind == "invalid" and "absolute" in refused.value.message
        assert _head(client) == head
        assert not (tmp_path / "x").exists() and not (workspace / "x").exists()
        assert client.list_files() == []


def test_binary_data_round_trips_through_base64(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    blob = bytes(range(256)) * 1000 + b"\x00\xff\xfe"
    with KernosClient.start(workspace, env=ENV) as client:
        client.add_agent("alice")
        client.grant("alice", "file:write:data/*")
        assert client.write_file("data/blob.bin", blob, principal="alice")["bytes"] == len(blob)
        assert (workspace / "files" / "data" / "blob.bin").read_bytes() == blob
        assert client.read_file("data/blob.bin", principal="alice", binary=True) == blob
        assert client.read_file("data/blob.bin", binary=True) == blob
        with pytest.raises(RequestError) as not_text:
            client.read_file("data/blob.bin", principal="alice")
        assert not_text.value.kind == "invalid" and "base64" in not_text.value.message
        client.append_file("data/blob.bin", b"\x01\x02", principal="alice")
        assert client.read_file("data/blob.bin", binary=True) == blob + b"\x01\x02"
        # A malformed request (bad base64 sent by hand) is refused before anything runs.
        with pytest.raises(RequestError) as malformed:
            client.request("files_write", path="data/blob.bin", data="%%%",
                           encoding="base64")
        assert malformed.value.kind == "malformed" and "base64" in malformed.value.message
        assert client.read_file("data/blob.bin", binary=True) == blob + b"\x01\x02"
