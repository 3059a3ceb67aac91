"""The kernel's start-up: open the workspace, restore its image, and tell requests when to run.

:class:`Startup` holds the kernel's image from the moment the workspace is
opened (:meth:`~Startup.attach`) through its restore, which runs in a
background thread in two steps:

1. the runtime's state and the small values load first; then
   ``cells_ready`` is set, and a cell whose reach names none of the values
   still loading may run (:meth:`~Startup.runs_before_restored`);
2. the big values load once the kernel serves requests (``serving``, set by
   the kernel shortly after its loop started), so that they do not slow the
   start-up (and ``kernel_info``) down; then ``done`` is set.

Every other request waits for ``done`` (:meth:`~Startup.wait`, reporting the
restore's progress to its sender; :meth:`~Startup.ready` for a cell, showing
it in the cell's output).  A workspace that cannot be opened or an image that
cannot be restored does not stop the kernel: the reason is kept
(``attach_error``, ``error``) and every cell explains it.
"""

from __future__ import annotations

import asyncio
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernos.errors import KernosError
from kernos.image import Image, RestoreReport
from kernos.kernel.control import PROGRESS_INTERVAL
from kernos.kernel.host import ProgressReporter
from kernos.kernel.reach import cell_reach
from kernos.remote.session import RemoteSession
from kernos.remote.start import start_remote
from kernos.store.workspace import Workspace, default_workspace

__all__ = ["LOOP_SETTLES", "Startup"]

LOOP_SETTLES = 0.1
"""Seconds after the kernel's loop starts before a restore loads the big values."""

_IPYTHON_CACHE = re.compile(r"_+|_i+|_i?\d+")
_ALIASES = frozenset({"_", "__", "___", "Out", "_oh"})


