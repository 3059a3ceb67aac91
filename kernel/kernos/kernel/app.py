"""The kernel application: IPython's, with the Kernos kernel class.

IPython's own history database (``~/.ipython/profile_default/history.sqlite``)
is kept in memory: it would hold every cell's source in the clear, outside
the workspace, where erasing a data subject cannot reach it.  The audit log
is a Kernos kernel's durable record of what ran; ``%history`` and ``In``
still work for the session.
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


def main() -> None:
    KernosApp.launch_instance()
