"""What cannot persist is reported by name and path, and replaced by an explaining placeholder."""

from __future__ import annotations

import io
import socket
import sqlite3
import threading

import pytest

from kernos.serialize.pickler import Transient
from kernos.serialize.unpersisted import Unpersisted, UnpersistedValueError


def only(transients: list[Transient]) -> Transient:
    assert len(transients) == 1, transients
    return transients[0]


def test_open_file_is_reported_and_restored_as_a_placeholder(notebook, tmp_path, closing):
    notebook["log"] = closing(open(tmp_path / "log.txt", "w"))  # noqa: SIM115
    pickled = notebook.dump("log")
    transient = only(pickled.transients)
    assert (transient.name, transient.path) == ("log", "log")
    assert transient.type_name == "_io.TextIOWrapper"
    assert "open the file again" in transient.reason
    assert transient.obj is notebook["log"]
    placeholder = notebook.restore_from(pickled, ["log"])["log"]
    assert type(placeholder) is Unpersisted
    with pytest.raises(UnpersistedValueError) as raised:
        placeholder.write("more")
    message = str(raised.value)
    assert "log was a _io.TextIOWrapper that could not be persisted" in message
    assert "open the file again" in message


def test_socket_deep_inside_instances_is_named_by_its_attribute_path(notebook, closing):
    notebook.run("""
        class Session:
            def __init__(self, sock):
                self._sock = sock
                self.retries = 3
        class Client:
            def __init__(self, sock):
                self.session = Session(sock)
                self.url = "https://example.invalid"
    """)
    notebook["client"] = notebook["Client"](closing(socket.socket()))
    pickled = notebook.dump("client")
    transient = only(pickled.transients)
    assert (transient.name, transient.path) == ("client", "client.session._sock")
    assert transient.type_name == "socket.socket"
    assert "reconnect" in transient.reason
    client = notebook.restore_from(pickled, ["client"])["client"]
    assert type(client) is not notebook["Client"] and type(client).__name__ == "Client"
    assert client.url == "https://example.invalid"
    assert client.session.retries == 3
    assert type(client.session._sock) is Unpersisted
    assert client.session._sock.path == "client.session._sock"
    with pytest.raises(UnpersistedValueError, match="reconnect"):
        client.session._sock.send(b"x")


def test_several_live_resources_in_one_dict_each_get_a_placeholder(notebook, closing):
    connection = closing(sqlite3.connect(":memory:"))
    notebook["data"] = {
        "conn": connection,
        "cursor": closing(connection.cursor()),
        "worker": threading.Thread(target=print),
        "rows": [1, 2, 3],
        "nested": {"items": [("keep", 1)]},
    }
    pickled = notebook.dump("data")
    by_path = {t.path: t for t in pickled.transients}
    assert set(by_path) == {"data['conn']", "data['cursor']", "data['worker']"}
    assert by_path["data['conn']"].type_name == "sqlite3.Connection"
    assert by_path["data['cursor']"].type_name == "sqlite3.Cursor"
    assert by_path["data['worker']"].type_name == "threading.Thread"
    assert "start the thread again" in by_path["data['worker']"].reason
    assert all(t.name == "data" for t in pickled.transients)
    data = notebook.restore_from(pickled, ["data"])["data"]
    assert data["rows"] == [1, 2, 3]
    assert data["nested"] == {"items": [("keep", 1)]}
    assert [type(data[key]) for key in ("conn", "cursor", "worker")] == [Unpersisted] * 3
    assert data["conn"].path == "data['conn']"
    with pytest.raises(UnpersistedValueError, match="database connections"):
        data["conn"].execute("select 1")


def test_generator_is_a_placeholder_and_its_function_still_works(notebook):
    notebook.run("""
        def numbers():
            yield 1
            yield 2
        stream = numbers()
        next(stream)
    """)
    pickled = notebook.dump("stream", "numbers")
    transient = only(pickled.transients)
    assert (transient.path, transient.type_name) == ("stream", "generator")
    assert "call its generator function again" in transient.reason
    restored = notebook.restore_from(pickled, ["stream", "numbers"])
    with pytest.raises(UnpersistedValueError):
        next(iter(restored["stream"]))
    assert list(restored["numbers"]()) == [1, 2]


