"""Protocol conformance: jupyter_kernel_test's suite against a real ``kernos`` kernel.

The suite is a unittest class that starts one kernel for all its tests.  It
runs on a fresh workspace (``$KERNOS_WORKSPACE`` points at a temporary
directory while the kernel starts) over the ipc transport, and every cell it
runs is an ordinary op, so the suite also checks that the op machinery keeps
the messages the protocol expects (one busy/idle pair, outputs, payloads).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import ClassVar

import jupyter_kernel_test as kernel_test
import pytest
from jupyter_client import KernelManager

pytestmark = pytest.mark.kernel

START_TIMEOUT = 120


class KernosConformance(kernel_test.KernelTests):
    kernel_name = "kernos"
    language_name = "python"
    file_extension = ".py"

    code_hello_world = "print('hello, world')"
    code_stderr = "import sys; print('test', file=sys.stderr)"

    completion_samples: ClassVar[list[dict[str, object]]] = [
        {"text": "zi", "matches": {"zip"}},
    ]
    complete_code_samples: ClassVar[list[str]] = [
        "1", "print('hello, world')", "def f(x):\n  return x*2\n\n"]
    incomplete_code_samples: ClassVar[list[str]] = ["print('''hello", "def f(x):\n  x*2"]
    invalid_code_samples: ClassVar[list[str]] = ["import = 7q"]

    code_page_something = "zip?"
    code_generate_error = "raise ValueError('this error is on purpose')"

    code_execute_result: ClassVar[list[dict[str, str]]] = [
        {"code": "1+2+3", "result": "6"},
        {"code": "[n * n for n in range(1, 4)]", "result": "[1, 4, 9]"},
    ]
    code_display_data: ClassVar[list[dict[str, str]]] = [
        {"code": "from IPython.display import HTML, display; display(HTML('<b>test</b>'))",
         "mime": "text/html"},
        {"code": "from IPython.display import Math, display; display(Math('\\\\frac{1}{2}'))",
         "mime": "text/latex"},
    ]

    code_history_pattern = "1?2*"
    # Not "range": IPython answers a range in the current session with session
    # number 0 while "tail" reports the real number, so the suite's range check
    # fails against stock ipykernel too.
    supported_history_operations = ("tail", "search")

    code_inspect_sample = "zip"
    code_clear_output = "from IPython.display import clear_output; clear_output()"

    workspace: ClassVar[str]
    saved_workspace: ClassVar[str | None]

    @classmethod
    def setUpClass(cls) -> None:
        cls.workspace = tempfile.mkdtemp(prefix="kernos-conformance-")
        cls.saved_workspace = os.environ.get("KERNOS_WORKSPACE")
        os.environ["KERNOS_WORKSPACE"] = os.path.join(cls.workspace, "workspace")
        try:
            # The ipc transport avoids ipykernel's warning about unencrypted TCP.
            cls.km = KernelManager(kernel_name=cls.kernel_name, transport="ipc",
                                   ip=os.path.join(cls.workspace, "kernel"))
            cls.km.start_kernel()
            cls.kc = cls.km.client()
            cls.kc.start_channels()
            cls.kc.wait_for_ready(timeout=START_TIMEOUT)
        except BaseException:
            cls._restore_environment()
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        try:
            cls.kc.stop_channels()
            cls.km.shutdown_kernel(now=True)
        finally:
            cls._restore_environment()

    @classmethod
    def _restore_environment(cls) -> None:
        if cls.saved_workspace is None:
            os.environ.pop("KERNOS_WORKSPACE", None)
        else:
            os.environ["KERNOS_WORKSPACE"] = cls.saved_workspace
        shutil.rmtree(cls.workspace, ignore_errors=True)

    def test_cells_of_the_suite_were_committed(self) -> None:
        """Every suite cell is an op: a successful one commits, a failing one rolls back."""
        self.flush_channels()
        msg_id = self.kc.execute("suite_value = 41 + 1")
        reply = self.get_non_kernel_info_reply(timeout=kernel_test.TIMEOUT)
        assert reply is not None and reply["parent_header"]["msg_id"] == msg_id
        report = reply["metadata"]["kernos"]
        self.assertEqual(report["status"], "committed")
        self.assertIn("suite_value", report["added"])
        workspace = os.environ["KERNOS_WORKSPACE"]
        self.assertTrue(os.path.isdir(os.path.join(workspace, "history.git")))

        self.flush_channels()
        self.kc.execute(self.code_generate_error)
        reply = self.get_non_kernel_info_reply(timeout=kernel_test.TIMEOUT)
        assert reply is not None
        self.assertEqual(reply["metadata"]["kernos"]["status"], "rolled back")
