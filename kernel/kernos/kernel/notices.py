"""What the kernel tells about an op once it ended: the notebook's notices and the inspectors'.

:class:`Notices` says it twice, for two readers:

* to the notebook, in the cell's output: one line per new value that cannot
  persist, one for a failed cell kept as an op, and once per name the values a
  restore could not load.  Those are not errors (the cell committed): each is
  a ``display_data`` of its own, with ``text/plain`` for every frontend and
  :data:`NOTICE_MIME` for the Kernos extension, after what the cell printed;
* to the inspectors (``kernel.inspection``): a ``committed`` or a
  ``rolled_back`` notice per op, which the inspector widget and the
  JupyterLab extension's stale markers read.

It sends on the kernel's IOPub socket in reply to the shell request being
served, and never raises for the op: the op has ended when it is told.
"""

from __future__ import annotations

import sys
from typing import Any, Protocol

from kernos.image import SYSTEM_PREFIX, Image, default_is_persistent
from kernos.inspector.backend import checkout_notice
from kernos.kernel.host import Inspection
from kernos.op import CheckoutReport, CommitReport, Op

__all__ = ["NOTICE_MIME", "Notices", "say", "unpersisted_line"]

NOTICE_MIME = "application/vnd.kernos.notice+json"
"""The MIME type of Kernos's notices that are not errors (see :meth:`Notices.notice`)."""


class Iopub(Protocol):
    """What :class:`Notices` uses of the kernel: its IOPub socket and the request served."""

    @property
    def session(self) -> Any: ...
    @property
    def iopub_socket(self) -> Any: ...

    def get_parent(self, channel: str = ...) -> Any: ...

    def _topic(self, topic: str) -> bytes: ...


class Notices:
    """Tells the notebook and the inspectors how an op ended."""

    def __init__(self, kernel: Iopub, inspection: Inspection) -> None:
        self._kernel = kernel
        self._inspection = inspection
        self._placeholders_told: set[str] = set()
        """Names already announced as placeholders of a failed restore."""

    # -- to the inspectors --------------------------------------------------------

    def finished(self, op: Op, outcome: CommitReport | BaseException | None,
                 why: BaseException | tuple[str, str] | None) -> None:
        """A cell's op ended: ``outcome`` is its commit, the commit's failure, or None
        (rolled back because of ``why``)."""
        # A cell's op: its execute_request's id, so that the notebook that sent it
        # tells its own ops from everyone else's (the stale markers, extension/src/cells.ts).
        parent = self._kernel.get_parent("shell")
        request = {"request": str(parent.get("header", {}).get("msg_id", ""))}
        if isinstance(outcome, CommitReport):
            self.committed(outcome, request, checkout=op.checked_out)
        else:
            if isinstance(outcome, BaseException):
                error: str | None = str(outcome)  # the commit failed
            elif isinstance(why, tuple):
                error = f"{why[0]}: {why[1]}"
            else:
                error = None if why is None else f"{type(why).__name__}: {why}"
            self._inspection.notify({"type": "rolled_back", "op": op.id,
                                     "principal": op.principal, "error": error, **request})

    def committed(self, report: CommitReport, extra: dict[str, str] | None = None, *,
                  checkout: CheckoutReport | None = None) -> None:
        """An op committed (a cell's, a harness request's, a loop's turn, an effect's)."""
        notice = {
            "type": "committed", "op": report.op, "commit": report.commit,
            "principal": report.principal, "added": report.added,
            "changed": report.changed, "deleted": report.deleted,
            "events": len(report.events), **(extra or {})}
        if checkout is not None:  # `%kernos checkout REF` in a cell
            notice["checkout"] = checkout_notice(checkout.__dict__)
        self._inspection.notify(notice)

    # -- to the notebook ----------------------------------------------------------

    def placeholders(self, image: Image | None) -> None:
        """Once per name: values a restore could not load, which are placeholders now."""
        if image is None:
            return
        for state in image.groups.values():
            names = [name for name in state.stored.names
                     if name not in self._placeholders_told and default_is_persistent(name)
                     and not name.startswith(SYSTEM_PREFIX)]
            if state.load_error is None or not names:
                continue
            self._placeholders_told.update(names)
            self.notice(f"kernos: {', '.join(names)} could not be restored and "
                        f"{'is a placeholder' if len(names) == 1 else 'are placeholders'}: "
                        f"{state.load_error}", "placeholder")

    def commit_lines(self, report: CommitReport) -> None:
        """One line per value that cannot persist and is new, and one for a kept failure."""
        by_name: dict[str, list[dict[str, Any]]] = {}
        for info in report.unpersisted:
            if not info.get("lossless"):
                by_name.setdefault(str(info["name"]), []).append(info)
        for infos in by_name.values():
            self.notice("kernos: " + unpersisted_line(infos), "unpersisted")
        if report.failed is not None:
            say(f"kernos: kept as op {report.op}, marked failed ({report.failed['kind']}): "
                "what the cell did before the error is committed (`%kernos on-error "
                "rollback` rolls failed cells back instead)")

    def notice(self, line: str, kind: str) -> None:
        """A notice that is not an error (the cell committed): a display of its own.

        It carries ``text/plain`` for every frontend and :data:`NOTICE_MIME` for the
        Kernos extension, and it is never styled as stderr.  It follows what the
        cell printed (stdout goes out first).
        """
        sys.stdout.flush()
        kernel = self._kernel
        if kernel.session is None:
            say(line)
            return
        kernel.session.send(kernel.iopub_socket, "display_data", {
            "data": {"text/plain": line, NOTICE_MIME: {"kind": kind, "text": line}},
            "metadata": {}, "transient": {}},
            parent=kernel.get_parent("shell"), ident=kernel._topic("display_data"))


def say(line: str) -> None:
    """One of Kernos's own lines, after what the cell printed (stdout goes out first)."""
    sys.stdout.flush()
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def unpersisted_line(infos: list[dict[str, Any]]) -> str:
    """One line for the values of one variable that cannot persist."""
    first = infos[0]
    if len(infos) == 1:
        return (f"{first['path']} ({first['type_name']}) cannot be persisted: "
                f"{first['reason']}. It stays usable now; after a restart it is a placeholder.")
    parts = ", ".join(f"{info['path']} ({info['type_name']})" for info in infos[:3])
    more = f" and {len(infos) - 3} more" if len(infos) > 3 else ""
    return (f"{first['name']}: {len(infos)} parts cannot be persisted: {parts}{more} "
            f"({first['reason']}). They stay usable now; after a restart they are "
            "placeholders (`%kernos status` lists them).")
