"""``%kernos``: the history and the workspace, from a notebook.

Each command is a thin call into ``kernos.history`` or the running op; the
formatting is shared with the CLI.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
import time
from collections.abc import Callable
from typing import Any

from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from kernos import history
from kernos.agents.capabilities import LIMITED_KINDS
from kernos.audit.human import format_records
from kernos.errors import InvalidGrant, KernosError, UsageError
from kernos.files import OWN_ROOT, PathRefused
from kernos.files.reading import stored_size
from kernos.kernel.host import KernelHost

HELP = """\
%kernos log [N]          the last N snapshots (default 20), newest first; an op that
                         changed tracked files says how many (files: +added ~changed -deleted)
%kernos show [REF]       one snapshot: its op, code, names, what it could not persist,
                         and the tracked files it changed (text diffs for small ones)
%kernos diff A [B]       names and tracked files that differ between snapshots A and B
                         (default: HEAD)
%kernos checkout REF     make the image equal to snapshot REF, as a new op
%kernos status           workspace, head, image size, values that cannot persist
%kernos on-error [rollback|keep]
                         what a cell that raises does: roll back (the default), or keep
                         what it did before the error as an op marked failed, as IPython
                         does (a setting of this workspace; agents' ops always roll back)
%kernos scan             make this cell's op check every value, not only those it names
%kernos track [PATH]     track directory PATH (relative to the working directory, or
                         absolute): its files commit and roll back with every op from
                         this cell on; alone, list the tracked directories
%kernos untrack PATH     stop tracking PATH (its files stay on disk and in the history)
%kernos inspect          a widget: objects, events, grants, history and plots of the image

%kernos agent add NAME [LIMIT=N ...]   a new agent with no grants (limits: seconds=,
                                       memory_mb=, recursion=, output_bytes=, ...)
%kernos grant NAME CAPABILITY [AMOUNT] grant call:TOOL, read:NAME, write:NAME,
                                       spend:UNIT AMOUNT, llm:MODEL TOKENS, agents:spawn,
                                       file:read:GLOB, file:write:GLOB (files root)
%kernos revoke NAME CAPABILITY|GRANT   revoke it (and every grant derived from it)
%kernos grants [NAME]                  grants, who granted them, what is left
%kernos tools                          the tool registry (latest versions)
%%agent NAME                           run the cell as agent NAME (restricted code)

%kernos events [SEQ] [topic=PATTERN]   committed events after sequence number SEQ
%kernos subscriptions                  the image's in-image subscribers
%kernos audit [N] [principal=P] [status=S] [topic=T]
                                       the last N audit records (default 20)
%kernos audit verify [INDEX:HASH] [since=INDEX:HASH]
                                       verify chain, snapshots and history (and an anchor;
                                       since=: only what came after that head digest)
%kernos erase SUBJECT                  erase a data subject's personal values (irreversible)

REF is a commit id (or a prefix), HEAD, HEAD~N, or @N for the snapshot of op N."""


@magics_class
class KernosMagics(Magics):
    def __init__(self, shell: Any, *, kernel: KernelHost) -> None:
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
        handler = getattr(self, f"_{command.replace('-', '_')}", None)
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

    # -- agents ------------------------------------------------------------------

    @cell_magic
    def agent(self, line: str, cell: str) -> None:
        """Run the cell as an agent: `%%agent NAME`."""
        name = line.strip()
        if not name:
            raise UsageError("`%%agent NAME` needs the agent's name")
        op = self.kernel.current_op
        if op is None:
            raise UsageError("`%%agent` must run in a cell")
        runtime = self.kernel.agent_runtime()
        runtime.registry.principal(name)  # unknown agent: a clear error, nothing runs
        op.act_as(name, "agent")
        try:
            runtime.run(name, cell, echo=lambda text: print(text, end=""))
        except Exception as error:
            # IPython shows what _render_traceback_ returns instead of every frame:
            # an agent's cell shows its own frames only, never the host's.
            shown = runtime.traceback_for_agent(error, name, cell)
            with contextlib.suppress(AttributeError):  # a class with __slots__
                error._render_traceback_ = lambda: shown  # type: ignore[attr-defined]
            raise

    def _agent(self, action: str = "", name: str = "", *settings: str) -> None:
        if action != "add" or not name:
            raise UsageError("`%kernos agent add NAME [LIMIT=N ...]`")
        limits = {}
        for setting in settings:
            key, sep, value = setting.partition("=")
            if not sep or not value.isdigit():
                raise UsageError(f"{setting!r}: limits are written NAME=INTEGER")
            limits[key] = int(value)
        added = self.kernel.agents.add(name, **limits)
        print(f"Added agent {added!r} with no grants.")

    def _grant(self, name: str, capability: str, limit: str | None = None) -> None:
        kind = capability.partition(":")[0]
        value: object = None
        if limit is not None:
            value = _parse_amount(limit)
        elif kind in LIMITED_KINDS:
            raise UsageError(f"`%kernos grant {name} {capability} AMOUNT` needs an amount")
        grant = self.kernel.agents.grant(name, capability, value)
        print(f"Granted {grant['capability']} to {name} as {grant['id']}"
              + (f", up to {grant['limit']}" if grant["limit"] is not None else "") + ".")

    def _revoke(self, name: str, capability_or_id: str) -> None:
        revoked = self.kernel.agents.revoke(name, capability_or_id)
        print(f"Revoked {', '.join(revoked)}.")

    def _grants(self, name: str | None = None) -> None:
        grants = self.kernel.agents.grants(name)
        if not grants:
            print("No grants." if name is None else f"{name} holds no grants.")
            return
        rows = [("id", "principal", "capability", "used/limit", "from", "op", "state")]
        for grant in grants:
            budget = "" if grant["limit"] is None else f"{grant['used']}/{grant['limit']}"
            state = "active" if grant["active"] else f"revoked (op {grant['revoked_op']})"
            source = str(grant["granted_by"]) + (f" ({grant['parent']})" if grant["parent"]
                                                 else "")
            rows.append((str(grant["id"]), str(grant["principal"]), str(grant["capability"]),
                         budget, source, str(grant["op"]), state))
        print(history.format_table(rows))

    def _tools(self) -> None:
        tools = self.kernel.agents.tools()
        if not tools:
            print("No tools yet.")
            return
        rows = [("tool", "version", "effect", "needs", "author", "op", "description")]
        rows += [(str(tool["name"]), str(tool["version"]), str(tool["effect"]),
                  str(tool["capability"]), str(tool["author"]), str(tool["op"]),
                  str(tool["description"])[:50]) for tool in tools]
        print(history.format_table(rows))

    # -- events and audit -----------------------------------------------------------

    def _events(self, *args: str) -> None:
        options, positional = _options(args, {"topic", "principal", "op"})
        if len(positional) > 1 or (positional and not positional[0].isdigit()):
            raise UsageError("`%kernos events [SEQ] [topic=PATTERN] [principal=P] [op=N]`")
        seq = int(positional[0]) if positional else 0
        op = options.get("op")
        if op is not None and not op.isdigit():
            raise UsageError(f"op= takes an op number, not {op!r}")
        found = self.kernel.events.since(seq, op=int(op) if op else None,
                                         topic=options.get("topic"),
                                         principal=options.get("principal"), limit=200)
        if not found:
            print("No committed events" + (f" after {seq}." if seq else "."))
            return
        rows = [("seq", "op", "principal", "topic", "payload")]
        rows += [(str(event["seq"]), str(event["op"]), str(event["principal"]),
                  str(event["topic"]), _short(event["payload"])) for event in found]
        print(history.format_table(rows))

    def _subscriptions(self) -> None:
        found = self.kernel.events.subscriptions()
        if not found:
            print("No subscriptions.")
            return
        rows = [("id", "pattern", "principal", "handler", "op")]
        rows += [(str(sub["id"]), str(sub["pattern"]), str(sub["principal"]),
                  str(sub["handler"]), str(sub["op"])) for sub in found]
        print(history.format_table(rows))

    def _audit(self, *args: str) -> None:
        if args and args[0] == "verify":
            options, positional = _options(args[1:], {"since"})
            if len(positional) > 1:
                raise UsageError("`%kernos audit verify [INDEX:HASH] [since=INDEX:HASH]`")
            report = self.kernel.audit.verify(positional[0] if positional else None,
                                              since=options.get("since"))
            print(report.summary())
            return
        options, positional = _options(args, {"principal", "status", "topic"})
        if len(positional) > 1 or (positional and not positional[0].isdigit()):
            raise UsageError("`%kernos audit [N] [principal=P] [status=S] [topic=T]`")
        limit = int(positional[0]) if positional else 20
        records = self.kernel.audit.records(limit=limit, principal=options.get("principal"),
                                            status=options.get("status"),
                                            topic=options.get("topic"))
        print(format_records(records))

    def _erase(self, subject: str) -> None:
        report = self.kernel.audit.erase(subject)
        print(f"Erased the data subject {report.subject!r}: key "
              f"{'destroyed' if report.key_destroyed else 'already gone'}, "
              f"{len(report.payloads)} audit payload(s) deleted, {report.live} live value(s) "
              f"now erased; audit record {report.record}. This cannot be undone.")

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
        report = op.checkout(ref, progress=self._checkout_progress())
        print(f"Checked out {ref} ({report.commit[:12]}, op {report.op}): {report.names} "
              f"names, {history.human_size(report.bytes)}. When this cell commits it is "
              f"recorded as op {op.id}; history is not rewritten.")

    def _checkout_progress(self) -> Callable[[int, int], None]:
        """Progress of a checkout: a bar in the cell's output (after half a second),
        ``kernos_progress`` on IOPub, and the inspectors' progress bars."""
        kernel = self.kernel
        report = kernel.progress_reporter(kernel.get_parent())
        started = time.perf_counter()
        shown = False

        def progress(done: int, total: int) -> None:
            nonlocal shown
            report("checkout", done, total)
            if total and (shown or time.perf_counter() - started > 0.5):
                shown = True
                sys.stdout.write(f"\rChecking out: {100 * done // total}% "
                                 f"({done / 1e6:.0f} of {total / 1e6:.0f} MB)")
                sys.stdout.flush()
                if done >= total:
                    sys.stdout.write("\n")

        return progress

    def _inspect(self) -> None:
        from IPython.display import display

        from kernos.inspector.widget import Inspector

        display(Inspector(self.kernel.inspection))

    def _scan(self) -> None:
        op = self.kernel.current_op
        if op is None:
            raise UsageError("`%kernos scan` must run in a cell")
        op.scan_everything()
        print("This op will check every value when it commits.")

    # -- tracked directories ---------------------------------------------------------

    def _track(self, path: str | None = None) -> None:
        files = self.kernel.attached_image().files
        if path is None:
            self._tracked()
            return
        op = self.kernel.current_op
        if op is None:
            raise UsageError("`%kernos track PATH` must run in a cell (the cell's op "
                             "commits the change)")
        absolute = os.path.abspath(os.path.expanduser(path))
        if not os.path.lexists(absolute):
            raise UsageError(f"cannot track {path!r}: {absolute} does not exist. Make the "
                             "directory first (os.makedirs), then track it")
        known = set(files.roots)
        elsewhere = {key for key in known if not files.is_local(key)}
        try:
            key = files.track(absolute)
        except PathRefused as error:  # not a directory, an overlap: nothing changed
            refused = PathRefused(error.path, error.reason)
            refused.args = (f"cannot track {path!r}: {error.reason}. Track a directory that "
                            "is not inside the workspace and neither holds nor sits inside "
                            "a tracked one (`%kernos track` lists them).",)
            raise refused from None
        where = files.directory(key)
        if key in elsewhere:
            print(f"{where} was tracked in another workspace or on another machine; it is "
                  f"tracked here from this cell on (as {key!r}): this cell's op stores what "
                  "it holds here, and `%kernos checkout` brings back what the history holds.")
            return
        if key in known:
            print(f"{where} is already tracked (as {key!r}).")
            return
        print(f"Tracking {where} as {key!r}: its files commit and roll back with every op "
              "from this cell on (this cell's op stores what it holds now). "
              f"`%kernos untrack {path}` stops it.")

    def _untrack(self, path: str) -> None:
        files = self.kernel.attached_image().files
        op = self.kernel.current_op
        if op is None:
            raise UsageError("`%kernos untrack PATH` must run in a cell (the cell's op "
                             "commits the change)")
        absolute = os.path.realpath(os.path.abspath(os.path.expanduser(path)))
        if absolute == os.path.realpath(files.directory(OWN_ROOT)):
            raise UsageError(f"{path!r} is the workspace's own files root "
                             f"(kernos.files.root()): it is always tracked")
        shown = {key: files.directory(key) for key in files.roots}
        if not files.untrack(absolute):
            listed = ", ".join(str(where) for key, where in shown.items() if key != OWN_ROOT)
            raise UsageError(f"{path!r} ({absolute}) is not a tracked directory; tracked: "
                             + (listed or "only the files root") + " (`%kernos track` lists "
                             "them)")
        print(f"Stopped tracking {absolute} from this cell on: its files stay on disk as they "
              "are, and the snapshots before this one keep what they held of it.")

    def _tracked(self) -> None:
        """The tracked directories, the files root first, with what the head holds of each."""
        image = self.kernel.attached_image()
        files = image.files
        rows = [("key", "directory", "files", "size")]
        for key in sorted(files.roots, key=lambda key: (key != OWN_ROOT, key)):
            committed = files.committed.get(key) if key in files.committed_roots else None
            if committed is None:
                count, size = "-", "(from this op on)"
            else:
                stored = committed.contents.files.values()
                count = str(len(stored))
                size = history.human_size(sum(stored_size(image.workspace, one)
                                              for one in stored))
            where = files.directory(key)
            rows.append((key, str(where) + ("" if where.is_dir() else "  (missing on disk)"),
                         count, size))
        print(history.format_table(rows))
        print("Files and size: what the head snapshot holds of each. "
              "`%kernos track PATH` / `%kernos untrack PATH` change the list.")

    def _on_error(self, value: str | None = None) -> None:
        workspace = self._workspace
        if value is None:
            print(f"on-error: {workspace.setting('on_error')}")
            return
        workspace.set_setting("on_error", value)
        print({"keep": "A cell that raises now keeps what it did before the error, as an op "
                       "marked failed (as IPython does). `%kernos on-error rollback` undoes "
                       "this setting.",
               "rollback": "A cell that raises now rolls back: it leaves the image as it "
                           "was."}[value])

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
        audit_index, audit_hash = image.audit.head()
        lines.append(f"audit      {audit_index + 1} records, head "
                     f"{audit_index}:{audit_hash[:16]}... (`%kernos audit verify`)")
        report = kernel.restore_report
        if report is not None:
            lines.append(f"restore    {report.names} names in {report.seconds:.2f} s at start"
                         + (f" ({report.recovery})" if report.recovery else ""))
        tail = workspace.tail
        lines.append(f"commits    {tail.appended} small commits by this kernel in {tail.syncs} "
                     f"syncs; {len(tail.frames)} waiting to be folded into git")
        if tail.sync_error is not None:
            lines.append(f"           the last sync failed: {tail.sync_error}; restart the kernel")
        lines.append(f"on-error   {workspace.setting('on_error')} (`%kernos on-error`)")
        transients = image.transients()
        quiet = [t for t in transients if t.get("lossless")]
        live = [t for t in transients if t["live"] and not t.get("lossless")]
        placeholders = [t for t in transients if not t["live"] and not t.get("lossless")]
        if live:
            lines.append("transient  (live in this session; a restore will put placeholders here)")
            lines += [f"    {t['path']}: {t['type_name']}: {t['reason']}" for t in live]
        if placeholders:
            lines.append("placeholders (these values were lost at the last restore)")
            lines += [f"    {t['path']}: {t['type_name']}: {t['reason']}" for t in placeholders]
        if quiet:
            lines.append("kept as placeholders, nothing lost (closed files, exhausted iterators)")
            lines += [f"    {t['path']}: {t['type_name']}: {t['reason']}" for t in quiet]
        failed = [name for state in image.groups.values() if state.load_error
                  for name in state.stored.names]
        if failed:
            lines.append("not restored (still in the history): " + ", ".join(sorted(failed)))
        print("\n".join(lines))


def _options(args: tuple[str, ...], allowed: set[str]) -> tuple[dict[str, str], list[str]]:
    options: dict[str, str] = {}
    positional: list[str] = []
    for arg in args:
        key, sep, value = arg.partition("=")
        if not sep:
            positional.append(arg)
        elif key in allowed:
            options[key] = value
        else:
            raise UsageError(f"unknown option {key!r}; options: {', '.join(sorted(allowed))}")
    return options, positional


def _short(value: object, width: int = 60) -> str:
    import json

    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= width else text[: width - 3] + "..."


def _parse_amount(text: str) -> object:
    """An amount typed in a magic: digits are an int, anything else a Decimal."""
    import decimal

    if text.isdigit():
        return int(text)
    try:
        return decimal.Decimal(text)
    except decimal.InvalidOperation:
        raise InvalidGrant(f"{text!r} is not an amount; write digits, like 50 or 12.5") from None