def test_coroutine_and_event_loop_are_placeholders(notebook, closing):
    import asyncio

    notebook.run("""
        async def fetch():
            return 1
    """)
    notebook["pending"] = closing(notebook["fetch"]())
    notebook["loop"] = closing(asyncio.new_event_loop())
    pickled = notebook.dump("pending", "loop")
    by_name = {t.name: t for t in pickled.transients}
    assert "paused frame" in by_name["pending"].reason
    assert "asyncio" in by_name["loop"].reason
    restored = notebook.restore_from(pickled, ["pending", "loop"])
    assert type(restored["pending"]) is Unpersisted
    assert type(restored["loop"]) is Unpersisted


def test_in_memory_streams_are_persisted_not_replaced(notebook):
    notebook["buffer"] = io.BytesIO(b"abc")
    notebook["text"] = io.StringIO("hello")
    pickled = notebook.dump("buffer", "text")
    assert pickled.transients == []
    restored = notebook.restore_from(pickled, ["buffer", "text"])
    assert restored["buffer"].getvalue() == b"abc"
    assert restored["text"].getvalue() == "hello"


def test_rollback_puts_the_live_objects_back_where_they_were(notebook, closing):
    live = closing(socket.socket())
    lines = closing(io.TextIOWrapper(io.BytesIO(b"x")))
    notebook["state"] = {"sock": live, "config": {"a": 1}, "handles": [lines]}
    pickled = notebook.dump("state")
    [state] = notebook.load(pickled, live=True)
    assert state["sock"] is live
    assert state["handles"][0] is lines
    assert state["config"] == {"a": 1}
    assert state is not notebook["state"]


def test_live_transients_line_up_with_transients_by_index(notebook, closing):
    first, second = closing(socket.socket()), closing(socket.socket())
    notebook["pair"] = [first, second]
    pickled = notebook.dump("pair")
    assert [t.obj for t in pickled.transients] == [first, second]
    [pair] = notebook.serializer.load(pickled.stream, [], live_transients=[first])
    assert pair[0] is first
    assert type(pair[1]) is Unpersisted  # no live object for index 1: a placeholder
    assert pair[1].path == "pair[1]"


def test_one_resource_in_two_roots_is_reported_once_and_restored_once(notebook, closing):
    shared = closing(socket.socket())
    notebook["a"] = {"sock": shared}
    notebook["b"] = [shared]
    pickled = notebook.dump("a", "b")
    transient = only(pickled.transients)
    assert (transient.name, transient.path) == ("a", "a['sock']")
    restored = notebook.restore_from(pickled, ["a", "b"])
    assert restored["b"][0] is restored["a"]["sock"]


def test_resource_in_a_function_default_and_closure(notebook, closing):
    notebook["sock"] = closing(socket.socket())
    notebook.run("""
        def send(data, channel=sock):
            return channel
        def make():
            held = sock
            return lambda: held
        fetch = make()
    """)
    assert only(notebook.dump("send").transients).path == "send.__defaults__[0]"
    assert only(notebook.dump("fetch").transients).path == "fetch.__closure__[0].cell_contents"
    restored = notebook.restore("send")
    assert type(restored["send"](b"")) is Unpersisted


def test_resource_in_partial_arguments_is_named_and_the_partial_kept(notebook, closing):
    import functools

    notebook["callback"] = functools.partial(print, closing(socket.socket()))
    transient = only(notebook.dump("callback").transients)
    assert (transient.name, transient.path) == ("callback", "callback.args[0]")
    assert transient.type_name == "socket.socket"
    restored = notebook.restore("callback")
    assert restored["callback"].func is print
    assert type(restored["callback"].args[0]) is Unpersisted


def test_resource_whose_path_cannot_be_named_is_reported_plainly_by_its_variable(
        notebook, closing):
    notebook["SIDE"] = [closing(socket.socket())]
    notebook.run("""
        class Lazy:
            def __reduce__(self):
                return (Lazy, (), {"sock": SIDE[0]})  # not reachable from the object
        lazy = Lazy()
    """)
    transient = only(notebook.dump("lazy").transients)
    assert (transient.name, transient.path) == ("lazy", "lazy")
    assert "somewhere" not in transient.path and "<" not in transient.path
    assert transient.reason.endswith("(it is somewhere inside lazy, on no path that could be "
                                     "named)")
    restored = notebook.restore("lazy")
    assert type(restored["lazy"].sock) is Unpersisted


