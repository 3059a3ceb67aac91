"""I1 atomicity, through real kernels: a failed cell leaves the image exactly as it was.

"Exactly" is checked with a canonical dump computed inside the kernel: every
persisted name, its value walked recursively, and the identity of every
object met on the way (the first visit of an object is labelled ``#n``, a
later visit ``@n``), so ``b['ref'] is a`` is part of what must not change.
Each check is made twice: in the same kernel right after the failure, and in
a new kernel on the same workspace after the first one was killed with
``kill -9`` (what the history holds).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support import assert_workspace_sound, canon, history_length

pytestmark = pytest.mark.kernel

REPLY_TIMEOUT = 180

STATE = """
import numpy as np
import pandas as pd

class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y

a = [1, 2, [3, 4]]
b = {'ref': a, 'n': 1, 'nested': {'k': 'v'}}
tags = {'red', 'green'}
p = Point(1, 2)
p.owner = b
pair = (a, p)
arr = np.arange(12.0).reshape(3, 4)
df = pd.DataFrame({'x': [1, 2, 3], 'y': ['u', 'v', 'w']})
counter = 10
text = 'hello'
"""

SHARING = "(b['ref'] is a, p.owner is b, pair[0] is a, pair[1] is p, type(p) is Point)"

# Every kind of change a cell can make: in place, rebinding, deletion, new names.
MUTATIONS = """
a.append(99)
a[2].append(5)
b['n'] = 2
b['new'] = 'x'
del b['nested']
tags.add('blue')
tags.discard('red')
p.x = 100
p.extra = 'e'
arr[1:, :2] = -1
df.loc[0, 'x'] = 1000
df['z'] = 0
counter += 1
text = 'changed'
del pair
brand_new = [a, p]
print('MUTATED', a, b['n'], sorted(tags), p.x, arr[1, 0], df.loc[0, 'x'], counter, flush=True)
"""

ENDINGS = {
    "exception": "raise ValueError('planned failure')",
    "SystemExit": "raise SystemExit",
    "sys.exit(3)": "import sys\nsys.exit(3)",
    "BaseException subclass": "class Stop(BaseException):\n    pass\nraise Stop('planned')",
    "GeneratorExit": "raise GeneratorExit",
    "KeyboardInterrupt raised": "raise KeyboardInterrupt",
}


def restarted(kernel_factory: Any, kernel: Any) -> Any:
    """kill -9 the kernel and start a new one on its workspace."""
    kernel.kill9()
    return kernel_factory(kernel.workspace)


def setup_state(kernel: Any) -> str:
    result = kernel.run(STATE)
    assert result.committed, (result.errors, result.kernos)
    assert kernel.value(SHARING) == (True,) * 5
    return canon(kernel)


def assert_unchanged(kernel_factory: Any, kernel: Any, before: str, length: int) -> None:
    """The image is `before` in this kernel, in the history, and after kill -9 + restart."""
    assert history_length(kernel.workspace) == length, "the failed op reached the history"
    assert canon(kernel) == before
    assert kernel.value(SHARING) == (True,) * 5
    again = restarted(kernel_factory, kernel)
    assert canon(again) == before
    assert again.value(SHARING) == (True,) * 5
    assert_workspace_sound(again.workspace)


@pytest.mark.parametrize("ending", list(ENDINGS.values()), ids=list(ENDINGS))
def test_failed_cell_leaves_the_image_unchanged(kernel_factory: Any, ending: str) -> None:
    kernel = kernel_factory()
    before = setup_state(kernel)
    length = history_length(kernel.workspace)

    result = kernel.run(MUTATIONS + ending)

    assert "MUTATED [1, 2, [3, 4, 5], 99] 2 ['blue', 'green'] 100 -1.0 1000 11" in result.stdout
    assert result.status == "error"
    assert result.kernos["status"] == "rolled back", result.kernos
    assert_unchanged(kernel_factory, kernel, before, length)


def test_real_interrupt_during_a_mutating_loop_rolls_back(kernel_factory: Any) -> None:
    kernel = kernel_factory()
    before = setup_state(kernel)
    length = history_length(kernel.workspace)
    loop = """
i = 0
while True:
    i += 1
    a.append(i)
    del a[0]
    b['n'] = i
    tags.add(i)
    p.x = i
    arr[0, 0] = i
    counter += 1
    if i == 2000:
        print('LOOPING', flush=True)
