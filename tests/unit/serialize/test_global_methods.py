"""Methods bound to the global random generators come back bound to the live generators,
so that seeding them governs the restored names as it did the originals."""

from __future__ import annotations

import random

import numpy as np


def test_methods_of_the_global_generators_are_bound_to_the_live_ones(notebook):
    notebook.run("""
        import random
        from random import normalvariate
        from numpy.random import randn
        shuffle = random.shuffle
        draws = {"normal": normalvariate, "numpy": randn}
    """)
    names = ["normalvariate", "randn", "shuffle", "draws"]
    pickled = notebook.dump(*names)
    assert len(pickled.stream) < 2_000  # no copy of a generator's state
    restored = notebook.restore_from(pickled, names)
    assert restored["normalvariate"].__self__ is random._inst  # type: ignore[attr-defined]
    assert restored["shuffle"].__self__ is random._inst  # type: ignore[attr-defined]
    assert restored["randn"].__self__ is np.random.mtrand._rand
    assert restored["draws"]["numpy"].__self__ is np.random.mtrand._rand
    np.random.seed(0)
    first = restored["randn"]()
    np.random.seed(0)
    assert restored["randn"]() == first
    random.seed(1)
    again = restored["normalvariate"](0, 1)
    random.seed(1)
    assert restored["normalvariate"](0, 1) == again


def test_methods_of_other_objects_keep_their_own_object(notebook):
    notebook.run("""
        import numpy as np
        import random
        mine = np.random.RandomState(5)
        draw = mine.randn
        local = random.Random(3)
        pick = local.random
        class Counter:
            def __init__(self):
                self.n = 0
            def bump(self):
                self.n += 1
        counter = Counter()
        bump = counter.bump
        get = {"a": 1}.get
    """)
    names = ["mine", "draw", "local", "pick", "counter", "bump", "get"]
    restored = notebook.restore(*names)
    assert restored["draw"].__self__ is restored["mine"]
    assert restored["pick"].__self__ is restored["local"]
    assert restored["draw"]() == notebook["draw"]()
    restored["bump"]()
    assert restored["counter"].n == 1
    assert restored["get"]("a") == 1


def test_a_rebound_global_is_not_trusted(notebook, monkeypatch):
    notebook.run("""
        import random
        from random import normalvariate
    """)
    bound_to = notebook["normalvariate"].__self__
    monkeypatch.setattr(random, "_inst", random.Random())  # the old generator is no global now
    restored = notebook.restore("normalvariate")["normalvariate"]
    assert restored.__self__ is not random._inst  # type: ignore[attr-defined]
    assert type(restored.__self__) is type(bound_to)
