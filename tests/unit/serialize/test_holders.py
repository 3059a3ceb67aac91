"""What cannot persist inside a library object replaces that object whole, under the user's
path; inside the user's own containers only the bad element is replaced (see
``kernos.serialize.unpersistable``)."""

from __future__ import annotations

import logging
import socket

import numpy as np
import pandas as pd
import pytest

from kernos.serialize.unpersisted import Unpersisted, UnpersistedValueError


def only(transients):  # type: ignore[no-untyped-def]
    assert len(transients) == 1, [(t.path, t.reason) for t in transients]
    return transients[0]


@pytest.fixture
def csv_file(tmp_path):  # type: ignore[no-untyped-def]
    path = tmp_path / "table.csv"
    pd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", "z"]}).to_csv(path, index=False)
    return path


def test_hdf_store_is_one_placeholder_named_by_its_variable_and_its_group_restores(
        notebook, tmp_path, closing):
    pytest.importorskip("tables")
    store = closing(pd.HDFStore(tmp_path / "data.h5"))
    store["frame"] = pd.DataFrame({"a": [1.0, 2.0]})
    notebook["store"] = store
    notebook["frame"] = pd.DataFrame({"b": [3, 4]})
    pickled = notebook.dump("store", "frame")
    transient = only(pickled.transients)
    assert (transient.name, transient.path, transient.type_name) == (
        "store", "store", "pandas.HDFStore")
    assert transient.reason.startswith("it holds an open file (tables.file.File at "
                                       "store._handle)")
    assert transient.obj is store
    restored = notebook.restore_from(pickled, ["store", "frame"])  # no load failure
    pd.testing.assert_frame_equal(restored["frame"], notebook["frame"])
    with pytest.raises(UnpersistedValueError, match=r"store was a pandas\.HDFStore"):
        restored["store"].keys()


def test_csv_chunk_reader_is_one_placeholder(notebook, csv_file):
    notebook["chunker"] = pd.read_csv(csv_file, chunksize=1)
    try:
        transient = only(notebook.dump("chunker").transients)
    finally:
        notebook["chunker"].close()
    assert (transient.path, transient.type_name) == (
        "chunker", "pandas.io.parsers.readers.TextFileReader")
    assert "open file (_io.BufferedReader at chunker.handles.handle)" in transient.reason


def test_excel_file_is_one_placeholder(notebook, tmp_path):
    pytest.importorskip("openpyxl")
    pd.DataFrame({"a": [1, 2]}).to_excel(tmp_path / "book.xlsx")
    with pd.ExcelFile(tmp_path / "book.xlsx") as book:
        notebook["xlsx"] = book
        transient = only(notebook.dump("xlsx").transients)
    assert (transient.path, transient.type_name) == ("xlsx", "pandas.ExcelFile")
    assert "open file" in transient.reason and "xlsx._reader" in transient.reason


def test_npz_file_says_what_it_holds(notebook, tmp_path):
    np.savez(tmp_path / "arrays.npz", a=np.arange(3))
    with np.load(tmp_path / "arrays.npz") as archive:
        notebook["npz"] = archive
        transient = only(notebook.dump("npz").transients)
    assert transient.path == "npz"
    assert "__class__" not in transient.reason
    assert transient.reason.startswith("it holds an open file (_io.BufferedReader at npz.fid)")


def test_library_object_in_a_users_dict_is_named_by_the_users_path(notebook, tmp_path):
    handler = logging.FileHandler(tmp_path / "log.txt", delay=False)
    try:
        notebook["data"] = {"log": handler, "rows": [1, 2], "level": handler.level}
        pickled = notebook.dump("data")
    finally:
        handler.close()
    transient = only(pickled.transients)
    assert (transient.name, transient.path, transient.type_name) == (
        "data", "data['log']", "logging.FileHandler")
    assert transient.reason.startswith(
        "it holds an open file (_io.TextIOWrapper at data['log'].stream)")
    data = notebook.restore_from(pickled, ["data"])["data"]
    assert data["rows"] == [1, 2]
    assert type(data["log"]) is Unpersisted


def test_library_object_inside_a_cell_class_instance(notebook, closing):
    notebook["sock"] = closing(socket.socket())
    notebook.run("""
        import logging
        class Service:
            def __init__(self, sock):
                self.handler = logging.StreamHandler(sock.makefile("w"))
                self.name = "svc"
        service = Service(sock)
        del sock
    """)
    try:
        transient = only(notebook.dump("service").transients)
    finally:
        notebook["service"].handler.stream.close()
    assert transient.path == "service.handler"
    assert transient.type_name == "logging.StreamHandler"
    assert "service.handler.stream" in transient.reason


