"""An op that writes a few elements of a big array reads only the pieces holding them
(``kernos.image.written``), and only where nothing else can have changed the rest."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kernos.store.snapshots import CHUNK_BYTES, SnapshotWriter

ELEMENTS = 3 * CHUNK_BYTES // 8 + CHUNK_BYTES // 16  # 3.5 MiB of float64: four pieces


def pieces_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the big pieces each commit hashes from now on."""
    seen: list[int] = []
    original = SnapshotWriter.blob

    def blob(self: SnapshotWriter, data: Any, **options: Any) -> bytes:
        if len(data) >= CHUNK_BYTES // 2:
            seen.append(len(data))
        return original(self, data, **options)

    monkeypatch.setattr(SnapshotWriter, "blob", blob)
    return seen


def test_writing_one_element_reads_only_its_piece(session, reopen, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    session.run(f"import numpy as np\narr = np.arange({ELEMENTS}, dtype=np.float64)")
    seen = pieces_read(monkeypatch)
    report = session.run(f"arr[{CHUNK_BYTES // 8 + 5}] = -1.0\narr[-1] = -2.0")
    assert report.changed == ["arr"] and len(seen) == 2  # the second piece, and the last
    restored = reopen(session.image.workspace).namespace["arr"]
    expected = np.arange(ELEMENTS, dtype=np.float64)
    expected[CHUNK_BYTES // 8 + 5], expected[-1] = -1.0, -2.0
    assert np.array_equal(restored, expected)


@pytest.mark.parametrize("change", [
    "m[0].base.fill(7.0)",        # a row of a 2-D array is a view of all of it
    "m[True] = 7.0",              # a bool is a mask
])
def test_a_key_that_reaches_more_than_one_element_reads_everything(
    session, reopen, monkeypatch, change: str,
) -> None:  # type: ignore[no-untyped-def]
    shape = "(4, ELEMENTS // 4)" if "base" in change else "(ELEMENTS,)"
    session.run(f"import numpy as np\nELEMENTS = {ELEMENTS}\nm = np.zeros({shape})")
    seen = pieces_read(monkeypatch)
    session.run(change)
    assert len(seen) >= 3
    restored = reopen(session.image.workspace).namespace["m"]
    assert (restored == 7.0).all()


def test_an_array_sharing_its_memory_with_another_name_reads_everything(
    session, reopen, monkeypatch,
) -> None:  # type: ignore[no-untyped-def]
    session.run(f"import numpy as np\nbase = np.zeros({ELEMENTS})\ntail = base[8:]")
    seen = pieces_read(monkeypatch)
    session.run("tail[1] = 1.0\ntail.base[-1] = 2.0")
    assert len(seen) >= 3
    restored = reopen(session.image.workspace).namespace
    assert restored["base"][9] == 1.0 and restored["base"][-1] == 2.0
    assert restored["tail"].base is not None
