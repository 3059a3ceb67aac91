"""Install the ``kernos`` kernelspec somewhere Jupyter looks for it.

``pip install`` already ships the kernelspec as wheel shared-data (into the
environment's ``share/jupyter/kernels``).  This installer is for the other
places: the user's directory, another prefix.  It writes the absolute path of
the current interpreter into ``argv``, so a Jupyter running elsewhere starts
the kernel with the Python that has Kernos installed.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

KERNEL_NAME = "kernos"
RESOURCES = Path(__file__).parent / "resources"


def install(*, user: bool = False, prefix: str | None = None) -> str:
    """Install the kernelspec; return the directory it went to."""
    from jupyter_client.kernelspec import KernelSpecManager

    with tempfile.TemporaryDirectory() as staging:
        target = Path(staging) / KERNEL_NAME
        shutil.copytree(RESOURCES, target)
        spec = json.loads((target / "kernel.json").read_text())
        spec["argv"][0] = sys.executable
        (target / "kernel.json").write_text(json.dumps(spec, indent=2) + "\n")
        return str(KernelSpecManager().install_kernel_spec(
            str(target), KERNEL_NAME, user=user, prefix=prefix))