def test_object_whose_reduce_raises_becomes_a_placeholder_with_the_error(notebook):
    notebook.run("""
        class Stubborn:
            def __init__(self):
                self.x = 1
            def __reduce__(self):
                raise RuntimeError("I refuse")
        bag = {"bad": [Stubborn()], "good": [1, 2]}
    """)
    pickled = notebook.dump("bag")
    transient = only(pickled.transients)
    assert transient.path == "bag['bad'][0]"
    assert transient.type_name == "__main__.Stubborn"
    assert transient.reason == "it cannot be pickled (RuntimeError: I refuse)"
    bag = notebook.restore_from(pickled, ["bag"])["bag"]
    assert bag["good"] == [1, 2]
    assert type(bag["bad"][0]) is Unpersisted


def test_locks_deep_inside_an_instance_come_back_new_released_and_usable(notebook):
    import pickle

    notebook.run("""
        import threading
        class Guarded:
            def __init__(self):
                self.lock = threading.Lock()
                self.reentrant = threading.RLock()
                self.condition = threading.Condition()
                self.ready = threading.Event()
                self.value = 42
        deep = {"level": [1, {"guarded": Guarded()}]}
        held = deep["level"][1]["guarded"]
        held.lock.acquire()
        held.reentrant.acquire()
    """)
    with pytest.raises(TypeError, match=r"_thread\.lock"):
        pickle.dumps(notebook["held"].lock)  # the C pickler refuses locks
    pickled = notebook.dump("deep")
    assert pickled.transients == []
    guarded = notebook.restore_from(pickled, ["deep"])["deep"]["level"][1]["guarded"]
    assert guarded.value == 42
    assert guarded.lock is not notebook["held"].lock
    # The threads that held them are not restored, so neither is their holding:
    # a lock held by a thread that no longer exists would block its first user forever.
    assert guarded.lock.acquire(timeout=1)
    assert guarded.reentrant.acquire(timeout=1)
    assert guarded.reentrant.acquire(timeout=1)
    assert guarded.condition.acquire(timeout=1)
    guarded.condition.notify_all()
    guarded.condition.release()
    guarded.ready.set()
    assert guarded.ready.wait(timeout=1)


def test_object_only_dill_can_pickle_goes_through_dill(notebook):
    """A getset descriptor no library keeps as a module global (``type.__dict__["__dict__"]``
    is one in the OpenAI Agents SDK, so once that is imported it is pickled by reference to
    that global, not through dill)."""
    import pickle

    notebook.run("""
        class Snapshot:
            def __init__(self, table):
                self.descriptor = int.__dict__["denominator"]
                self.size = len(table)
        snapshot = Snapshot({"a": 1, "b": 2})
    """)
    with pytest.raises(TypeError, match="getset_descriptor"):
        pickle.dumps(notebook["snapshot"].descriptor)
    pickled = notebook.dump("snapshot")
    assert pickled.transients == []
    assert b"\x8c\tfrom_dill" in pickled.stream  # the name of rebuild.from_dill
    snapshot = notebook.restore_from(pickled, ["snapshot"])["snapshot"]
    assert snapshot.descriptor is int.__dict__["denominator"]
    assert snapshot.size == 2


def test_value_nested_too_deeply_becomes_a_whole_placeholder_and_others_survive(notebook):
    deep: list[object] = []
    cursor = deep
    for _ in range(100_000):
        cursor.append([])
        cursor = cursor[0]  # type: ignore[assignment]
    notebook["deep"] = deep
    notebook["fine"] = {"a": [1, 2]}
    notebook["also_fine"] = "text"
    pickled = notebook.dump("fine", "deep", "also_fine")
    transient = only(pickled.transients)
    assert (transient.name, transient.path, transient.type_name) == ("deep", "deep", "list")
    assert transient.reason == "it is nested too deeply to pickle (recursion limit reached)"
    restored = notebook.restore_from(pickled, ["fine", "deep", "also_fine"])
    assert restored["fine"] == {"a": [1, 2]}
    assert restored["also_fine"] == "text"
    assert type(restored["deep"]) is Unpersisted
    assert "nested too deeply" in repr(restored["deep"])


