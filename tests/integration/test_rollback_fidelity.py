"""A failing cell never harms what it did not touch, and a restore keeps library state live.

Through real kernels (and ``kill -9``), on the libraries notebooks use most:

* a failing cell that only read matplotlib's figures leaves them the live objects
  (no copies, no placeholders, no "changed in place");
* a frozen scipy distribution stays bound to numpy's global generator after a
  rollback and after a restart, and ``colormaps`` is matplotlib's own registry;
* values a restore loaded are not "changed" by cells that only read them;
* a value that would not load back is reported at its commit, and a restore's
  placeholder is announced once;
* Kernos's own lines come after what the cell printed.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from kernos.kernel.kernel import NOTICE_MIME

if TYPE_CHECKING:
    from conftest import Kernel

pytestmark = pytest.mark.kernel

needs_scientific = pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in ("matplotlib", "scipy", "sympy")),
    reason="the corpus extra (matplotlib, scipy, sympy) is part of the test install")


def restart(kernel: Kernel, kernel_factory: Callable[..., Kernel]) -> Kernel:
    kernel.kill9()
    return kernel_factory(kernel.workspace)


def ordered_outputs(kernel: Kernel, code: str) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The reply and the IOPub outputs in the order they were sent: (stream name, text)."""
    outputs: list[tuple[str, str]] = []

    def collect(message: dict[str, Any]) -> None:
        content = message["content"]
        if message["msg_type"] == "stream":
            outputs.append((content["name"], content["text"]))
        elif message["msg_type"] == "error":
            outputs.append(("error", content["ename"]))
        elif message["msg_type"] == "display_data" and NOTICE_MIME in content["data"]:
            outputs.append(("notice", content["data"]["text/plain"]))

    reply = kernel.client.execute_interactive(code, timeout=120, output_hook=collect)
    return reply, outputs


@needs_scientific
def test_a_failing_exec_leaves_pylab_figures_and_rcparams_live(
        kernel_factory: Callable[..., Kernel]) -> None:
    kernel = kernel_factory()
    assert kernel.run("%matplotlib inline\nfrom pylab import *").committed
    made = kernel.run("fig, axes = plt.subplots(1, 2)\n"
                      "im = axes[0].imshow(np.arange(25).reshape(5, 5))\n"
                      "before = [id(fig), id(axes), id(im), id(rcParams)]")
    assert made.committed, (made.errors, made.kernos)
    failed = kernel.run("exec('1/0')")
    assert failed.rolled_back
    assert failed.kernos["undone"]["reloaded"] == []
    assert failed.kernos["undone"]["left_live"] == {}
    assert "changed in place" not in failed.stderr, failed.stderr
    assert kernel.value("rcParams['font.size']") == 10.0
    assert kernel.value("[id(fig), id(axes), id(im), id(rcParams)] == before") is True
    assert kernel.value("rcParams is matplotlib.rcParams") is True
    read = kernel.run("print(type(im).__name__, type(axes).__name__)")
    assert read.committed and read.kernos["changed"] == [], read.kernos


@needs_scientific
def test_a_frozen_distribution_stays_bound_to_the_global_generator(
        kernel_factory: Callable[..., Kernel]) -> None:
    import numpy as np
    from scipy import stats

    np.random.seed(0)
    expected = [int(v) for v in stats.poisson(3.5).rvs(size=5)]
    draws = "np.random.seed(0); print([int(v) for v in X.rvs(size=5)])"
    bound = "X.random_state is np.random.mtrand._rand"
    kernel = kernel_factory()
    assert kernel.run("import numpy as np\nfrom scipy import stats\nX = stats.poisson(3.5)\n"
                      "Y = stats.norm(1, 2)").committed
    assert kernel.run("X.args\nexec('1/0')").rolled_back
    assert kernel.value(bound) is True
    assert kernel.run(draws).stdout.strip() == str(expected)
    kernel = restart(kernel, kernel_factory)
    assert kernel.value(bound) is True
    assert kernel.value("Y.random_state is np.random.mtrand._rand") is True
    assert kernel.run(draws).stdout.strip() == str(expected)


@needs_scientific
def test_colormaps_and_rcparams_are_matplotlibs_own_after_a_restart(
        kernel_factory: Callable[..., Kernel]) -> None:
    kernel = kernel_factory()
    assert kernel.run("import matplotlib\nfrom matplotlib import colormaps, rcParams\n"
                      "settings = {'maps': colormaps}").committed
    kernel = restart(kernel, kernel_factory)
    assert kernel.value("colormaps is matplotlib.colormaps") is True
    assert kernel.value("settings['maps'] is matplotlib.colormaps") is True
    assert kernel.value("rcParams is matplotlib.rcParams") is True
    registered = kernel.run(
        "from matplotlib.colors import ListedColormap\n"
        "colormaps.register(ListedColormap(['red', 'blue'], name='kernos-two'))\n"
        "print('kernos-two' in matplotlib.colormaps)")
    assert registered.stdout.strip() == "True", registered.errors


