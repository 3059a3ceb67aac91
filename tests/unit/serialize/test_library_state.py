"""Library objects whose own pickling drops state come back whole."""

from __future__ import annotations

import pytest

from kernos.replay.digest import digest


def test_a_scikit_learn_bunch_keeps_its_items_attributes_and_identity(notebook):
    # Bunch.__setstate__ ignores the instance's attributes (its deprecated-key
    # warnings), so plain pickling brought it back without them.
    pytest.importorskip("sklearn")
    notebook.run("""
        from sklearn.datasets import load_iris
        iris = load_iris()
        iris.__dict__["_deprecated_key_to_warnings"] = {"old": "use new"}
        iris.note = "kept"
        both = [iris, iris]
    """)
    before = notebook["iris"]
    restored = notebook.restore("iris", "both")
    iris = restored["iris"]
    assert type(iris) is type(before)
    assert dict(vars(iris)) == dict(vars(before))
    assert iris.keys() == before.keys()
    assert (iris.data == before.data).all() and iris.note == "kept"
    assert digest(iris) == digest(before)
    assert restored["both"][0] is restored["both"][1]
    with pytest.warns(FutureWarning, match="use new"):
        iris["old"] = 1
        iris["old"]