def test_value_that_breaks_pickling_itself_is_replaced_whole(notebook):
    notebook.run("""
        class Broken:
            def __reduce_ex__(self, protocol):
                return 42  # not a valid reduction
        broken = {"inner": Broken()}
        fine = [1]
    """)
    pickled = notebook.dump("broken", "fine")
    transient = only(pickled.transients)
    assert (transient.name, transient.path) == ("broken", "broken")
    assert transient.reason.startswith("it cannot be pickled (")
    restored = notebook.restore_from(pickled, ["broken", "fine"])
    assert restored["fine"] == [1]
    assert type(restored["broken"]) is Unpersisted


def test_dict_key_with_a_broken_repr_does_not_lose_the_rest_of_the_value(notebook, closing):
    notebook.run("""
        class Opaque:
            def __repr__(self):
                raise ValueError("no repr for you")
        opaque = Opaque()
    """)
    notebook["table"] = {notebook["opaque"]: 1, "rows": [1, 2], "conn": closing(socket.socket())}
    pickled = notebook.dump("table")
    assert only(pickled.transients).path == "table['conn']"
    table = notebook.restore_from(pickled, ["table"])["table"]
    assert table["rows"] == [1, 2]
    assert type(table["conn"]) is Unpersisted


def test_placeholder_pickles_again_exactly_as_the_value_it_stands_for(notebook, closing):
    notebook["data"] = {"conn": closing(socket.socket()), "n": 1}
    pickled = notebook.dump("data")
    restored = notebook.restore_from(pickled, ["data"])
    again = restored.dump("data")
    assert again.stream == pickled.stream
    assert [t.info() for t in again.transients] == [t.info() for t in pickled.transients]
    assert again.transients[0].obj is restored["data"]["conn"]
    twice = notebook.restore_from(again, ["data"])
    assert twice["data"]["conn"] == restored["data"]["conn"]


def test_transient_info_is_plain_json_data(notebook, closing):
    notebook["sock"] = closing(socket.socket())
    transient = only(notebook.dump("sock").transients)
    assert transient.info() == {
        "name": "sock", "path": "sock", "type_name": "socket.socket",
        "reason": "network connections cannot be persisted; reconnect after a restore",
    }
    assert "obj" not in repr(transient)


class TestPlaceholder:
    @pytest.fixture
    def placeholder(self) -> Unpersisted:
        return Unpersisted(name="conn", path="data['conn']", type_name="sqlite3.Connection",
                           reason="reconnect after a restore", op=7)

    def test_every_use_raises_an_explaining_error(self, placeholder):
        expected = ("data['conn'] was a sqlite3.Connection that could not be persisted "
                    "(stored by op 7): reconnect after a restore")
        uses = [lambda: placeholder.cursor, lambda: placeholder(), lambda: iter(placeholder),
                lambda: bool(placeholder), lambda: setattr(placeholder, "x", 1)]
        for use in uses:
            with pytest.raises(UnpersistedValueError) as raised:
                use()
            assert str(raised.value) == expected

    def test_the_error_is_an_attribute_error_so_hasattr_is_false(self, placeholder):
        assert issubclass(UnpersistedValueError, AttributeError)
        assert not hasattr(placeholder, "execute")

    def test_its_own_fields_and_repr(self, placeholder):
        assert (placeholder.name, placeholder.path, placeholder.op) == ("conn", "data['conn']", 7)
        assert repr(placeholder) == ("<unpersisted sqlite3.Connection at data['conn']: "
                                     "reconnect after a restore>")

    def test_equality_and_hash_follow_path_type_and_reason(self, placeholder):
        same = Unpersisted(name="other", path="data['conn']", type_name="sqlite3.Connection",
                           reason="reconnect after a restore")
        different = Unpersisted(name="conn", path="data['x']", type_name="sqlite3.Connection",
                                reason="reconnect after a restore")
        assert placeholder == same and hash(placeholder) == hash(same)
        assert placeholder != different
        assert placeholder != "data['conn']"

    def test_plain_pickle_round_trip(self, placeholder):
        import pickle

        copy = pickle.loads(pickle.dumps(placeholder))
        assert copy == placeholder
        assert copy.op == 7 and copy.name == "conn"

    def test_without_op_the_explanation_omits_it(self):
        placeholder = Unpersisted(name="g", path="g", type_name="generator", reason="gone")
        assert placeholder.explain() == "g was a generator that could not be persisted: gone"