"""
    client = kernel.client
    msg_id = client.execute(loop)
    deadline = time.monotonic() + REPLY_TIMEOUT
    while True:
        message = client.get_iopub_msg(timeout=max(1.0, deadline - time.monotonic()))
        if (message["parent_header"].get("msg_id") == msg_id
                and message["msg_type"] == "stream"
                and "LOOPING" in message["content"]["text"]):
            break
    time.sleep(0.3)  # let the loop mutate some more
    kernel.interrupt()
    while True:
        reply = client.get_shell_msg(timeout=max(1.0, deadline - time.monotonic()))
        if reply["parent_header"].get("msg_id") == msg_id:
            break

    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    assert reply["metadata"]["kernos"]["status"] == "rolled back"
    assert_unchanged(kernel_factory, kernel, before, length)


def test_mutation_through_code_from_earlier_cells_rolls_back(kernel_factory: Any) -> None:
    """The cell names only a function, a method or a stored lambda; they change `a` and `b`."""
    kernel = kernel_factory()
    setup_state(kernel)
    result = kernel.run(
        "def grow(x):\n    a.append(x)\n    b['n'] += 1\n"
        "Point.move = lambda self, step: self.owner.update(n=step)\n"
        "table = {'push': lambda: a[2].append('deep')}\n"
    )
    assert result.committed, result.errors
    before = canon(kernel)
    length = history_length(kernel.workspace)

    result = kernel.run("grow(7)\np.move(50)\ntable['push']()\n"
                        "print('MUTATED', a, b['n'], flush=True)\nraise RuntimeError('planned')")

    assert "MUTATED [1, 2, [3, 4, 'deep'], 7] 50" in result.stdout
    assert result.kernos["status"] == "rolled back", result.kernos
    assert_unchanged(kernel_factory, kernel, before, length)


# -- a failure of the commit itself --------------------------------------------------------


def _writes_are_refused(directory: Path) -> bool:
    probe = directory / "kernos-write-probe"
    try:
        probe.write_bytes(b"")
    except OSError:
        return True
    probe.unlink()
    return False


@contextlib.contextmanager
def objects_unwritable(workspace: Path, pid: int) -> Iterator[None]:
    """Make history.git/objects refuse new objects, as a read-only directory does.

    chmod is enough for an ordinary user.  root ignores permissions, so then
    the names the kernel (process ``pid``) writes its next pack under are
    taken by directories: the pack cannot be created.
    """
    packs = workspace / "history.git" / "objects" / "pack"
    packs.mkdir(exist_ok=True)
    mode = packs.stat().st_mode
    squatters: list[Path] = []
    packs.chmod(0o555)
    try:
        if not _writes_are_refused(packs):
            for kind in ("pack", "idx"):
                path = packs / f"tmp_kernos_{kind}_{pid}"
                path.mkdir()
                squatters.append(path)
        yield
    finally:
        for path in squatters:
            path.rmdir()
        packs.chmod(mode)


def assert_commit_failed(result: Any) -> None:
    assert result.status == "error"
    assert result.kernos["status"] == "rolled back", result.kernos
    message = result.reply["content"]["evalue"]
    assert "rolled back" in message, message
    assert result.reply["content"]["ename"] == "CommitFailed", result.reply["content"]


# A small commit goes to the commit tail, a file the kernel keeps open; a value too
# big for a frame makes the commit write packs (and fold the tail first), which fails.
BIG_MUTATIONS = MUTATIONS + "\nimport os\nnoise = os.urandom(1_500_000)\n"


def test_failed_commit_to_read_only_objects_rolls_back(kernel_factory: Any) -> None:
    kernel = kernel_factory()
    before = setup_state(kernel)
    length = history_length(kernel.workspace)

    with objects_unwritable(kernel.workspace, kernel.manager.provisioner.pid):
        result = kernel.run(BIG_MUTATIONS)
        assert "MUTATED" in result.stdout
        assert_commit_failed(result)
        assert history_length(kernel.workspace) == length

    # Probes commit too, so they run once the store accepts objects again.
    assert canon(kernel) == before
    assert kernel.value(SHARING) == (True,) * 5
    assert_workspace_sound(kernel.workspace)
    result = kernel.run(BIG_MUTATIONS)  # the cause is gone: the same cell commits
    assert result.committed, (result.errors, result.kernos)
    after = canon(kernel)
    assert after != before
    assert history_length(kernel.workspace) > length
    again = restarted(kernel_factory, kernel)
    assert canon(again) == after
    assert_workspace_sound(again.workspace)


# The cell itself caps the size of files the kernel process may write, so its
# commit fails in the middle with EFBIG (as on a full disk) after some objects
# were written; the next cell lifts the cap again.
CAP_FILE_SIZE = """
import os, resource, signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (65536, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
blob = os.urandom(3_000_000)
"""
UNCAP_FILE_SIZE = """
import resource as __resource__
__resource__.setrlimit(__resource__.RLIMIT_FSIZE,
                       (__resource__.getrlimit(__resource__.RLIMIT_FSIZE)[1],) * 2)
"""


def test_commit_failing_midway_on_a_write_error_rolls_back(kernel_factory: Any) -> None:
    kernel = kernel_factory()
    before = setup_state(kernel)
    length = history_length(kernel.workspace)

    result = kernel.run(CAP_FILE_SIZE + MUTATIONS)

    assert "MUTATED" in result.stdout
    assert_commit_failed(result)
    assert "File too large" in result.reply["content"]["evalue"]
    assert history_length(kernel.workspace) == length
    journal = kernel.workspace / "pending"  # no batch pending: the journal is empty or gone
    assert not journal.exists() or journal.read_bytes() == b""
    assert_workspace_sound(kernel.workspace)  # the objects it did write are gone again
    result = kernel.run(UNCAP_FILE_SIZE)
    assert result.committed, (result.errors, result.kernos)
    assert canon(kernel) == before
    assert kernel.value(SHARING) == (True,) * 5

    result = kernel.run("blob = b'x' * 200_000\n" + MUTATIONS)
    assert result.committed, (result.errors, result.kernos)
    after = canon(kernel)
    again = restarted(kernel_factory, kernel)
    assert canon(again) == after
    assert_workspace_sound(again.workspace)


def test_failed_commit_leaves_no_temporary_files(kernel_factory: Any) -> None:
    kernel = kernel_factory()
    setup_state(kernel)
    result = kernel.run(CAP_FILE_SIZE + MUTATIONS)
    assert_commit_failed(result)
    leftovers = sorted((kernel.workspace / "tmp").iterdir())
    assert leftovers == [], [(path.name, path.stat().st_size) for path in leftovers]


def test_oversized_cell_is_rejected_without_running(kernel_factory: Any) -> None:
    kernel = kernel_factory(env={"KERNOS_MAX_SOURCE_BYTES": "4000"})
    before = setup_state(kernel)
    length = history_length(kernel.workspace)

    result = kernel.run("print('RAN')\na.append(1)\ncounter = 0\n" + "# padding\n" * 500)

    assert result.status == "error"
    assert result.kernos["status"] == "rejected", result.kernos
    assert "RAN" not in result.stdout
    assert "KERNOS_MAX_SOURCE_BYTES" in result.reply["content"]["evalue"]
    assert history_length(kernel.workspace) == length
    assert_unchanged(kernel_factory, kernel, before, length)



def test_failed_first_cell_keeps_names_from_ipython_startup_files(
    kernel_factory: Any, tmp_path: Path,
) -> None:
    startup = tmp_path / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-imports.py").write_text("import json\nfrom_startup = [42]\n")
    kernel = kernel_factory(env={"IPYTHONDIR": str(tmp_path / "ipython")})

    result = kernel.run("x = 1\nraise ValueError('planned failure')")  # touches neither name

    assert result.kernos["status"] == "rolled back", result.kernos
    found = kernel.run("print(from_startup, json.dumps('ok'))")
    assert found.status == "ok", found.errors
    assert found.stdout == '[42] "ok"\n'


# -- memory shared outside what pickle sees --------------------------------------------------


def test_write_through_an_array_on_a_persisted_buffer_is_rolled_back(
    kernel_factory: Any,
) -> None:
    kernel = kernel_factory()
    result = kernel.run("import numpy as np\nbuf = bytearray(4)\n"
                        "view = np.frombuffer(buf, dtype=np.uint8)")
    assert result.committed, result.errors

    result = kernel.run("view[0] = 5\nraise ValueError('planned failure')")

    assert result.kernos["status"] == "rolled back", result.kernos
    assert kernel.value("list(buf)") == [0, 0, 0, 0]
    again = restarted(kernel_factory, kernel)
    assert again.value("list(buf)") == [0, 0, 0, 0]


def test_rollback_keeps_a_numpy_view_on_its_base(kernel_factory: Any) -> None:
    kernel = kernel_factory()
    result = kernel.run("import numpy as np\nbase = np.zeros(6)\nwindow = base[2:4]")
    assert result.committed, result.errors
    assert kernel.value("bool(np.shares_memory(base, window))") is True

    result = kernel.run("base[2] = 9.0\nraise ValueError('planned failure')")

    assert result.kernos["status"] == "rolled back", result.kernos
    assert kernel.value("(base.tolist(), window.tolist())") == ([0.0] * 6, [0.0, 0.0])
    assert kernel.value("bool(np.shares_memory(base, window))") is True
