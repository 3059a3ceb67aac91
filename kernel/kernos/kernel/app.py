"""The kernel application: IPython's, with the Kernos kernel class."""

from __future__ import annotations

from ipykernel.kernelapp import IPKernelApp
from traitlets import Type

from kernos.kernel.kernel import KernosKernel


class KernosApp(IPKernelApp):  # type: ignore[misc]
    name = "kernos-kernel"
    kernel_class = Type(KernosKernel, config=True)  # type: ignore[assignment]


def main() -> None:
    KernosApp.launch_instance()
