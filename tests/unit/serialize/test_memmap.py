"""Memory-mapped arrays are stored by reference to their file: restored backed by it, free
to pickle, and a placeholder (not a failed group) if the file is gone."""

from __future__ import annotations

import numpy as np
import pytest

from kernos.serialize.unpersisted import Unpersisted

SIZE = 1_000_000  # float64: 8 MB, far more than any stream below


@pytest.fixture
def mapped(tmp_path):  # type: ignore[no-untyped-def]
    path = tmp_path / "data.bin"
    array = np.memmap(path, dtype="float64", mode="w+", shape=(SIZE,))
    array[:] = np.arange(SIZE)
    array.flush()
    return path, array


def test_memmap_is_stored_by_reference_and_restored_backed_by_its_file(notebook, mapped):
    path, array = mapped
    notebook["m"] = array
    pickled = notebook.dump("m")
    assert pickled.buffers == [] and len(pickled.stream) < 1024
    assert pickled.transients == []
    restored = notebook.restore_from(pickled, ["m"])["m"]
    assert type(restored) is np.memmap
    assert (restored.filename, restored.offset, restored.mode) == (array.filename, 0, "w+")
    assert str(restored.filename) == str(path)
    np.testing.assert_array_equal(restored, array)
    restored[3] = -1.0  # reopened as 'r+': writes reach the file, which is not truncated
    restored.flush()
    assert np.fromfile(path, dtype="float64")[3] == -1.0
    assert np.fromfile(path, dtype="float64").size == SIZE
    assert notebook.restore_from(pickled, ["m"]).dump("m").stream == pickled.stream


def test_views_of_a_memmap_share_the_restored_mapping(notebook, mapped):
    _, array = mapped
    notebook["m"] = array
    notebook["part"] = array[10:20]
    notebook["plain"] = np.asarray(array)[::1000]
    notebook["table"] = array[: SIZE // 2].reshape(-1, 2)
    names = ["m", "part", "plain", "table"]
    pickled = notebook.dump(*names)
    assert pickled.buffers == [] and len(pickled.stream) < 4096
    restored = notebook.restore_from(pickled, names)
    assert type(restored["part"]) is np.memmap and type(restored["plain"]) is np.ndarray
    for name in names[1:]:
        np.testing.assert_array_equal(restored[name], notebook[name])
        assert np.shares_memory(restored[name], restored["m"])
    restored["part"][0] = 123.0
    assert restored["m"][10] == 123.0


def test_a_view_alone_is_backed_by_the_right_place_in_the_file(notebook, mapped):
    path, array = mapped
    notebook["part"] = array[500_000:500_010]
    restored = notebook.restore("part")["part"]
    np.testing.assert_array_equal(restored, np.arange(500_000, 500_010, dtype="float64"))
    restored[0] = -5.0
    restored.flush()
    assert np.fromfile(path, dtype="float64")[500_000] == -5.0


def test_offset_into_the_file_and_a_read_only_npy_map(notebook, tmp_path):
    path = tmp_path / "headed.bin"
    with open(path, "wb") as file:
        file.write(b"HEADER!!" * 1000)  # 8,000 bytes before the data
        file.write(np.arange(100, dtype="int32").tobytes())
    notebook["headed"] = np.memmap(path, dtype="int32", mode="r", offset=8000, shape=(100,))
    np.save(tmp_path / "saved.npy", np.arange(50.0))
    notebook["loaded"] = np.load(tmp_path / "saved.npy", mmap_mode="r")
    restored = notebook.restore("headed", "loaded")
    np.testing.assert_array_equal(restored["headed"], np.arange(100, dtype="int32"))
    assert restored["headed"].offset == 8000
    np.testing.assert_array_equal(restored["loaded"], np.arange(50.0))
    assert not restored["headed"].flags.writeable and not restored["loaded"].flags.writeable


@pytest.mark.parametrize("change", ["deleted", "resized"])
def test_file_gone_or_resized_at_restore_gives_a_placeholder_and_the_group_loads(
        notebook, mapped, change):
    path, array = mapped
    notebook["m"] = array
    notebook["rows"] = [1, 2, 3]
    pickled = notebook.dump("m", "rows")
    del array, notebook.namespace["m"]
    if change == "deleted":
        path.unlink()
    else:
        with open(path, "ab") as file:
            file.write(b"\0" * 8)
    restored = notebook.restore_from(pickled, ["m", "rows"])
    assert restored["rows"] == [1, 2, 3]
    placeholder = restored["m"]
    assert type(placeholder) is Unpersisted
    assert (placeholder.name, placeholder.path, placeholder.type_name) == (
        "m", "m", "numpy.memmap")
    assert ("is gone" if change == "deleted" else "changed size") in placeholder.reason


def test_copy_on_write_map_is_kept_by_value_with_its_changes(notebook, mapped):
    path, _ = mapped
    private = np.memmap(path, dtype="float64", mode="c", shape=(SIZE,))
    private[0] = 42.0  # in memory only: never in the file
    notebook["private"] = private
    pickled = notebook.dump("private")
    assert pickled.buffers  # its content travels by value
    restored = notebook.restore_from(pickled, ["private"])["private"]
    assert type(restored) is np.memmap
    assert (str(restored.filename), restored.mode) == (str(path), "c")
    assert restored[0] == 42.0 and restored[1] == 1.0
    restored[1] = 7.0
    restored.flush()
    assert np.fromfile(path, dtype="float64")[:2].tolist() == [0.0, 1.0]


def test_an_edit_of_a_memmap_commits_almost_nothing(session, reopen, tmp_path):
    path = tmp_path / "big.bin"
    session.run(f"import numpy as np\n"
                f"m = np.memmap({str(path)!r}, dtype='float64', mode='w+', shape=({SIZE},))")
    report = session.run("m[7] = 7.0\nm.flush()")
    assert report.bytes_written < 20_000
    restored = reopen(session.image.workspace).namespace["m"]
    assert restored[7] == 7.0 and str(restored.filename) == str(path)
