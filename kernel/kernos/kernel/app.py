"""The kernel application: IPython's, with the Kernos kernel class.

IPython's own history database (``~/.ipython/profile_default/history.sqlite``)
is kept in memory: it would hold every cell's source in the clear, outside
the workspace, where erasing a data subject cannot reach it.  The audit log
is a Kernos kernel's durable record of what ran; ``%history`` and ``In``
still work for the session.

Leaving: once the main loop stops (after a shutdown request), the control
thread is stopped and joined before Python runs the exit handlers.  Those
handlers stop the IOPub thread and close its sockets, and ipykernel's control
thread may still be publishing the "idle" that ends the shutdown request: a
send on a closed socket printed a traceback on the stderr of whatever started
the kernel (``kernos grants`` on a workspace with no kernel, say).
"""

from __future__ import annotations

from ipykernel.kernelapp import IPKernelApp
from traitlets import Type

from kernos.kernel.kernel import KernosKernel


class KernosApp(IPKernelApp):
    name = "kernos-kernel"
    kernel_class = Type(KernosKernel, config=True)

    def init_kernel(self) -> None:
        self.config.HistoryManager.hist_file = ":memory:"
        super().init_kernel()

    def start(self) -> None:
        try:
            super().start()
        finally:
            self._stop_control_thread()

    def _stop_control_thread(self) -> None:
        control = self.control_thread
        if control is not None and control.is_alive():
            control.stop()
            control.join(timeout=_CONTROL_JOIN_SECONDS)


_CONTROL_JOIN_SECONDS = 10


def main() -> None:
    KernosApp.launch_instance()
