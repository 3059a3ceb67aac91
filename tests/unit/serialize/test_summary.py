"""describe() gives a bounded one-line summary of any value and never raises."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kernos.serialize.summary import describe, type_name

LIMIT = 80


class ReprRaises:
    def __repr__(self) -> str:
        raise ValueError("broken repr")


class ReprHuge:
    def __repr__(self) -> str:
        return "line\n" * 10_000


class ReprNotAString:
    def __repr__(self):  # type: ignore[no-untyped-def]
        return 42


class ShapeRaises:
    """A callable whose attribute lookup raises something other than AttributeError."""

    def __call__(self) -> None:
        return None

    def __getattr__(self, name: str) -> object:
        raise RuntimeError(f"no {name}")


@pytest.mark.parametrize("value", [
    ReprRaises(), ReprHuge(), ReprNotAString(), ShapeRaises(), object(),
    "x" * 10_000, b"y" * 10_000, list(range(100_000)), {i: str(i) for i in range(1000)},
    set(range(1000)), tuple(range(50)), frozenset({1}), [[[[["deep"]]]]],
    {"k": ReprRaises()}, [ReprRaises()] * 10, None, 3.5, 10 ** 500, "multi\nline\ttext",
], ids=lambda value: type(value).__name__)
def test_never_raises_and_stays_on_one_bounded_line(value):
    text = describe(value)
    assert isinstance(text, str)
    assert 0 < len(text) <= LIMIT
    assert "\n" not in text and "\t" not in text


def test_long_text_is_cut_with_an_ellipsis():
    for value in ("x" * 10_000, {f"key number {i}": i for i in range(1000)}, ReprHuge()):
        text = describe(value)
        assert "..." in text
        assert len(text) <= LIMIT


def test_short_values_are_their_repr():
    assert describe(3) == "3"
    assert describe("ab") == "'ab'"
    assert describe([1, 2]) == "[1, 2]"
    assert describe(None) == "None"


def test_large_containers_give_their_length():
    assert describe(list(range(1000))).startswith("list of 1000: [0, 1, 2")
    assert describe({i: i for i in range(10)}).startswith("dict of 10: ")
    assert describe(set(range(7))).startswith("set of 7: ")


def test_functions_and_classes_give_their_qualified_name():
    class Local:
        def method(self) -> None:
            return None

    assert describe(describe) == "function describe"
    assert describe(Local) == ("class test_functions_and_classes_give_their_qualified_name"
                               ".<locals>.Local")
    assert describe(Local.method).startswith("function ")


def test_a_repr_that_raises_is_summarised_by_type():
    text = describe(ReprRaises())
    assert "ReprRaises" in text
    assert "broken repr" not in text


def test_numpy_arrays_are_described_by_dtype_and_shape_without_repr():
    def no_repr(self: object) -> str:
        raise AssertionError("repr must not be called for an array")

    # ndarray itself cannot be patched: a subclass that numpy could have defined can.
    loud = type("LoudArray", (np.ndarray,), {"__module__": "numpy.loud", "__repr__": no_repr,
                                              "__str__": no_repr})
    array = np.zeros((3, 4), dtype=np.float32).view(loud)
    big = np.zeros(10_000_000, dtype=np.uint8).view(loud)
    assert describe(array) == "ndarray float32[3x4]"
    assert describe(big) == "ndarray uint8[10000000]"
    assert describe(np.zeros((2, 0, 5))) == "ndarray float64[2x0x5]"


def test_numpy_scalars_and_single_elements_show_their_value():
    assert describe(np.float64(2.5)).startswith("float64 ")
    assert "2.5" in describe(np.float64(2.5))
    assert describe(np.array(7)).startswith("int64 ")


def test_pandas_objects_are_described_by_shape_without_repr(monkeypatch):
    frame = pd.DataFrame({"a": range(5), "b": range(5)})
    series = pd.Series(range(12))

    def no_repr(self: object) -> str:
        raise AssertionError("repr must not be called for a frame")

    monkeypatch.setattr(pd.DataFrame, "__repr__", no_repr)
    monkeypatch.setattr(pd.Series, "__repr__", no_repr)
    assert describe(frame) == "DataFrame 5x2"
    assert describe(series) == "Series 12"


def test_placeholders_are_described_without_raising():
    from kernos.serialize.unpersisted import Unpersisted

    placeholder = Unpersisted(name="conn", path="conn", type_name="socket.socket",
                              reason="reconnect after a restore")
    text = describe(placeholder)
    assert text.startswith("<unpersisted socket.socket")
    assert text.endswith("reconnect after a restore>")


def test_type_name_qualifies_by_module_except_builtins_and_main():
    assert type_name(1) == "int"
    assert type_name(np.zeros(1)) == "numpy.ndarray"
    assert type_name(pd.DataFrame()).startswith("pandas.")
    assert type_name(pd.DataFrame()).endswith(".DataFrame")
    main_class = type("FromCell", (), {"__module__": "__main__"})
    assert type_name(main_class()) == "FromCell"
    assert type_name(ReprRaises()) == f"{__name__}.ReprRaises"
