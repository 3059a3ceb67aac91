"""Notebooks written for IPython behave as on IPython (I9), on real kernels.

Each test runs the same cells on a stock ``python3`` kernel and on ``kernos``:
seeded randomness gives the same numbers, before and after ``kill -9`` of the
Kernos kernel; a cell that fails says in its own output what its rollback
undid; ``%kernos on-error keep`` keeps what a failing cell did, as IPython
does, as an op marked failed; and a value holding live resources survives a
rollback as the live object.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from support import assert_workspace_sound

if TYPE_CHECKING:
    from conftest import Kernel

pytestmark = pytest.mark.kernel

SEED = "import random\nimport numpy as np\nrandom.seed(1)\nnp.random.seed(12345)"
DRAW = "print(repr((random.random(), np.random.standard_normal(), np.random.randint(100))))"


def test_a_seeded_notebook_prints_the_same_numbers_as_ipython_across_a_kill9(
        kernel_factory: Callable[..., Kernel]) -> None:
    python = kernel_factory(kernel_name="python3")
    kernos = kernel_factory()
    for kernel in (python, kernos):
        assert kernel.run(SEED).status == "ok"
    expected = [python.run(DRAW).stdout for _ in range(4)]
    got = [kernos.run(DRAW).stdout for _ in range(2)]
    kernos.kill9()
    restarted = kernel_factory(kernos.workspace)
    got += [restarted.run(DRAW).stdout for _ in range(2)]
    assert got == expected
    assert_workspace_sound(kernos.workspace)


def test_a_rolled_back_cell_ends_its_output_with_what_was_undone(kernel: Kernel) -> None:
    assert kernel.run("tup = ('kept',)").status == "ok"
    failed = kernel.run("obj1 = obj2 = 0\ntup = tuple(['foo', [1, 2], True])\ntup[2] = False")
    assert failed.status == "error" and failed.rolled_back
    last = failed.stderr.strip().splitlines()[-1]
    assert last == "kernos: rolled back — not kept: tup (rebound); obj1, obj2 (added)"
    assert failed.kernos["undone"]["rebound"] == ["tup"]
    assert failed.kernos["undone"]["added"] == ["obj1", "obj2"]
    assert failed.kernos["message"] == last.removeprefix("kernos: ")
    assert kernel.value("tup") == ("kept",)
    # A cell that fails having changed nothing adds no line.
    quiet = kernel.run("1 / 0")
    assert quiet.rolled_back and "kernos:" not in quiet.stderr


def test_lost_imports_of_a_failed_first_cell_are_named(kernel: Kernel) -> None:
    failed = kernel.run("import json\nimport sqlite3 as db\nraise OSError('no network')")
    assert failed.stderr.strip().splitlines()[-1] == (
        "kernos: rolled back — not kept: db, json (added)")


def test_on_error_keep_commits_what_a_failing_cell_did_as_a_failed_op(
        kernel_factory: Callable[..., Kernel]) -> None:
    kernel = kernel_factory()
    assert kernel.run("%kernos on-error keep").status == "ok"
    kept = kernel.run("a = 'this is a string'\nimport random\nrandom.random()\na[10] = 'f'")
    assert kept.status == "error" and kept.errors[0]["ename"] == "TypeError"  # as on IPython
    assert kept.committed and kept.kernos["failed"]["kind"] == "TypeError"
    assert "kernos: kept as op" in kept.stderr and "marked failed" in kept.stderr
    assert kernel.value("a") == "this is a string"
    log = kernel.run("%kernos log 3")
    assert "[failed: TypeError, kept]" in log.stdout
    audit = kernel.run("%kernos audit 3")
    assert "TypeError" in audit.stdout
    # Agents' ops always roll back, whatever the setting.
    kernel.run("%kernos agent add bob")
    agent = kernel.run("%%agent bob\nmine = 1\nraise ValueError('no')")
    assert agent.status == "error" and agent.rolled_back
    kernel.kill9()
    restarted = kernel_factory(kernel.workspace)
    assert restarted.value("a") == "this is a string"
    assert restarted.run("%kernos on-error").stdout.strip() == "on-error: keep"
    assert restarted.run("%kernos on-error rollback").status == "ok"
    assert restarted.run("b = 1\n1/0").rolled_back
    assert restarted.run("%kernos on-error sometimes").status == "error"
    assert_workspace_sound(kernel.workspace)


def test_a_library_object_with_a_live_thread_survives_a_rollback_as_itself(
        kernel: Kernel) -> None:
    """A rollback used to reload a changed value as a copy with the live parts spliced
    in: the copy's thread then served the old queue, and the user's puts went nowhere.
    The live object is kept, and the rollback says it could not reset it."""
    made = kernel.run(
        "import logging, logging.handlers, queue\nq = queue.Queue()\nrecords = []\n"
        "class Keep(logging.Handler):\n    def emit(self, record):\n"
        "        records.append(record.getMessage())\n"
        "listener = logging.handlers.QueueListener(q, Keep())\nlistener.start()\n"
        "kept = (id(listener), id(q))")
    assert made.committed, made.kernos
    failed = kernel.run("listener.note = 'seen'\nraise RuntimeError('later')")
    assert failed.rolled_back
    assert failed.kernos["undone"]["not_reset"] == ["listener"], failed.kernos
    assert "could not be reset: listener" in failed.stderr
    used = kernel.run("q.put(logging.LogRecord('n', logging.INFO, '', 0, 'hi', (), None))\n"
                      "listener.stop()")
    assert used.committed, used.errors
    assert kernel.value("(kept == (id(listener), id(q)), records, listener.note)") == (
        True, ["hi"], "seen")


def test_a_value_that_cannot_persist_is_reported_once(kernel: Kernel, tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("one\ntwo\n")
    opened = kernel.run(f"f = open({str(path)!r})")
    lines = [line for line in opened.notices.splitlines() if line.startswith("kernos:")]
    assert len(lines) == 1 and "f (_io.TextIOWrapper) cannot be persisted" in lines[0]
    assert "kernos:" not in opened.stderr  # a notice, not an error
    again = kernel.run("first = f.readline()")
    assert again.committed and "kernos:" not in again.stderr + again.notices
    assert json.loads(json.dumps(again.kernos["unpersisted"])) == []
    status = kernel.run("%kernos status")
    assert "f: _io.TextIOWrapper" in status.stdout


def test_audit_verify_since_an_anchor_from_a_notebook(kernel: Kernel) -> None:
    for number in range(3):
        assert kernel.run(f"x{number} = {number}").committed
    full = kernel.run("%kernos audit verify")
    assert full.stdout.startswith("ok: ") and "records 0.." not in full.stdout, full.stdout
    anchor = full.stdout.strip().splitlines()[-1].removeprefix("head ")
    index = int(anchor.split(":")[0])
    assert kernel.run("y = 1").committed
    after = kernel.run(f"%kernos audit verify since={anchor}")
    assert after.stdout.startswith(f"ok: records {index + 1}..") and "not read" in after.stdout, (
        after.stdout)
    forged = anchor[:-4] + ("0000" if not anchor.endswith("0000") else "1111")
    wrong = kernel.run(f"%kernos audit verify since={forged}")
    assert wrong.stdout.startswith("FAILED"), wrong.stdout
    assert kernel.run("%kernos audit verify since=a:b c:d e").status == "error"
