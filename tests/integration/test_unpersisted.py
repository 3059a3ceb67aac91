"""Values that cannot persist: reported by name and path, live now, placeholders after a restore.

I3 says what cannot persist is reported at the op that created it, never
silently dropped, and never rebuilt by re-running code.  One kernel builds a
file, a socket, a thread, a generator and a sqlite3 connection (one nested
in a dict); the tests check the report, that the live objects keep working
in the session (also across later commits and a rollback), and what a new
kernel finds after ``kill -9``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import Kernel, Result

pytestmark = pytest.mark.kernel

CREATE = """
import socket, sqlite3, threading
handle = open({path!r}, "w")
left, right = socket.socketpair()
stop = threading.Event()
worker = threading.Thread(target=stop.wait, daemon=True)
worker.start()
numbers = (n * n for n in range(10))
data = {{"conn": sqlite3.connect(":memory:"), "x": 1, "rows": [1, 2, 3]}}
data["conn"].execute("create table t (v)")
"""

#: name -> (path in the report, type named in the report)
EXPECTED = {
    "handle": ("handle", "TextIOWrapper"),
    "left": ("left", "socket"),
    "right": ("right", "socket"),
    "worker": ("worker", "Thread"),
    "numbers": ("numbers", "generator"),
    "data": ("data['conn']", "Connection"),
}


def create(kernel: Kernel, tmp_path: Path) -> Result:
    result = kernel.run(CREATE.format(path=str(tmp_path / "live.txt")))
    assert result.status == "ok", result.errors
    return result


def test_the_op_that_creates_them_commits_and_names_each_path(
        kernel: Kernel, tmp_path: Path) -> None:
    result = create(kernel, tmp_path)
    assert result.committed, result.kernos
    reported = {info["path"]: info for info in result.kernos["unpersisted"]}
    assert set(reported) == {path for path, _ in EXPECTED.values()}
    for name, (path, type_fragment) in EXPECTED.items():
        info = reported[path]
        assert info["name"] == name
        assert type_fragment in info["type_name"]
        assert info["reason"], f"no reason given for {path}"
        # The cell's own output says it too, where the user is looking.
        assert path in result.notices and "cannot be persisted" in result.notices
    assert "data['x']" not in result.notices and "data['rows']" not in result.notices
    assert set(result.kernos["added"]) >= set(EXPECTED)

    # Reported at the op that created them, not again by ops that leave them alone.
    later = kernel.run("unrelated = 1")
    assert later.committed and later.kernos["unpersisted"] == []
    assert later.notices == later.stderr == ""


def test_live_objects_keep_working_in_the_session(kernel: Kernel, tmp_path: Path) -> None:
    create(kernel, tmp_path)
    used = kernel.run("""