@pytest.mark.parametrize("where", ["dict", "list", "tuple", "set", "instance", "array",
                                   "series", "frame"])
def test_data_containers_lose_only_the_bad_element(notebook, closing, where):
    sock = closing(socket.socket())
    notebook.run("""
        class Box:
            def __init__(self, held):
                self.held = held
                self.kept = "kept"
    """)
    grid = np.empty(3, dtype=object)
    grid[:] = [1, sock, "kept"]
    values = {
        "dict": ({"bad": sock, "good": "kept"}, "value['bad']"),
        "list": ([sock, "kept"], "value[0]"),
        "tuple": (("kept", sock), "value[1]"),
        "set": ({sock, "kept"}, "value.<set element>"),
        "instance": (notebook["Box"](sock), "value.held"),
        "array": (grid, "value[1]"),
        "series": (pd.Series(["kept", sock], dtype=object), "value.iloc[1]"),
        "frame": (pd.DataFrame({"n": [1, 2], "held": ["kept", sock]}), "value.iloc[1, 1]"),
    }
    notebook["value"], path = values[where]
    pickled = notebook.dump("value")
    transient = only(pickled.transients)
    assert (transient.path, transient.type_name) == (path, "socket.socket")
    restored = notebook.restore_from(pickled, ["value"])["value"]
    assert type(restored) is type(notebook["value"]) or where == "instance"
    if where == "frame":
        assert restored["n"].tolist() == [1, 2] and restored["held"][0] == "kept"
        assert type(restored["held"][1]) is Unpersisted


def test_library_object_in_a_frame_cell_is_replaced_in_that_cell_only(notebook, tmp_path):
    handler = logging.FileHandler(tmp_path / "log.txt")
    try:
        notebook["frame"] = pd.DataFrame({"n": [1, 2], "handler": [None, handler]})
        pickled = notebook.dump("frame")
    finally:
        handler.close()
    transient = only(pickled.transients)
    assert (transient.path, transient.type_name) == ("frame.iloc[1, 1]", "logging.FileHandler")
    frame = notebook.restore_from(pickled, ["frame"])["frame"]
    assert frame["n"].tolist() == [1, 2]
    assert type(frame["handler"][1]) is Unpersisted


def test_bound_method_of_an_open_file_is_replaced_whole_and_its_group_loads(
        notebook, tmp_path, closing):
    handle = closing(open(tmp_path / "out.txt", "w"))  # noqa: SIM115
    notebook["write"] = handle.write
    notebook["rows"] = [1, 2]
    pickled = notebook.dump("write", "rows")
    transient = only(pickled.transients)
    assert (transient.path, transient.type_name) == ("write", "builtin_function_or_method")
    assert "open file (_io.TextIOWrapper at write.__self__)" in transient.reason
    restored = notebook.restore_from(pickled, ["write", "rows"])
    assert restored["rows"] == [1, 2]
    assert type(restored["write"]) is Unpersisted


def test_one_library_object_holding_several_bad_objects_gives_one_notice(notebook, closing):
    notebook.run("""
        import logging
    """)
    first, second = closing(socket.socket()), closing(socket.socket())
    adapter = logging.LoggerAdapter(logging.getLogger("kernos.test"), {"a": first, "b": second})
    notebook["adapter"] = adapter
    transient = only(notebook.dump("adapter").transients)
    assert transient.path == "adapter"
    assert "network connection (socket.socket at adapter.extra['a'])" in transient.reason


def test_looking_for_what_a_mock_holds_leaves_the_mock_as_it_was(notebook):
    from unittest.mock import MagicMock

    mock = MagicMock(spec_set=dict)  # looks like a dict, and cannot be pickled
    notebook["mock"] = mock
    transient = only(notebook.dump("mock").transients)
    assert transient.reason.startswith("it cannot be pickled"), transient.reason
    # Looking for a held resource asks for close, closed and isopen, never through a
    # mock's __getattr__, which would make each of them a child mock (and so on).
    made = {name for child in mock._mock_children.values()
            for name in getattr(child, "_mock_children", {})}
    assert not made & {"close", "closed", "isopen"}, made
