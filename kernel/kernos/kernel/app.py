"""The kernel application: IPython's, with the Kernos kernel class."""

from __future__ import annotations

from ipykernel.kernelapp import IPKernelApp
from traitlets import Type

from kernos.kernel.kernel import KernosKernel


class KernosApp(IPKernelApp):
    name = "kernos-kernel"
    kernel_class = Type(KernosKernel, config=True)


def main() -> None:
    KernosApp.launch_instance()
