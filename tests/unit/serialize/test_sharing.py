"""Shared references inside one dump, and recording which variables share objects."""

from __future__ import annotations

import datetime
import sys
import textwrap
import types

import pytest

from kernos.serialize.pickler import SharingRecord


def test_roots_of_one_dump_keep_shared_objects_identical(notebook):
    notebook.run("""
        a = {"x": [1, 2]}
        b = {"ref": a, "inner": a["x"]}
        c = [a, a["x"], b]
    """)
    restored = notebook.restore("a", "b", "c")
    a, b, c = restored["a"], restored["b"], restored["c"]
    assert b["ref"] is a
    assert b["inner"] is a["x"]
    assert c[0] is a and c[1] is a["x"] and c[2] is b
    a["x"].append(3)
    assert b["inner"] == [1, 2, 3]


def test_separate_dumps_do_not_share(notebook):
    notebook.run("""
        a = {"x": 1}
        b = {"ref": a}
    """)
    a = notebook.restore("a")["a"]
    b = notebook.restore("b")["b"]
    assert b["ref"] == a
    assert b["ref"] is not a


def test_self_referencing_containers(notebook):
    notebook.run("""
        loop = [1]
        loop.append(loop)
        graph = {"name": "root", "children": []}
        graph["children"].append({"name": "leaf", "parent": graph})
    """)
    restored = notebook.restore("loop", "graph")
    loop, graph = restored["loop"], restored["graph"]
    assert loop[1] is loop
    assert graph["children"][0]["parent"] is graph


def test_cycle_through_instances_of_cell_classes(notebook):
    notebook.run("""
        class Person:
            def __init__(self, name):
                self.name = name
                self.friends = set()
        ann, bob = Person("ann"), Person("bob")
        ann.friends.add(bob)
        bob.friends.add(ann)
        ann.me = ann
    """)
    restored = notebook.restore("ann", "bob")
    ann, bob = restored["ann"], restored["bob"]
    assert ann.friends == {bob}
    assert next(iter(bob.friends)) is ann
    assert ann.me is ann


def test_a_variable_bound_twice_under_two_names(notebook):
    notebook.run("""
        settings = {"lr": 0.1}
        alias = settings
    """)
    restored = notebook.restore("settings", "alias")
    assert restored["alias"] is restored["settings"]


def test_values_shared_with_a_function_closure_stay_shared(notebook):
    notebook.run("""
        history = []
        def make_logger(target):
            def log(item):
                target.append(item)
            return log
        log = make_logger(history)
    """)
    restored = notebook.restore("history", "log")
    restored["log"]("x")
    assert restored["history"] == ["x"]


def dump_recording(notebook, names):
    """Dump each name alone with one shared record, as an op does; name -> touched_owners."""
    record = SharingRecord()
    return {name: notebook.dump(name, record=record).touched_owners for name in names}


def test_recording_reports_a_root_reaching_objects_of_an_earlier_root(notebook):
    notebook.run("""
        a = {"x": [1, 2]}
        b = {"ref": a}
        c = [a["x"]]
        d = {"unrelated": [5]}
    """)
    touched = dump_recording(notebook, ["a", "b", "c", "d"])
    # c reaches a["x"], which both a and b reached before it: it meets both owners.
    assert touched == {"a": frozenset(), "b": frozenset({"a"}), "c": frozenset({"a", "b"}),
                       "d": frozenset()}


def test_recording_notes_objects_as_belonging_to_the_first_root_that_reached_them(notebook):
    shared = [1]
    notebook["first"] = {"s": shared}
    notebook["second"] = [shared]
    record = SharingRecord()
    notebook.dump("first", record=record)
    assert record.owner_of(shared) == "first"
    assert notebook.dump("second", record=record).touched_owners == {"first"}
    assert record.owner_of(shared) == "first"


def test_without_record_no_owners_are_reported(notebook):
    notebook.run("""
        a = [1]
        b = [a]
    """)
    notebook.dump("a")
    assert notebook.dump("b").touched_owners == frozenset()


