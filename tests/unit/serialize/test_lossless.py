"""Values with nothing left to lose persist quietly: rebuilt exactly where possible (closed
files, exhausted generators, closed connections), else a placeholder marked lossless."""

from __future__ import annotations

import io
import re
import socket
import sqlite3
import threading

import pytest

from kernos.serialize.unpersisted import Unpersisted


def same_repr(restored: object, original: object) -> None:
    strip = re.compile(r" at 0x[0-9a-f]+")
    assert strip.sub("", repr(restored)) == strip.sub("", repr(original))


@pytest.mark.parametrize(("mode", "kwargs"), [
    ("r", {}), ("w", {"encoding": "latin-1", "errors": "replace"}), ("a", {}),
    ("rb", {}), ("wb", {}), ("r+b", {}), ("ab", {}), ("rb", {"buffering": 0}),
    ("w+", {"newline": ""}),
], ids=["text-read", "text-write", "text-append", "bytes-read", "bytes-write", "bytes-random",
        "bytes-append", "raw", "text-random"])
def test_closed_file_comes_back_closed_of_the_same_type_name_and_mode(
        notebook, tmp_path, mode, kwargs):
    path = tmp_path / "data.txt"
    path.write_text("keep me")
    with open(path, mode, **kwargs) as handle:
        pass
    notebook["f"] = handle
    pickled = notebook.dump("f")
    assert pickled.transients == []
    path.write_text("keep me")  # a write mode truncated it; a restore must not
    restored = notebook.restore_from(pickled, ["f"])["f"]
    assert type(restored) is type(handle)
    assert restored.closed
    assert (restored.name, restored.mode) == (handle.name, handle.mode)
    same_repr(restored, handle)
    if "b" not in mode:
        assert (restored.encoding, restored.errors) == (handle.encoding, handle.errors)
    with pytest.raises(ValueError, match="closed file"):
        restored.read() if "r" in mode else restored.write("x" if "b" not in mode else b"x")
    assert path.read_text() == "keep me"
    assert notebook.restore_from(pickled, ["f"]).dump("f").stream == pickled.stream


def test_restoring_a_closed_file_whose_path_is_gone_creates_nothing(notebook, tmp_path):
    path = tmp_path / "gone.txt"
    with open(path, "x") as handle:
        handle.write("x")
    handle.custom = "kept"  # type: ignore[attr-defined]
    notebook["f"] = handle
    pickled = notebook.dump("f")
    path.unlink()
    restored = notebook.restore_from(pickled, ["f"])["f"]
    assert not path.exists()
    assert (restored.name, restored.mode, restored.custom) == (str(path), "x", "kept")


def test_closed_in_memory_streams_come_back_closed(notebook):
    first, second = io.BytesIO(b"abc"), io.StringIO("text")
    first.close()
    second.close()
    notebook["streams"] = [first, second]
    pickled = notebook.dump("streams")
    assert pickled.transients == []
    streams = notebook.restore_from(pickled, ["streams"])["streams"]
    assert [type(s) for s in streams] == [io.BytesIO, io.StringIO]
    assert all(s.closed for s in streams)


def test_closed_stream_that_cannot_be_rebuilt_is_a_lossless_placeholder(notebook):
    wrapped = io.BufferedReader(io.BytesIO(b"abc"))  # not over a FileIO: not rebuilt
    wrapped.close()
    notebook["wrapped"] = wrapped
    pickled = notebook.dump("wrapped")
    [transient] = pickled.transients
    assert transient.lossless
    assert transient.info()["lossless"] is True
    assert "nothing was lost" in transient.reason
    placeholder = notebook.restore_from(pickled, ["wrapped"])["wrapped"]
    assert type(placeholder) is Unpersisted and placeholder.lossless
    assert "with nothing left to keep" in placeholder.explain()
    again = notebook.restore_from(pickled, ["wrapped"]).dump("wrapped")
    assert again.transients[0].lossless and again.stream == pickled.stream


def test_open_file_is_still_reported_and_not_lossless(notebook, tmp_path, closing):
    notebook["f"] = closing(open(tmp_path / "open.txt", "w"))  # noqa: SIM115
    [transient] = notebook.dump("f").transients
    assert not transient.lossless
    assert "lossless" not in transient.info()


