"""A small edit next to a large value costs what the small value costs: names made in one
cell are grouped only by what they really share (see ``kernos.serialize.sharing``)."""

from __future__ import annotations

import pytest

pd = pytest.importorskip("pandas")


def spy_dumps(session, monkeypatch):  # type: ignore[no-untyped-def]
    calls: list[list[str]] = []
    original = session.image.serializer.dump

    def dump(roots, **kwargs):  # type: ignore[no-untyped-def]
        calls.append([name for name, _ in roots])
        return original(roots, **kwargs)

    monkeypatch.setattr(session.image.serializer, "dump", dump)
    return calls


def test_small_edit_next_to_a_large_series_made_in_the_same_cell(session, monkeypatch):
    session.run("import pandas as pd\n"
                "big = pd.Series(['x'] * 2_000_000)\n"
                "small = pd.Series(['a', 'b'])")
    image = session.image
    assert image.group_of["small"] != image.group_of["big"]
    dumps = spy_dumps(session, monkeypatch)
    report = session.run("small[0] = 'z'")
    assert report.changed == ["small"]
    assert dumps == [["small"]]  # big is neither pickled nor written again
    assert report.bytes_written < 4_000
    assert report.timings_ms["serialize"] < 100  # pickling big took far longer


def test_values_the_user_shares_are_still_one_group(session, reopen):
    session.run("import pandas as pd\n"
                "series = pd.Series([1.0, 2.0])\n"
                "holder = {'s': series}\n"
                "other = pd.Series([3.0])")
    image = session.image
    assert image.group_of["holder"] == image.group_of["series"]
    assert image.group_of["other"] != image.group_of["series"]
    restored = reopen(image.workspace)
    assert restored.namespace["holder"]["s"] is restored.namespace["series"]
