"""numpy arrays and pandas frames: equal after a restore, large buffers out of band, editable."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kernos.serialize.pickler import OUT_OF_BAND_MIN_BYTES

LARGE = OUT_OF_BAND_MIN_BYTES // 8 * 4  # float64 elements: four times the threshold


def test_large_contiguous_array_travels_out_of_band_not_in_the_stream(notebook):
    notebook["big"] = np.arange(LARGE, dtype=np.float64)
    pickled = notebook.dump("big")
    assert [view.nbytes for view in pickled.buffers] == [LARGE * 8]
    assert len(pickled.stream) < 1024
    assert not pickled.buffers[0].readonly
    assert bytes(pickled.buffers[0]) == notebook["big"].tobytes()
    restored = notebook.restore_from(pickled, ["big"])
    assert restored["big"].dtype == np.float64
    np.testing.assert_array_equal(restored["big"], notebook["big"])


def test_buffer_exactly_at_the_threshold_goes_out_of_band_and_just_below_stays_in(notebook):
    notebook["at"] = np.zeros(OUT_OF_BAND_MIN_BYTES, dtype=np.uint8)
    notebook["below"] = np.zeros(OUT_OF_BAND_MIN_BYTES - 1, dtype=np.uint8)
    assert len(notebook.dump("at").buffers) == 1
    below = notebook.dump("below")
    assert below.buffers == []
    assert len(below.stream) >= OUT_OF_BAND_MIN_BYTES - 1


def test_small_array_stays_in_the_stream(notebook):
    notebook["small"] = np.arange(10, dtype=np.int32)
    pickled = notebook.dump("small")
    assert pickled.buffers == []
    restored = notebook.restore_from(pickled, ["small"])
    np.testing.assert_array_equal(restored["small"], np.arange(10, dtype=np.int32))
    assert restored["small"].dtype == np.int32


def test_non_contiguous_view_restores_equal_and_contiguous(notebook):
    base = np.arange(LARGE * 2, dtype=np.float64).reshape(-1, 4)
    notebook["strided"] = base[::2, 1:3]
    assert not notebook["strided"].flags.c_contiguous
    restored = notebook.restore("strided")
    np.testing.assert_array_equal(restored["strided"], notebook["strided"])
    assert restored["strided"].shape == notebook["strided"].shape


def test_fortran_ordered_array_keeps_its_order(notebook):
    notebook["fortran"] = np.asfortranarray(np.arange(LARGE, dtype=np.float64).reshape(-1, 8))
    pickled = notebook.dump("fortran")
    assert len(pickled.buffers) == 1
    restored = notebook.restore_from(pickled, ["fortran"])
    assert restored["fortran"].flags.f_contiguous
    np.testing.assert_array_equal(restored["fortran"], notebook["fortran"])


def test_object_dtype_and_structured_arrays(notebook):
    notebook["mixed"] = np.array([1, "two", None, {"k": [3]}], dtype=object)
    notebook["records"] = np.array([(1, 2.5), (2, 3.5)], dtype=[("id", "i4"), ("score", "f8")])
    restored = notebook.restore("mixed", "records")
    assert restored["mixed"].dtype == object
    assert list(restored["mixed"]) == [1, "two", None, {"k": [3]}]
    assert restored["records"].dtype == notebook["records"].dtype
    assert restored["records"]["score"].tolist() == [2.5, 3.5]


def test_read_only_array_gives_a_read_only_buffer_and_comes_back_read_only(notebook):
    frozen = np.arange(LARGE, dtype=np.float64)
    frozen.flags.writeable = False
    notebook["frozen"] = frozen
    pickled = notebook.dump("frozen")
    assert [view.readonly for view in pickled.buffers] == [True]
    restored = notebook.restore_from(pickled, ["frozen"])
    assert not restored["frozen"].flags.writeable
    np.testing.assert_array_equal(restored["frozen"], frozen)


def test_restored_array_is_writable_and_independent_of_the_original(notebook):
    notebook["weights"] = np.zeros(LARGE)
    restored = notebook.restore("weights")
    restored["weights"][123] = 8.0
    assert restored["weights"][123] == 8.0
    assert notebook["weights"][123] == 0.0


def test_one_array_in_two_variables_is_one_array_after_restore(notebook):
    notebook["a"] = np.ones(LARGE)
    notebook["b"] = {"same": notebook["a"]}
    pickled = notebook.dump("a", "b")
    assert len(pickled.buffers) == 1  # written once
    restored = notebook.restore_from(pickled, ["a", "b"])
    assert restored["b"]["same"] is restored["a"]


def test_numpy_scalars_and_dtypes(notebook):
    notebook["values"] = [np.float32(1.5), np.int64(7), np.dtype("datetime64[ns]"), np.bool_(True)]
    restored = notebook.restore("values")
    assert restored["values"] == notebook["values"]
    assert [type(v) for v in restored["values"]] == [type(v) for v in notebook["values"]]


def make_frame(rows: int = LARGE // 4) -> pd.DataFrame:
    return pd.DataFrame({
        "id": np.arange(rows, dtype=np.int64),
        "score": np.linspace(0.0, 1.0, rows),
        "label": pd.Categorical(["a", "b"] * (rows // 2)),
        "name": [f"row{i % 7}" for i in range(rows)],
    }, index=pd.RangeIndex(100, 100 + rows, name="key"))


def test_dataframe_values_dtypes_and_index_survive(notebook):
    notebook["frame"] = make_frame()
    pickled = notebook.dump("frame")
    assert pickled.buffers, "numeric blocks of a large frame should travel out of band"
    restored = notebook.restore_from(pickled, ["frame"])
    frame = restored["frame"]
    pd.testing.assert_frame_equal(frame, notebook["frame"])
    assert list(frame.dtypes.astype(str)) == list(notebook["frame"].dtypes.astype(str))
    assert frame.index.name == "key"
    assert frame.index[0] == 100


def test_dataframe_in_place_edits_after_restore(notebook):
    notebook["frame"] = make_frame()
    frame = notebook.restore("frame")["frame"]
    frame.loc[100, "score"] = -1.0
    frame.iat[1, 0] = 999
    frame["score"] *= 2
    frame["new"] = frame["id"] + 1
    assert frame.loc[100, "score"] == -2.0
    assert frame.iat[1, 0] == 999
    assert frame["new"].iloc[1] == 1000
    assert notebook["frame"].loc[100, "score"] == 0.0  # the original is untouched


def test_series_with_string_index_and_name(notebook):
    notebook["series"] = pd.Series([1.5, 2.5, None], index=["a", "b", "c"], name="metric")
    restored = notebook.restore("series")
    pd.testing.assert_series_equal(restored["series"], notebook["series"])
    restored["series"]["a"] = 10.0
    assert restored["series"]["a"] == 10.0


def test_multiindex_and_datetime_columns(notebook):
    index = pd.MultiIndex.from_product([["x", "y"], [1, 2]], names=["letter", "number"])
    notebook["frame"] = pd.DataFrame({
        "when": pd.date_range("2024-01-01", periods=4, freq="D", tz="UTC"),
        "value": [1.0, 2.0, 3.0, 4.0],
    }, index=index)
    restored = notebook.restore("frame")
    pd.testing.assert_frame_equal(restored["frame"], notebook["frame"])
    assert str(restored["frame"]["when"].dt.tz) == "UTC"


def test_frame_holding_cell_defined_objects(notebook):
    notebook.run("""
        class Tag:
            def __init__(self, text):
                self.text = text
        import pandas as pd
        tagged = pd.DataFrame({"tag": [Tag("a"), Tag("b")]})
    """)
    restored = notebook.restore("tagged")
    assert [tag.text for tag in restored["tagged"]["tag"]] == ["a", "b"]


@pytest.mark.parametrize("dtype", ["float32", "int8", "complex128", "bool"])
def test_large_arrays_of_several_dtypes_round_trip(notebook, dtype):
    notebook["array"] = (np.arange(LARGE) % 3).astype(dtype)
    restored = notebook.restore("array")
    assert restored["array"].dtype == np.dtype(dtype)
    np.testing.assert_array_equal(restored["array"], notebook["array"])