def test_exhausted_generator_comes_back_exhausted_with_the_same_names(notebook):
    notebook.run("""
        def numbers(start, *rest, step=1, **options):
            offset = 10
            def shifted(x):
                return x + offset
            yield shifted(start)
        done = numbers(1)
        list(done)
        closed = numbers(2)
        closed.close()
        class Holder:
            def items(self):
                yield 1
        method_made = Holder().items()
        list(method_made)
        expression = (x for x in [1])
        list(expression)
    """)
    names = ["done", "closed", "method_made", "expression"]
    pickled = notebook.dump(*names)
    assert pickled.transients == []
    restored = notebook.restore_from(pickled, names)
    for name in names:
        generator = restored[name]
        assert type(generator) is type(notebook[name])
        assert generator.gi_frame is None
        assert (generator.__name__, generator.__qualname__) == (
            notebook[name].__name__, notebook[name].__qualname__)
        same_repr(generator, notebook[name])
        assert list(generator) == []


def test_running_generator_is_still_a_reported_placeholder(notebook):
    notebook.run("""
        def numbers():
            yield 1
            yield 2
        stream = numbers()
        next(stream)
    """)
    [transient] = notebook.dump("stream").transients
    assert not transient.lossless and "paused frame" in transient.reason


def test_finished_coroutine_comes_back_finished(notebook):
    notebook.run("""
        async def answer():
            return 42
        finished = answer()
        try:
            finished.send(None)
        except StopIteration:
            pass
    """)
    pickled = notebook.dump("finished")
    assert pickled.transients == []
    coroutine = notebook.restore_from(pickled, ["finished"])["finished"]
    assert coroutine.cr_frame is None and coroutine.__qualname__ == "answer"
    with pytest.raises(RuntimeError, match="cannot reuse already awaited coroutine"):
        coroutine.send(None)


def test_finished_thread_is_lossless_unless_it_holds_attributes(notebook):
    plain = threading.Thread(target=print, args=("",))
    plain.start()
    plain.join()
    worker = threading.Thread(target=lambda: None)
    worker.start()
    worker.join()
    worker.result = 42  # type: ignore[attr-defined]
    notebook["plain"], notebook["worker"] = plain, worker
    by_name = {t.name: t for t in notebook.dump("plain", "worker").transients}
    assert by_name["plain"].lossless and "finished" in by_name["plain"].reason
    assert not by_name["worker"].lossless
    assert "(result) are lost" in by_name["worker"].reason


def test_closed_sqlite_connection_comes_back_closed(notebook):
    connection = sqlite3.connect(":memory:")
    connection.row_factory = sqlite3.Row
    cursor = connection.cursor()
    connection.close()
    notebook["connection"], notebook["cursor"] = connection, cursor
    pickled = notebook.dump("connection", "cursor")
    [transient] = pickled.transients
    assert (transient.path, transient.lossless) == ("cursor", True)
    restored = notebook.restore_from(pickled, ["connection", "cursor"])
    assert type(restored["connection"]) is sqlite3.Connection
    assert restored["connection"].row_factory is sqlite3.Row
    with pytest.raises(sqlite3.ProgrammingError, match="closed database"):
        restored["connection"].execute("select 1")


def test_open_sqlite_connection_is_still_reported(notebook, closing):
    notebook["connection"] = closing(sqlite3.connect(":memory:"))
    [transient] = notebook.dump("connection").transients
    assert not transient.lossless and "reconnect" in transient.reason


def test_closed_socket_is_lossless(notebook, closing):
    sock = socket.socket()
    sock.close()
    notebook["sock"], notebook["live"] = sock, closing(socket.socket())
    by_name = {t.name: t for t in notebook.dump("sock", "live").transients}
    assert by_name["sock"].lossless and not by_name["live"].lossless


def test_a_cell_that_reads_a_file_reports_nothing(session, tmp_path, reopen):
    path = tmp_path / "input.txt"
    path.write_text("line\n")
    report = session.run(f"with open({str(path)!r}) as f:\n    lines = f.readlines()")
    assert report.unpersisted == []
    restored = reopen(session.image.workspace).namespace
    assert restored["f"].closed and restored["f"].name == str(path)
    assert restored["lines"] == ["line\n"]