handle.write("hello")
handle.flush()
left.sendall(b"ping")
received = right.recv(4)
data["conn"].execute("insert into t values (42)")
first = next(numbers)
alive = worker.is_alive()
data["x"] = 2
""")
    assert used.status == "ok" and used.committed, used.errors
    assert (tmp_path / "live.txt").read_text() == "hello"
    assert kernel.value("(received, first, alive, data['x'])") == (b"ping", 0, True, 2)
    # The commits in between did not replace or close the live objects.
    assert kernel.value("(next(numbers), data['conn'].execute('select v from t')."
                        "fetchall(), handle.closed)") == (1, [(42,)], False)


def test_a_rollback_keeps_the_live_objects(kernel: Kernel, tmp_path: Path) -> None:
    create(kernel, tmp_path)
    failed = kernel.run("data['x'] = 99\ndata['rows'].append(4)\n"
                        "data['conn'].execute('insert into t values (1)')\n1 / 0")
    assert failed.status == "error" and failed.rolled_back, failed.kernos
    assert kernel.value("(data['x'], data['rows'])") == (1, [1, 2, 3])
    # The connection put back is the live one, not a placeholder.
    assert kernel.value("type(data['conn']).__name__") == "Connection"
    assert kernel.value("data['conn'].execute('select count(*) from t').fetchone()") == (1,)
    assert kernel.value("(next(numbers), worker.is_alive())") == (0, True)


def test_after_kill9_each_is_a_placeholder_that_explains(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    kernel = kernel_factory()
    create(kernel, tmp_path)
    kernel.kill9()
    restored = kernel_factory(kernel.workspace)

    # The rest of data is intact; only the connection slot is a placeholder.
    assert restored.value("(data['x'], data['rows'], sorted(data))") == (
        1, [1, 2, 3], ["conn", "rows", "x"])
    for path, type_fragment in EXPECTED.values():
        text = restored.value(f"repr({path})")
        assert path in text and type_fragment in text and "persist" in text, text
        used = restored.run(f"{path}.anything")
        assert used.status == "error", f"{path} is usable after a restore"
        error = used.errors[0]
        assert error["ename"] == "UnpersistedValueError"
        assert path in error["evalue"] and "could not be persisted" in error["evalue"]
        assert used.rolled_back
    for use in ("data['conn'].execute('select 1')", "list(numbers)",
                "worker.start()", "handle.write('x')", "left.recv(1)", "bool(numbers)"):
        result = restored.run(use)
        assert result.status == "error", f"{use} worked on a placeholder"
        assert "could not be persisted" in result.errors[0]["evalue"], result.errors

    status = restored.run("%kernos status")
    assert status.status == "ok", status.errors
    for path, _ in EXPECTED.values():
        assert path in status.stdout, f"%kernos status does not list {path}"

    # The placeholders persist as placeholders: the user can rebind them in a new op.
    fixed = restored.run("import sqlite3\ndata['conn'] = sqlite3.connect(':memory:')")
    assert fixed.committed, fixed.kernos
    assert restored.value("data['conn'].execute('select 7').fetchone()") == (7,)


def test_a_new_unpersistable_value_is_reported_by_the_op_that_made_it(
        kernel: Kernel) -> None:
    first = kernel.run("import sqlite3\nconn = sqlite3.connect(':memory:')")
    assert [info["path"] for info in first.kernos["unpersisted"]] == ["conn"]
    again = kernel.run("conn = sqlite3.connect(':memory:')")
    assert again.committed
    assert [info["path"] for info in again.kernos["unpersisted"]] == ["conn"]
    assert "conn" in again.kernos["changed"]
    assert "conn (sqlite3.Connection) cannot be persisted" in again.notices


def test_status_after_a_restore_does_not_call_placeholders_live(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    kernel = kernel_factory()
    create(kernel, tmp_path)
    kernel.kill9()
    restored = kernel_factory(kernel.workspace)
    status = restored.run("%kernos status")
    assert "data['conn']" in status.stdout
    assert "live now" not in status.stdout


def test_other_unpicklable_values_are_reported_not_dropped(
        kernel_factory: Callable[..., Kernel]) -> None:
    kernel = kernel_factory()
    result = kernel.run("""
import sqlite3
class Holder:
    pass
holder = Holder()
holder.conn = sqlite3.connect(":memory:")
view = memoryview(b"abc")
class Stubborn:
    def __reduce__(self):
        raise TypeError("Stubborn refuses to be pickled")
box = [1, Stubborn()]
""")
    assert result.status == "ok" and result.committed, (result.errors, result.kernos)
    paths = {info["path"] for info in result.kernos["unpersisted"]}
    assert {"holder.conn", "view", "box[1]"} <= paths, paths
    assert "holder.conn" in result.notices and "box[1]" in result.notices
    kernel.kill9()
    restored = kernel_factory(kernel.workspace)
    assert restored.value("type(holder).__name__") == "Holder"
    assert "holder.conn" in restored.value("repr(holder.conn)")
    assert restored.value("box[0]") == 1
    assert "box[1]" in restored.value("repr(box[1])")
    assert "view" in restored.value("repr(view)")


def test_every_use_of_a_placeholder_explains(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    kernel = kernel_factory()
    create(kernel, tmp_path)
    kernel.kill9()
    restored = kernel_factory(kernel.workspace)
    unexplained = {}
    for use in ("next(numbers)", "len(data['conn'])", "data['conn'][0]",
                "with handle:\n    pass"):
        result = restored.run(use)
        assert result.status == "error", f"{use} worked on a placeholder"
        if "could not be persisted" not in result.errors[0]["evalue"]:
            unexplained[use] = result.errors[0]["evalue"]
    assert not unexplained, unexplained
