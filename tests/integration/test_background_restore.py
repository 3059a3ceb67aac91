"""A restarted kernel runs cells that name none of the big values while they still load.

``KERNOS_PAUSE_AT=restore.background:SECONDS`` holds the background part of
the start-up restore, so the test knows the big value is not loaded yet when
its first cells run.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from support import assert_workspace_sound

pytestmark = pytest.mark.kernel

SETUP = ("import numpy as np\nbig = np.arange(2_000_000, dtype=float)\nsmall = [1, 2]\n"
         "def total():\n    return float(big.sum())")


def test_cells_that_need_no_big_value_run_while_it_loads(kernel_factory: Any) -> None:
    kernel = kernel_factory()
    assert kernel.run(SETUP).committed
    kernel.kill9()

    paused = kernel_factory(kernel.workspace, env={"KERNOS_PAUSE_AT": "restore.background:8"})
    started = time.monotonic()
    early = paused.run("fresh = small + [3]\nprint('big' in dir(), fresh)")
    assert early.committed, (early.errors, early.kernos)
    assert early.stdout.strip() == "False [1, 2, 3]"  # ran before big was in place
    assert time.monotonic() - started < 6
    waited = paused.run("print(total(), big[1])")  # stored code names big: it waits
    assert waited.status == "ok", waited.errors
    assert waited.stdout.split() == [str(float(sum(range(2_000_000)))), "1.0"]
    assert paused.run("%kernos status").status == "ok"
    paused.kill9()

    again = kernel_factory(kernel.workspace)
    assert again.value("(fresh, small, float(big[-1]))") == ([1, 2, 3], [1, 2], 1_999_999.0)
    assert_workspace_sound(again.workspace)


def test_a_restarted_kernel_maps_big_buffers_from_the_packs(kernel_factory: Any) -> None:
    """After ``kill -9`` the new kernel maps the big array's chunks (private, copy on write)
    from the pages of git's packs where they were laid out page-aligned, instead of
    copying them, with the same values; the chunk an in-place edit rewrote is copied."""
    kernel = kernel_factory()
    assert kernel.run("import numpy as np\nbig = np.random.default_rng(3).random(1_500_000)\n"
                      "check = float(big.sum())").committed
    assert kernel.run("big[7] = -2.0\ncheck = float(big.sum())").committed
    kernel.kill9()

    again = kernel_factory(kernel.workspace)
    assert again.value("(float(big.sum()) == check, float(big[7]))") == (True, -2.0)
    packs = str(kernel.workspace / "history.git" / "objects" / "pack")
    mapped = 0
    with open(f"/proc/{again.pid}/maps") as maps:
        for line in maps:
            fields = line.split()
            if fields[1] == "rw-p" and fields[-1].startswith(packs):  # private, writable
                start, end = (int(address, 16) for address in fields[0].split("-"))
                mapped += end - start
    assert 10 << 20 <= mapped <= 12_000_000  # all but the edited chunk (12 MB in all)
    assert again.run("big[:] = 1.0\ncheck = float(big.sum())").committed  # copy on write
    again.kill9()
    last = kernel_factory(kernel.workspace)
    assert last.value("(float(big.sum()), check)") == (1_500_000.0, 1_500_000.0)
    assert_workspace_sound(last.workspace)