class Startup:
    """The kernel's workspace and image, from opening to restored.

    ``shell`` is the kernel's IPython shell (its namespace becomes the image's);
    ``advertise`` is called with the workspace's path and durability once it is
    open; ``settle`` runs once the restore is done (it executes the effects a
    crash left queued or in doubt).
    """

    def __init__(self, shell: Any, log: Any, *, advertise: Callable[[Path, bool], None],
                 settle: Callable[[], None]) -> None:
        self._shell = shell
        self._log = log
        self._advertise = advertise
        self._settle = settle
        self.image: Image | None = None
        self.attach_error: KernosError | None = None
        self.remote: RemoteSession | None = None
        self.report: RestoreReport | None = None
        self.error: BaseException | None = None
        """Why the restore failed, if it did."""
        self.progress = (0, 0)
        """The restore's ``(done, total)`` bytes."""
        self.done = threading.Event()
        self.serving = threading.Event()
        """Set shortly after the kernel's loop started serving requests."""
        self.cells_ready = threading.Event()
        """Set once the restore has loaded all but the big values (see runs_before_restored)."""

    def attached(self) -> Image:
        """The image, or the reason there is none (raised)."""
        image = self.image
        if image is None:
            raise self.attach_error or KernosError("no workspace is attached")
        return image

    def is_persistent(self, name: str) -> bool:
        """Whether a name is the user's: not IPython's own, unless the user rebound it."""
        if _IPYTHON_CACHE.fullmatch(name) or (name.startswith("__") and name.endswith("__")):
            return False
        hidden = self._shell.user_ns_hidden
        return name not in hidden or hidden[name] is not self._shell.user_ns.get(name)

    def attach(self) -> None:
        """Open the workspace and start restoring its image in the background."""
        # Issue 19's hook for a kernel on a fresh machine (a gateway pod): with
        # $KERNOS_REMOTE, materialize the workspace from its git remote, take the remote's
        # lease and push after commits (kernos.remote.start).
        try:  # a forbidden workspace name, too, is explained in every cell
            path = default_workspace()
            self.remote = start_remote(path)
            workspace = Workspace.open(path, purpose="kernos kernel")
        except KernosError as error:
            if self.remote is not None:
                self.remote.close()
                self.remote = None
            self.attach_error = error
            self._log.error("Kernos: %s", error)
            self.done.set()
            return
        self.attach_error = None
        shell = self._shell
        try:
            self.image = Image(
                workspace, shell.user_ns, module=shell.user_module,
                module_name=shell.user_module.__name__,
                is_persistent=self.is_persistent, is_alias=lambda name: name in _ALIASES
                or bool(re.fullmatch(r"_\d+", name)),
            )
        except KernosError as error:  # a damaged audit log, say: explain it in every cell
            workspace.close()
            self.attach_error = error
            self._log.error("Kernos: %s", error)
            self.done.set()
            return
        self.done.clear()
        self.cells_ready.clear()
        self._advertise(Path(workspace.path), workspace.durable)
        threading.Thread(target=self._restore, name="kernos-restore", daemon=True).start()

    def _restore(self) -> None:
        assert self.image is not None
        started = time.perf_counter()
        try:
            def progress(done: int, total: int) -> None:
                self.progress = (done, total)

            self.report = self.image.restore(progress, background=True)
            self.cells_ready.set()  # cells that name none of the values still loading run
            waited = time.perf_counter()
            if self.image.pending:
                self.serving.wait(LOOP_SETTLES + 5)
            waited = time.perf_counter() - waited
            self.image.finish_restore(progress)
            report = self.report
            report.names = len(self.image.committed)
            # The time spent restoring, not the wait for the kernel to serve first.
            report.seconds = time.perf_counter() - started - waited
            self._log.info("Kernos: restored %d names (%d bytes) from %s in %.2fs",
                           report.names, report.bytes, report.commit, report.seconds)
            self._settle()  # effects a crash left queued or in doubt
        except BaseException as error:  # the kernel must keep serving to explain it
            self.error = error
            self._log.error("Kernos: restore failed: %s", error)
        finally:
            self.done.set()

    async def wait(self, progress: ProgressReporter) -> None:
        """Wait for the restore, reporting its progress to ``progress``."""
        while not self.done.is_set():
            progress("restore", *self.progress)
            await asyncio.sleep(PROGRESS_INTERVAL / 2)
        if self.error is None:
            progress("restore", *self.progress)  # the final one, done == total

    async def runs_before_restored(self, code: str) -> bool:
        """Whether a cell can run while the restore still loads big values.

        It can once the runtime's state and the small values are in place, if
        its reach (widened through stored code) names none of the values still
        loading and it runs no magic or shell command (they may read anything).
        """
        if self.done.is_set():
            return False
        while not self.cells_ready.is_set():
            if self.done.is_set():
                return False
            await asyncio.sleep(0.005)
        image = self.image
        if image is None or self.error is not None or self.attach_error is not None:
            return False
        try:
            transformed = self._shell.transform_cell(code)
        except Exception:
            return False
        if "get_ipython" in transformed:
            return False
        return not image.needs_pending(cell_reach(transformed, self._shell.transform_cell))

    async def ready(self) -> KernosError | None:
        """Wait for the restore (showing progress); return the reason ops cannot run, if any."""
        if self.image is None and self.done.is_set():
            self.attach()  # the workspace may have been released since
        shown = False
        started = time.perf_counter()
        while not (self.done.is_set() or self.cells_ready.is_set()):
            await asyncio.sleep(0.05)
            if time.perf_counter() - started > 0.5:
                done, total = self.progress
                percent = 100 * done // total if total else 0
                sys.stdout.write(f"\rRestoring the image: {percent}% "
                                 f"({done / 1e6:.0f} of {total / 1e6:.0f} MB)")
                sys.stdout.flush()
                shown = True
        if shown and self.report is not None:
            report = self.report
            sys.stdout.write(f"\rRestored {report.names} names ({report.bytes / 1e6:.0f} MB) in "
                             f"{report.seconds:.1f} s.{' ' * 20}\n")
        if self.attach_error is not None:
            return self.attach_error
        if self.error is not None:
            error = self.error
            return error if isinstance(error, KernosError) else KernosError(
                f"The image could not be restored ({type(error).__name__}: {error}). Nothing "
                "was changed on disk; see the kernel log, or inspect with `kernos log`.")
        return None
