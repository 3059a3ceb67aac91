"""The global generators' state is part of the image (kernos.determinism, I9, I1, I7).

A seed set in one op governs the next ops exactly as in plain Python, across
restores; an op that rolls back puts the generators back; a checkout brings
back the snapshot's state; a workspace that never seeded starts from a state
derived from its identity, numpy's included, in a fresh process.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy
import pytest

from core_support import CoreEnv
from kernos import determinism

SEEDED = "import random\nimport numpy as np\nrandom.seed(1)\nnp.random.seed(12345)"


def plain_python(count: int) -> tuple[list[float], list[float]]:
    """What the same draws give in plain Python, seeded as SEEDED seeds."""
    generator = random.Random(1)
    legacy = numpy.random.RandomState(12345)
    return ([generator.random() for _ in range(count)],
            [legacy.standard_normal() for _ in range(count)])


def draw(env: CoreEnv, name: str) -> tuple[float, float]:
    env.run(f"{name} = (random.random(), np.random.standard_normal())")
    value = env.ns[name]
    assert isinstance(value, tuple)
    return value


def test_a_seed_governs_the_next_ops_as_in_plain_python(tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "ws")
    env.run(SEEDED)
    got = [draw(env, f"d{index}") for index in range(3)]
    python, legacy = plain_python(3)
    assert got == list(zip(python, legacy, strict=True))


def test_the_stream_continues_after_a_restore(tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "ws")
    env.run(SEEDED)
    first = draw(env, "a")
    env.reopen()  # a kernel restart
    second = draw(env, "b")
    python, legacy = plain_python(2)
    assert [first, second] == list(zip(python, legacy, strict=True))


def test_a_rolled_back_op_puts_the_generators_back_and_says_so(tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "ws")
    env.run(SEEDED)
    op = env.image.begin(source="x = random.random(); 1/0")
    random.random()
    numpy.random.standard_normal()
    report = op.abort(error=ZeroDivisionError("division by zero"))
    assert report.random_reset
    after = draw(env, "a")
    python, legacy = plain_python(1)
    assert after == (python[0], legacy[0])
    quiet = env.image.begin(source="y = 1; 1/0")
    assert not quiet.abort(error=ZeroDivisionError("division by zero")).random_reset


def test_an_op_that_draws_nothing_stores_no_new_state(tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "ws")
    env.run(SEEDED)
    stored = env.image.committed[determinism.STATE_NAME]
    report = env.run("x = 1")
    assert determinism.STATE_NAME not in report.changed
    assert env.image.committed[determinism.STATE_NAME] is stored
    report = env.run("y = random.random()")
    assert determinism.STATE_NAME in report.changed


def test_a_checkout_brings_back_the_snapshots_state(tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "ws")
    env.run(SEEDED)
    head = env.image.head
    assert head is not None
    draw(env, "a")
    draw(env, "b")
    op = env.image.begin(source="%kernos checkout")
    op.checkout(head.hex())
    op.commit()
    again = draw(env, "c")
    python, legacy = plain_python(1)
    assert again == (python[0], legacy[0])


def test_an_unseeded_workspace_starts_from_its_identity_numpy_imported_in_an_op(
        tmp_path: Path) -> None:
    """In a fresh process numpy is first imported by the op itself: it draws from the
    workspace's start, not from the OS's entropy, so a replay reproduces it."""
    script = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(Path(__file__).parents[1])!r})
        from pathlib import Path
        from core_support import CoreEnv
        assert "numpy" not in sys.modules
        env = CoreEnv(Path({str(tmp_path / "ws")!r}))
        env.run("import numpy as np\\nimport random\\nx = (np.random.rand(), random.random())")
        print(json.dumps([list(env.ns["x"]), env.image.identity]))
    """)

    def run() -> tuple[list[float], str]:
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             check=True, timeout=120).stdout
        drawn, identity = json.loads(out.splitlines()[-1])
        return drawn, identity

    first, identity = run()
    seed = determinism.fresh_seed(identity)
    assert first == [numpy.random.RandomState(int.from_bytes(seed[:4], "big")).rand(),
                     random.Random(seed).random()]
    # The same workspace in a new process: the stream continues from the stored state.
    second, same_identity = run()
    assert same_identity == identity and second != first


@pytest.fixture(autouse=True)
def _isolated_generators() -> None:
    """Leave the process's generators as a fresh interpreter would (other tests draw)."""
    random.seed()
    numpy.random.seed()


def test_draws_between_ops_do_not_move_the_stream(tmp_path: Path) -> None:
    """Code outside ops (the kernel's own, a library's thread) may draw: an op still
    begins from exactly the committed state."""
    env = CoreEnv(tmp_path / "ws")
    env.run(SEEDED)
    random.random()
    numpy.random.standard_normal()
    python, legacy = plain_python(1)
    assert draw(env, "a") == (python[0], legacy[0])
