"""pandas 3 dtypes, and arrays whose memory comes from elsewhere (a PyCapsule, an object
exposing ``__array_interface__``), round-trip with equal content and dtype."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import pytest

ROWS = 20_000  # large enough for some buffers to travel out of band

MAKERS: dict[str, Callable[[], Any]] = {
    "str": lambda: pd.Series(["a", "bb", None] * 10),
    "string pyarrow": lambda: pd.Series(["a", "bb", None] * 10, dtype="string[pyarrow]"),
    "string python": lambda: pd.Series(["a", "bb", None] * 10, dtype="string[python]"),
    "categorical": lambda: pd.Series(pd.Categorical(["x", "y", "x"] * 10, ordered=True)),
    "datetime tz": lambda: pd.Series(pd.date_range("2024-01-01", periods=30, tz="Europe/Paris")),
    "timedelta": lambda: pd.Series(pd.to_timedelta(np.arange(30), unit="s")),
    "Int64": lambda: pd.Series([1, None, 3] * 10, dtype="Int64"),
    "Float64": lambda: pd.Series([1.5, None, 3.0] * 10, dtype="Float64"),
    "boolean": lambda: pd.Series([True, None, False] * 10, dtype="boolean"),
    "period": lambda: pd.Series(pd.period_range("2024-01", periods=30, freq="M")),
    "interval": lambda: pd.Series(pd.interval_range(0, 30)),
    "sparse": lambda: pd.Series(pd.arrays.SparseArray([0, 0, 1, 0, 2] * 6)),
    "int64 pyarrow": lambda: pd.Series([1, 2, None] * 10, dtype="int64[pyarrow]"),
    "large bool from comparing strings": lambda: pd.Series(["a", "b"] * ROWS) == "a",
    "bool from isin": lambda: pd.Series(list("abcd")).isin(["b", "c"]),
    "large float": lambda: pd.Series(np.linspace(0, 1, ROWS)),
}


@pytest.mark.parametrize("label", MAKERS)
def test_series_of_each_dtype_round_trips(notebook, label):
    notebook["series"] = MAKERS[label]()
    pickled = notebook.dump("series")
    assert pickled.transients == [], [t.reason for t in pickled.transients]
    restored = notebook.restore_from(pickled, ["series"])["series"]
    assert restored.dtype == notebook["series"].dtype
    pd.testing.assert_series_equal(restored, notebook["series"])


def test_frame_of_every_dtype_with_a_bool_column_from_a_comparison(notebook):
    frame = pd.DataFrame({label: make()[:30].reset_index(drop=True)
                          for label, make in MAKERS.items()})
    frame["flag"] = frame["str"] == "a"
    notebook["frame"] = frame
    pickled = notebook.dump("frame")
    assert pickled.transients == []
    restored = notebook.restore_from(pickled, ["frame"])["frame"]
    pd.testing.assert_frame_equal(restored, frame)
    assert list(restored.dtypes) == list(frame.dtypes)


def test_views_of_capsule_memory_still_share_it(notebook):
    values = (pd.Series(["a", "b", "c", "d"]) == "b").to_numpy()
    base = values
    while isinstance(base.base, np.ndarray):
        base = base.base
    assert type(base.base).__name__ == "PyCapsule"
    notebook["values"] = values
    notebook["tail"] = values[1:]
    restored = notebook.restore("values", "tail")
    np.testing.assert_array_equal(restored["values"], values)
    assert np.shares_memory(restored["values"], restored["tail"])


def test_array_on_an_object_that_exports_no_buffer(notebook):
    class Exposed:
        def __init__(self, array: Any) -> None:
            self.array = array
            self.__array_interface__ = array.__array_interface__

    source = np.arange(10.0)
    viewed = np.asarray(Exposed(source))
    assert type(viewed.base) is Exposed
    notebook["viewed"] = viewed
    pickled = notebook.dump("viewed")
    assert pickled.transients == []
    np.testing.assert_array_equal(notebook.restore_from(pickled, ["viewed"])["viewed"], source)