def test_values_a_restore_loaded_are_not_changed_by_reading_them(
        kernel_factory: Callable[..., Kernel]) -> None:
    kernel = kernel_factory()
    made = kernel.run("""
import collections
import pandas as pd
df = pd.DataFrame({'k': list('abab'), 'v': range(4)})
pieces = dict(list(df.groupby('k')))
Row = collections.namedtuple('Row', 'left right')
label = 'y'
labels = {label: chr(121), 'numbers': {8, 32, 15, 63}}
""")
    assert made.committed, (made.errors, made.kernos)
    kernel = restart(kernel, kernel_factory)
    for _ in range(2):
        failed = kernel.run("print(len(df), len(pieces), Row._fields, labels)\n1/0")
        assert failed.rolled_back
        assert failed.kernos["undone"]["reloaded"] == [], failed.kernos
        assert "changed in place" not in failed.stderr, failed.stderr
    read = kernel.run("print(len(df), len(pieces), Row._fields, labels)")
    assert read.committed and read.kernos["changed"] == [], read.kernos
    assert read.kernos["unchanged"] is True, read.kernos
    changed = kernel.run("df.loc[0, 'v'] = 10\nlabels['numbers'].add(1)")
    assert changed.committed and changed.kernos["changed"] == ["df", "labels"], changed.kernos
    undone = kernel.run("df.loc[1, 'v'] = 20\nlabels['numbers'].add(2)\n1/0")
    # pieces shares objects with df (one stored group): it is reloaded with it.
    assert {"df", "labels"} <= set(undone.kernos["undone"]["reloaded"]), undone.kernos
    assert kernel.value("(int(df.loc[1, 'v']), 2 in labels['numbers'])") == (1, False)


@needs_scientific
def test_a_value_that_would_not_load_back_is_reported_at_commit_and_once_at_restore(
        kernel_factory: Callable[..., Kernel]) -> None:
    kernel = kernel_factory()
    made = kernel.run("from unittest.mock import MagicMock\nm = MagicMock()\nm.fetch(1)\n"
                      "from sympy import RR, CC\nimport sympy")
    assert made.committed, (made.errors, made.kernos)
    reported = {info["name"]: info["reason"] for info in made.kernos["unpersisted"]}
    assert list(reported) == ["m"], made.kernos["unpersisted"]
    assert "would not load back from the snapshot (RecursionError" in reported["m"]
    assert "m (unittest.mock.MagicMock) cannot be persisted" in made.notices
    import sympy

    kernel = restart(kernel, kernel_factory)
    first = kernel.run("print(repr(RR(1.5)), RR is sympy.RR, CC is sympy.CC)")
    assert first.stdout.strip() == f"{sympy.RR(1.5)!r} True True", first
    assert first.notices.count("kernos: m could not be restored and is a placeholder") == 1
    assert "RecursionError" in first.notices and first.stderr == ""
    again = kernel.run("print(type(m).__name__)")
    assert again.stdout.strip() == "Unpersisted" and again.stderr == again.notices == "", again


def test_kernos_lines_come_after_what_the_cell_printed(
        kernel_factory: Callable[..., Kernel]) -> None:
    kernel = kernel_factory()
    reply, outputs = ordered_outputs(
        kernel, "import socket\nprint('before')\nsock = socket.socket()\nprint('after')")
    assert reply["content"]["status"] == "ok"
    notices = [index for index, (name, text) in enumerate(outputs)
               if name == "notice" and text.startswith("kernos: ")]
    printed = [index for index, (name, _) in enumerate(outputs) if name == "stdout"]
    assert notices and printed and max(printed) < min(notices), outputs
    assert not [name for name, _ in outputs if name == "stderr"], outputs  # not an error
    # A failed cell: its output, then its traceback, then the rollback line.
    reply, outputs = ordered_outputs(kernel, "sock.close()\nprint('out')\nx = 1\n1/0")
    assert reply["content"]["status"] == "error"
    assert [name for name, _ in outputs] == ["stdout", "error", "stderr"], outputs
    assert outputs[-1][1].startswith("kernos: rolled back — not kept: x (added); "), outputs
    # A denied op: the same order, and the line names the agent's variables.
    assert kernel.run("%kernos agent add analyst").committed
    reply, outputs = ordered_outputs(
        kernel, "%%agent analyst\nnote = 1\ntry:\n    read('orders')\n"
                "except CapabilityDenied:\n    print('caught')")
    assert reply["content"]["status"] == "error"
    assert [name for name, _ in outputs] == ["stdout", "error", "stderr"], outputs
    assert outputs[1][1] == "OpVetoed", outputs
    assert outputs[-1][1] == ("kernos: rolled back — not kept: analyst's variables "
                              "(changed in place)\n"), outputs
