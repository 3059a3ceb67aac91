"""What a rollback undid is said, and values holding live resources are never replaced
by copies (kernos.op: AbortReport; kernos.image.rollback: Rollback._reload)."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from core_support import CoreEnv, abort


@pytest.fixture()
def env(tmp_path: Path) -> CoreEnv:
    opened = CoreEnv(tmp_path / "ws")
    yield opened
    opened.close()


def test_the_report_names_what_was_rebound_added_deleted_and_put_back(env: CoreEnv) -> None:
    env.run("tup = (1,)\nitems = [1]\ngone = 3\nimport random")
    report = abort(env, "tup = tuple(['foo', [1, 2], True])\nobj1 = obj2 = 1\n"
                        "items.append(2)\ndel gone\nrandom.random()\ntup[2] = False")
    assert (report.rebound, report.removed, report.deleted, report.reloaded) == (
        ["tup"], ["obj1", "obj2"], ["gone"], ["items"])
    assert report.random_reset
    assert report.summary() == (
        "rolled back — not kept: tup (rebound); obj1, obj2 (added); gone (deleted); "
        "items (changed in place); the random generators' state (drawn from or seeded)")
    assert report.undone()["added"] == ["obj1", "obj2"]
    assert env.ns["tup"] == (1,) and env.ns["items"] == [1] and env.ns["gone"] == 3


def test_a_report_of_nothing_says_so(env: CoreEnv) -> None:
    assert abort(env, "1/0").summary() == "rolled back — nothing had changed"


def test_a_dict_holding_a_live_resource_is_reset_in_place(env: CoreEnv) -> None:
    env.run("import sqlite3\ndb = {'conn': sqlite3.connect(':memory:'), 'n': 0, 'rows': []}\n"
            "alias = db")
    live, conn = env.ns["db"], env.ns["db"]["conn"]
    report = abort(env, "db['n'] += 1\ndb['rows'].append(1)\ndb['extra'] = 2\n1/0")
    assert report.reloaded == ["alias", "db"] or report.reloaded == ["db"]
    assert env.ns["db"] is live and env.ns["alias"] is live  # the very same dict
    assert live == {"conn": conn, "n": 0, "rows": []} and live["conn"] is conn
    assert conn.execute("select 1").fetchone() == (1,)  # still the live connection
    assert report.not_reset == []


def test_an_instance_of_a_cell_class_holding_a_socket_is_reset_in_place(
        env: CoreEnv) -> None:
    env.run("import socket\nclass Conn:\n    def __init__(self):\n"
            "        self.sock = socket.socket()\n        self.sent = []\nc = Conn()")
    live, sock = env.ns["c"], env.ns["c"].sock
    report = abort(env, "c.sent.append('x')\nc.more = 1\n1/0")
    assert report.reloaded == ["c"] and env.ns["c"] is live
    assert live.sent == [] and not hasattr(live, "more") and live.sock is sock
    sock.close()


class Client:
    """A library's client: live parts (a socket, a thread) inside its own state."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.worker = threading.Thread(target=lambda: None)
        self.pending: dict[int, str] = {}


def test_a_library_object_with_live_parts_is_kept_as_it_is_and_reported(
        env: CoreEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    module = types.ModuleType("kernos_test_library")
    module.Client = Client  # type: ignore[attr-defined]
    Client.__module__ = module.__name__
    monkeypatch.setitem(sys.modules, module.__name__, module)
    env.ns["Client"] = Client
    env.run("client = Client()\nsettings = {'retries': 1}")
    live = env.ns["client"]
    report = abort(env, "client.pending[1] = 'sent'\nsettings['retries'] = 2\n1/0")
    assert env.ns["client"] is live and live.pending == {1: "sent"}  # never a copy
    assert report.not_reset == ["client"] and report.reloaded == ["settings"]
    assert env.ns["settings"] == {"retries": 1}
    assert "could not be reset: client" in report.summary()
    live.sock.close()


def test_a_library_container_holding_a_live_part_is_kept_and_written_next(
        env: CoreEnv) -> None:
    env.run("import collections, socket\nlink = collections.deque([socket.socket(), 0])")
    live = env.ns["link"]
    report = abort(env, "link[1] = 5\n1/0")
    assert env.ns["link"] is live and live[1] == 5 and report.not_reset == ["link"]
    # The next commit writes it as it is now: the history catches up with the live value.
    committed = env.run("x = 1")
    assert "link" in committed.changed
    env.reopen()
    assert env.ns["link"][1] == 5
    live[0].close()