IMMUTABLE_OR_BY_NAME = {
    "str": "a string shared by both",
    "int": 10 ** 30,
    "float": 3.25,
    "tuple": (1, 2, 3),
    "frozenset": frozenset({1, 2}),
    "bytes": b"bytes",
    "none": None,
    "bool": True,
    "range": range(10),
    "builtin class": int,
    "library class": datetime.datetime,
    "module": sys,
    "builtin function": len,
    "builtin method": datetime.datetime.now,
}


@pytest.mark.parametrize("value", IMMUTABLE_OR_BY_NAME.values(), ids=IMMUTABLE_OR_BY_NAME.keys())
def test_immutable_and_by_reference_objects_do_not_count_as_sharing(notebook, value):
    notebook["left"] = [value]
    notebook["right"] = {"same": value}
    touched = dump_recording(notebook, ["left", "right"])
    assert touched["right"] == frozenset()


def test_functions_and_classes_by_name_do_not_count_but_cell_ones_do(notebook):
    notebook.run("""
        import json
        class Local:
            pass
        def helper():
            return 1
        left = [json.dumps, json.JSONDecoder, Local, helper]
        right = [json.dumps, json.JSONDecoder]
        third = [Local]
        fourth = {"f": helper}
    """)
    touched = dump_recording(notebook, ["left", "right", "third", "fourth"])
    assert touched["right"] == frozenset()
    assert touched["third"] == {"left"}  # a class stored by value is shared state
    assert touched["fourth"] == {"left"}


def test_closures_in_separate_roots_are_reported_as_sharing_their_cell(notebook):
    notebook.run("""
        def pair():
            n = 0
            def inc():
                nonlocal n
                n += 1
            def get():
                return n
            return inc, get
        inc, get = pair()
    """)
    touched = dump_recording(notebook, ["inc", "get"])
    assert touched["get"] == {"inc"}


def test_sharing_through_instances_and_arrays_is_reported(notebook):
    np = pytest.importorskip("numpy")
    notebook.run("""
        class Holder:
            def __init__(self, payload):
                self.payload = payload
    """)
    notebook["weights"] = np.zeros(10)
    notebook["holder"] = notebook["Holder"](notebook["weights"])
    touched = dump_recording(notebook, ["weights", "holder"])
    assert touched["holder"] == {"weights"}


def test_recording_three_roots_reports_every_earlier_owner(notebook):
    notebook.run("""
        x = [1]
        y = [2]
        both = [x, y]
    """)
    touched = dump_recording(notebook, ["x", "y", "both"])
    assert touched["both"] == {"x", "y"}


def test_recording_with_an_unpersistable_value_still_reports_sharing(notebook, closing):
    import socket

    connection = closing(socket.socket())
    notebook["config"] = {"retries": 3}
    notebook["client"] = {"config": notebook["config"], "connection": connection}
    touched = dump_recording(notebook, ["config", "client"])
    assert touched["client"] == {"config"}


def test_cython_functions_do_not_count_as_sharing(notebook):
    pyarrow = pytest.importorskip("pyarrow")
    assert type(pyarrow.py_buffer).__name__ == "cython_function_or_method"
    notebook["left"] = [pyarrow.py_buffer]
    notebook["right"] = {"same": pyarrow.py_buffer}
    assert dump_recording(notebook, ["left", "right"])["right"] == frozenset()


def test_pandas_objects_made_together_share_nothing_of_the_users(notebook):
    pytest.importorskip("pandas")
    notebook.run("""
        import pandas as pd
        big = pd.Series(["x"] * 1000)
        small = pd.Series(["a", "b"])
        frame = pd.DataFrame({"n": [1, 2], "s": ["p", "q"]})
        flags = frame["n"] > 1
    """)
    touched = dump_recording(notebook, ["big", "small", "frame", "flags"])
    assert touched == {"big": frozenset(), "small": frozenset(), "frame": frozenset(),
                       "flags": frozenset()}


def test_pandas_objects_the_user_shares_still_share(notebook):
    pytest.importorskip("pandas")
    notebook.run("""
        import pandas as pd
        series = pd.Series([1.0, 2.0])
        one = [series]
        two = {"s": series}
    """)
    touched = dump_recording(notebook, ["one", "two"])
    assert touched["two"] == {"one"}
    restored = notebook.restore("one", "two")
    assert restored["one"][0] is restored["two"]["s"]


