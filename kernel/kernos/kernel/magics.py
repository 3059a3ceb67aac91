"""``%kernos``: the history and the workspace, from a notebook.

Each command is a thin call into ``kernos.history`` or the running op; the
formatting is shared with the CLI.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

from IPython.core.magic import Magics, line_magic, magics_class

from kernos import history
from kernos.errors import KernosError, UsageError

if TYPE_CHECKING:
    from kernos.kernel.kernel import KernosKernel

HELP = """\
%kernos log [N]          the last N snapshots (default 20), newest first
%kernos show [REF]       one snapshot: its op, code, names and what it could not persist
%kernos diff A [B]       names that differ between snapshots A and B (default: HEAD)
%kernos checkout REF     make the image equal to snapshot REF, as a new op
%kernos status           workspace, head, image size, values that cannot persist
%kernos scan             make this cell's op check every value, not only those it names

REF is a commit id (or a prefix), HEAD, HEAD~N, or @N for the snapshot of op N."""


@magics_class
class KernosMagics(Magics):
    def __init__(self, shell: Any, *, kernel: KernosKernel) -> None:
        super().__init__(shell)
        self.kernel = kernel

    @line_magic
    def kernos(self, line: str) -> None:
        """Browse and move the image's history: `%kernos help` lists the commands."""
        try:
            words = shlex.split(line)
        except ValueError as error:
            raise UsageError(f"cannot parse {line!r}: {error}") from None
        command, args = (words[0], words[1:]) if words else ("help", [])
        handler = getattr(self, f"_{command}", None)
        if handler is None:
            raise UsageError(f"unknown command {command!r}.\n{HELP}")
        try:
            handler(*args)
        except TypeError as error:
            if "positional argument" in str(error):
                raise UsageError(f"wrong arguments for `%kernos {command}`.\n{HELP}") from None
            raise

    @property
    def _workspace(self):  # type: ignore[no-untyped-def]
        image = self.kernel.image
        if image is None:
            raise self.kernel.attach_error or KernosError("no workspace is attached")
        return image.workspace

    def _help(self) -> None:
        print(HELP)

    def _log(self, count: str = "20") -> None:
        if not count.isdigit():
            raise UsageError(f"`%kernos log N` takes a number, not {count!r}")
        print(history.format_log(history.log(self._workspace, limit=int(count))))

    def _show(self, ref: str = "HEAD") -> None:
        print(history.format_show(history.show(self._workspace, ref)))

    def _diff(self, ref_a: str, ref_b: str = "HEAD") -> None:
        result = history.diff(self._workspace, ref_a, ref_b)
        print(history.format_diff(result, ref_a, ref_b))

    def _checkout(self, ref: str) -> None:
        op = self.kernel.current_op
        if op is None:
            raise UsageError("`%kernos checkout` must run in a cell")
        report = op.checkout(ref)
        print(f"Checked out {ref} ({report.commit[:12]}, op {report.op}): {report.names} "
              f"names, {history.human_size(report.bytes)}. When this cell commits it is "
              f"recorded as op {op.id}; history is not rewritten.")

    def _scan(self) -> None:
        op = self.kernel.current_op
        if op is None:
            raise UsageError("`%kernos scan` must run in a cell")
        op.scan_everything()
        print("This op will check every value when it commits.")

    def _status(self) -> None:
        kernel = self.kernel
        image = kernel.image
        workspace = self._workspace
        assert image is not None
        head = image.head.hex()[:12] if image.head else "(empty history)"
        total = sum(state.stored.size for state in image.groups.values())
        commits = sum(1 for _ in workspace.history()) if image.head else 0
        lines = [
            f"workspace  {workspace.path}",
            f"head       {head}  op {image.head_op}",
            f"image      {len(image.meta)} names in {len(image.groups)} groups, "
            f"{history.human_size(total)} stored",
            f"history    {commits} snapshots, {history.human_size(workspace.disk_usage())} on disk",
        ]
        report = kernel.restore_report
        if report is not None:
            lines.append(f"restore    {report.names} names in {report.seconds:.2f} s at start"
                         + (f" ({report.recovery})" if report.recovery else ""))
        transients = image.transients()
        live = [t for t in transients if t["live"]]
        placeholders = [t for t in transients if not t["live"]]
        if live:
            lines.append("transient  (live in this session; a restore will put placeholders here)")
            lines += [f"    {t['path']}: {t['type_name']}: {t['reason']}" for t in live]
        if placeholders:
            lines.append("placeholders (these values were lost at the last restore)")
            lines += [f"    {t['path']}: {t['type_name']}: {t['reason']}" for t in placeholders]
        failed = [name for state in image.groups.values() if state.load_error
                  for name in state.stored.names]
        if failed:
            lines.append("not restored (still in the history): " + ", ".join(sorted(failed)))
        print("\n".join(lines))