def test_user_objects_next_to_library_internals_still_share(notebook):
    # Library objects in the same dumps make the record look for class attributes
    # and module globals; the user's own objects must still count.
    pytest.importorskip("pandas")
    notebook.run("""
        import pandas as pd
        config = {"lr": 0.1}            # a global of the namespace itself
        class Registry:
            entries = []                # a class attribute of a class defined in a cell
        left = [config, Registry.entries, pd.Series([1])]
        right = [config, pd.Series([2])]
        third = [Registry.entries, pd.Series([3])]
    """)
    touched = dump_recording(notebook, ["left", "right", "third"])
    assert touched["right"] == {"left"}
    assert touched["third"] == {"left"}


def test_a_library_class_attribute_held_by_the_user_still_shares(notebook):
    notebook.run("""
        import logging
        handlers = logging.Logger.manager.loggerDict   # a library object, held directly
        again = [handlers]
    """)
    assert dump_recording(notebook, ["handlers", "again"])["again"] == {"handlers"}



def test_a_library_global_both_names_hold_in_their_own_structure_still_shares(notebook):
    notebook.run("""
        import logging
        first = {"manager": logging.Logger.manager, "n": 1}   # a library class attribute
        second = [logging.Logger.manager]
        third = {"root": logging.root}                         # a library module global
        fourth = (logging.root,)
    """)
    touched = dump_recording(notebook, ["first", "second", "third", "fourth"])
    assert "first" in touched["second"]
    assert "third" in touched["fourth"]
    restored = notebook.restore("first", "second")
    assert restored["first"]["manager"] is restored["second"][0]


def test_matplotlib_figures_made_together_share_nothing_of_the_users(notebook):
    # Every artist holds matplotlib's own objects: the list rcParams["path.effects"]
    # (an item of a library settings dict) and the paths of the marker styles (held
    # in the state of library objects).  Two figures are still two groups.
    pytest.importorskip("matplotlib")
    notebook.run("""
        import matplotlib
        matplotlib.use("agg")
        import matplotlib.pyplot as plt
        fig = plt.figure()
        ax1 = fig.add_subplot(2, 2, 1)
        ax1.plot([0, 1, 2], "o-")
        fig2, ax = plt.subplots()
        ax.plot([1, 2, 3], "k--")
        ax.set_title("t")
    """)
    touched = dump_recording(notebook, ["fig", "fig2", "ax1", "ax"])
    assert touched["fig2"] == frozenset()
    assert touched["ax1"] == {"fig"}
    assert touched["ax"] == {"fig2"}


def test_an_item_of_a_library_settings_dict_the_user_holds_still_shares(notebook):
    pytest.importorskip("matplotlib")
    notebook.run("""
        import matplotlib
        effects = matplotlib.rcParams["path.effects"]
        first = [effects, 1]
        second = {"effects": effects}
    """)
    touched = dump_recording(notebook, ["first", "second"])
    assert touched["second"] == {"first"}
    restored = notebook.restore("first", "second")
    assert restored["first"][0] is restored["second"]["effects"]


def test_what_a_library_object_holds_is_still_shared_when_a_name_holds_it_too(
        notebook, monkeypatch):
    # A library class attribute that instances keep in their state (as pandas
    # keeps _metadata) is the library's; a list inside it that a name holds in
    # its own dict is the user's, so that name and an instance still share it.
    library = types.ModuleType("kernos_test_settings_lib")
    exec(textwrap.dedent("""
        class Settings:
            def __init__(self):
                self.values = [1, 2]

        class Widget:
            defaults = Settings()

            def __init__(self):
                self.settings = Widget.defaults
    """), vars(library))
    monkeypatch.setitem(sys.modules, library.__name__, library)
    notebook["lib"] = library
    notebook.run("""
        values = lib.Widget.defaults.values
        mine = {"values": values, "widget": lib.Widget()}
        other = lib.Widget()
    """)
    touched = dump_recording(notebook, ["mine", "other"])
    assert touched["other"] == {"mine"}
    restored = notebook.restore("mine", "other")
    assert restored["mine"]["values"] is restored["other"].settings.values
