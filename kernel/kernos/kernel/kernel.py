"""The Kernos kernel: IPython's kernel, with every cell run as an op.

This is a thin adapter.  The image (``kernos.image``) decides what a cell
changed, what to write and how to roll back; the kernel only

* opens the workspace and restores its head image in the background at
  start-up, showing progress in the first cell if the restore is still going;
* wraps each ``execute_request`` in an op: the cell runs, then the op commits
  before the reply is sent, or rolls back if the cell failed (any
  ``BaseException``, interrupts included) or if the commit itself failed;
* reports the op in the reply's ``metadata["kernos"]`` (with ``names``, the
  global names the cell could reach, and for a rollback its ``outcome``:
  what the notebook's cell badges and stale markers read);
* keeps everything else out of the way of ops: comm messages wait for the
  running op, kernel subshells and the debugger are not offered (they would
  run code concurrently with a cell).

Interrupts (SIGINT) are honoured while the cell runs and deferred while the
op commits or rolls back, so a commit is never cut in half.

The kernel holds its parts and hands each what it needs: the start-up
(``startup``: the workspace, the image and its background restore), the
durability of commits and the idle fold (``durability``), what the notebook
and the inspectors are told of ended ops (``notices``), the harness requests
(``control``), the agents' loops (``loops``) and the inspector comm
(``inspector``).  This module keeps the request handling that ties them
together: ``do_execute``, the other handlers' order against ops, and the
features it does not offer.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ipykernel.ipkernel import IPythonKernel

from kernos import _faults
from kernos._version import __version__
from kernos.agents import AgentRuntime, Agents
from kernos.analysis import Reach, reach_of_source
from kernos.audit.human import Audit
from kernos.errors import DiskFull, KernosError, RequestRejected
from kernos.events.human import Events
from kernos.harness.protocol import PROGRESS_TYPE, REQUEST_TYPE
from kernos.harness.protocol import VERSION as PROTOCOL_VERSION
from kernos.harness.service import Handled
from kernos.image import Image, RestoreReport
from kernos.inspector.backend import notice_of
from kernos.kernel.control import Control, ThrottledProgress
from kernos.kernel.durability import Durability
from kernos.kernel.inspector import TARGET as INSPECTOR_TARGET
from kernos.kernel.inspector import KernelBackend
from kernos.kernel.interrupts import OpInterrupts, deferred_sigint
from kernos.kernel.leaving import InFlight
from kernos.kernel.loops import LoopDriver
from kernos.kernel.notices import NOTICE_MIME, Notices, say
from kernos.kernel.reach import cell_reach
from kernos.kernel.startup import LOOP_SETTLES, Startup
from kernos.kernel.streams import TARGET, EventStreams
from kernos.op import AbortReport, CheckoutReport, CommitReport, Op
from kernos.personal import personal
from kernos.remote.session import RemoteSession
from kernos.transaction import Status

__all__ = ["NOTICE_MIME", "KernosKernel"]

DEFAULT_MAX_SOURCE_BYTES = 4 * 1024 * 1024
_UNSUPPORTED_FEATURES = frozenset({"kernel subshells", "debugger"})


class KernosKernel(IPythonKernel):
    implementation = "kernos"
    implementation_version = __version__
    banner = (
        f"Kernos {__version__}: a persistent, transactional Python image.\n"
        "Every cell commits to the workspace history or rolls back. `%kernos help` lists "
        "the commands."
    )

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.startup = Startup(
            self.ipython, self.log, settle=self._settle_effects,
            advertise=lambda path, durable: self.control.advertise(path, durable))
        """The workspace and the image, from opening to restored (kernos.kernel.startup)."""
        self.current_op: Op | None = None
        self.max_source_bytes = int(
            os.environ.get("KERNOS_MAX_SOURCE_BYTES", DEFAULT_MAX_SOURCE_BYTES))
        self._op_lock = asyncio.Lock()
        self.durability = Durability(lambda: self.image, self.attached_image, self._op_lock,
                                     self.log)
        """The group commit's wait and the idle fold (kernos.kernel.durability)."""
        self._last_report: dict[str, Any] | None = None
        self._rollback_line: str | None = None
        """Said after the cell's traceback (``do_execute``)."""
        for message_type in ("comm_open", "comm_msg", "comm_close"):
            handler = self.shell_handlers.get(message_type)
            if handler is not None:
                self.shell_handlers[message_type] = self._after_ops(handler)
        from kernos.kernel.magics import KernosMagics

        self.ipython.register_magics(KernosMagics(self.shell, kernel=self))
        self._runtime: AgentRuntime | None = None
        self.agents = Agents(self.agent_runtime)
        self.events = Events(lambda: self.agent_runtime().events)
        self.audit = Audit(self.attached_image)
        self.streams = EventStreams(lambda: self.attached_image().audit)
        self.comm_manager.register_target(TARGET, self.streams.open)
        self.interrupts = OpInterrupts()
        self.control: Control = Control(self)
        self.loop_driver = LoopDriver(self)
        """Turns agents' running loops between requests (kernos.kernel.loops)."""
        self.inspection = KernelBackend(self)
        self.in_flight = InFlight(self.log)
        self.notices = Notices(self, self.inspection)
        """What the notebook and the inspectors are told of ended ops (kernos.kernel.notices)."""
        self.comm_manager.register_target(INSPECTOR_TARGET, self.inspection.open)
        # Hidden (interactive=False): the kernel's own names, never persisted.
        self.ipython.push({"agents": self.agents, "events": self.events, "audit": self.audit,
                           "personal": personal}, interactive=False)
        # The restore starts in start(): after IPython has run its startup files
        # and marked every name they defined as its own (user_ns_hidden).

    @property
    def ipython(self) -> Any:
        """The IPython shell (ipykernel types it as optional; a running kernel has one)."""
        shell = self.shell
        assert shell is not None
        return shell

    def start(self) -> None:
        # Harness requests commit as a group (Control.request); every other request
        # first makes the commits before it durable, so that nothing it shows (a
        # cell's output, an inspector's view, an event backlog) can be lost.
        for message_type, handler in list(self.shell_handlers.items()):
            if message_type != REQUEST_TYPE:
                handler = self.durability.durable_first(handler)
            # Counted while served: a shutdown lets it reply first (kernos.kernel.leaving).
            self.shell_handlers[message_type] = self.in_flight.tracked(handler)
        super().start()
        self.startup.attach()
        # The big values load once the kernel serves requests: loading them beside
        # its start-up would slow the start-up (and kernel_info) down, not the load.
        loop = asyncio.get_event_loop()
        loop.call_soon(loop.call_later, LOOP_SETTLES, self.startup.serving.set)
        loop.call_soon(self.loop_driver.start)

    # -- the workspace ---------------------------------------------------------

    @property
    def image(self) -> Image | None:
        """The workspace's image (None until the workspace is open, or if it cannot be)."""
        return self.startup.image

    @property
    def attach_error(self) -> KernosError | None:
        """Why no workspace is attached, if none is."""
        return self.startup.attach_error

    @property
    def remote(self) -> RemoteSession | None:
        """The workspace's git remote session, with ``$KERNOS_REMOTE``."""
        return self.startup.remote

    @property
    def restore_report(self) -> RestoreReport | None:
        return self.startup.report

    @property
    def restore_error(self) -> BaseException | None:
        return self.startup.error

    @property
    def _restore_done(self) -> threading.Event:
        return self.startup.done

    def attached_image(self) -> Image:
        """The image, or the reason there is none (raised)."""
        return self.startup.attached()

    def agent_runtime(self) -> AgentRuntime:
        """The agent runtime over this kernel's image."""
        image = self.attached_image()
        if self._runtime is None or self._runtime.image is not image:
            self._runtime = AgentRuntime(image)
        return self._runtime

    # -- serving requests, and telling inspectors ---------------------------------

    def serve(self, content: object, *, size: int | None = None,
              progress: Callable[[str, int, int], None] | None = None,
              announce: bool = True) -> Handled:
        """Carry out one harness request; the caller holds the op lock.

        Its committed events go to the ``kernos.events`` subscribers, and the
        inspectors are told how its op ended (:meth:`announce`; without
        ``announce``, the caller does that once the op is durable).
        """
        service = self.control.service()
        service.progress = progress
        try:
            with self.interrupts.installed():  # an op's body is interruptible, no more
                handled = service.handle(content, size=size)
        finally:
            service.progress = None
        if announce:
            self.announce(handled)
        return handled

    def announce(self, handled: Handled) -> None:
        """Tell the event subscribers and the inspectors what a served request committed."""
        if handled.events:
            _faults.point("notify")
            self.streams.publish(handled.events)
        notice = notice_of(handled.reply)
        if notice is not None:
            self.inspection.notify(notice)
        for report in handled.followups:
            self._notify_committed(report)

    def announce_trips(self) -> None:
        """Commit and publish the events of circuits an op just tripped (the caller holds
        the op lock); see ``HarnessService.announce_trips``."""
        try:
            report = self.control.service().announce_trips()
        except Exception as error:  # the kernel must keep serving; the next op retries
            self.log.error("Kernos: announcing a tripped circuit failed: %s", error)
            return
        if report is not None:
            if report.events:
                self.streams.publish(report.events)
            self._notify_committed(report)

    def _settle_effects(self) -> None:
        """Execute the external effects committed ops queued; record how they ended.

        Runs between ops (the caller holds the op lock, or the restore has
        not finished).  An effect's failure is recorded, never raised here.
        """
        try:
            reports = self.agent_runtime().effects.drain()
        except Exception as error:  # the kernel must keep serving; the next drain retries
            self.log.error("Kernos: executing effects failed: %s", error)
            return
        for report in reports:
            self._notify_committed(report)

    def progress_reporter(self, parent: dict[str, Any] | None) -> Callable[[str, int, int], None]:
        """A throttled ``(what, done, total)`` callback for a long step.

        It sends ``kernos_progress`` on IOPub (parent = the request, if any) and
        ``progress`` notices to the inspectors.
        """
        def send(report: dict[str, Any]) -> None:
            if parent is not None and self.session is not None:
                # The IOPub socket is thread-safe (its own thread sends), and a checkout
                # reports from inside a synchronous op, with the event loop blocked.
                self.session.send(self.iopub_socket, PROGRESS_TYPE, report, parent=parent,
                                  ident=self._topic(PROGRESS_TYPE))
            self.inspection.notify({"type": "progress", "what": report["what"],
                                    "done": report["done"], "total": report["total"]})

        return ThrottledProgress(send)

    async def wait_for_restore(self, parent: dict[str, Any] | None) -> None:
        """Wait for the start-up restore, reporting its progress to ``parent``'s sender."""
        if not self.startup.done.is_set():
            await self.startup.wait(self.progress_reporter(parent))

    def _notify_committed(self, report: CommitReport, extra: dict[str, str] | None = None, *,
                          checkout: CheckoutReport | None = None) -> None:
        self.notices.committed(report, extra, checkout=checkout)

    async def _ready(self) -> KernosError | None:
        """Wait for the restore (showing progress); return the reason ops cannot run, if any."""
        return await self.startup.ready()

    # -- execution -------------------------------------------------------------

    async def execute_request(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        """Refuse a malformed request with an error reply instead of dropping it."""
        problem = _malformed_execute_request(parent)
        if problem is None:
            await super().execute_request(stream, ident, parent)
            return
        self.log.error("Kernos: refused a malformed execute_request: %s", problem)
        self._last_report = None
        if self.session is None:
            return
        evalue = (f"The execute_request was malformed: {problem}. Nothing ran and the image "
                  "is unchanged. Send content with a string 'code' (see the Jupyter messaging "
                  "spec).")
        self.session.send(stream, "execute_reply", {
            "status": "error", "ename": "MalformedRequest", "evalue": evalue,
            "traceback": [evalue], "execution_count": self.execution_count,
        }, parent, ident=ident, metadata={"kernos": {"status": "rejected", "reason": problem}})

    async def do_execute(
        self,
        code: str,
        silent: bool,
        store_history: bool = True,
        user_expressions: dict[str, Any] | None = None,
        allow_stdin: bool = False,
        *,
        cell_meta: dict[str, Any] | None = None,
        cell_id: str | None = None,
    ) -> dict[str, Any]:
        self._last_report = None
        if not await self.startup.runs_before_restored(code):
            await self.wait_for_restore(self.get_parent())
        problem = await self._ready()
        if problem is None and len(code.encode("utf-8", "surrogatepass")) > self.max_source_bytes:
            problem = RequestRejected.oversized_source(
                len(code.encode("utf-8", "surrogatepass")), self.max_source_bytes)
        if problem is not None:
            self._last_report = {"status": "rejected", "reason": str(problem)}
            return self._error_reply(problem)
        image = self.image
        assert image is not None
        async with self._op_lock:
            with deferred_sigint():
                reach = self._reach(code)
                for expression in (user_expressions or {}).values():
                    reach = reach.union(reach_of_source(str(expression)) if isinstance(
                        expression, str) else Reach.all("a user expression is not a string"))
                try:
                    op = image.begin(source=code, reach=reach, blocking=False)
                except KernosError as error:  # a full disk, say: nothing ran
                    self._last_report = {"status": "rejected", "reason": str(error)}
                    return self._error_reply(error)
                self.current_op = op
            failure: BaseException | None = None
            reply: dict[str, Any] | None = None
            try:
                reply = await super().do_execute(
                    code, silent, store_history, user_expressions, allow_stdin,
                    cell_meta=cell_meta, cell_id=cell_id,
                )
            except BaseException as error:  # an interrupt between IPython's own handlers
                failure = error
            ok = failure is None and reply is not None and reply.get("status") == "ok"
            why: BaseException | tuple[str, str] | None = failure
            if why is None and reply is not None and not ok:
                why = (str(reply.get("ename", "")), str(reply.get("evalue", "")))
            keep = (not ok and failure is None and isinstance(why, tuple)
                    and self._keeps_failed_cells(op))
            outcome = self._finish(op, ok, why, keep=keep, silent=silent)
            self.current_op = None
            if self._last_report is not None:  # what the cell's badge and stale marker read
                self._last_report["names"] = reached_names(op.reach)
            # The cell's output, then its traceback, then Kernos's line on the rollback.
            if isinstance(outcome, BaseException):
                reply = self._error_reply(outcome, reply)
            elif failure is not None:
                reply = self._error_reply(failure)
            if self._rollback_line is not None:
                say(self._rollback_line)
                self._rollback_line = None
            if isinstance(outcome, CommitReport) and outcome.events:
                _faults.point("notify")
                self.streams.publish(outcome.events)
            self.notices.finished(op, outcome, why)
            if isinstance(outcome, CommitReport):
                self._settle_effects()
            self.announce_trips()
            if not silent:
                self.notices.placeholders(self.image)
        self.fold_when_idle()
        self.loop_driver.wake()  # the cell may have started, paused or reset a loop
        assert reply is not None
        return reply

    def _reach(self, code: str) -> Reach:
        try:
            transformed = self.ipython.transform_cell(code)
        except Exception:
            transformed = code
        return cell_reach(transformed, self.ipython.transform_cell)

    def _keeps_failed_cells(self, op: Op) -> bool:
        """Whether a cell that raised commits what it reached (``%kernos on-error keep``)."""
        if op.principal != "human" or op.vetoes:
            return False  # agents' ops and vetoed ops always roll back
        try:
            return op.image.workspace.setting("on_error") == "keep"
        except KernosError as error:  # an unreadable settings file: the safe default
            self.log.error("Kernos: %s", error)
            return False

    def _finish(self, op: Op, ok: bool, error: BaseException | tuple[str, str] | None = None,
                *, keep: bool = False, silent: bool = False
                ) -> CommitReport | BaseException | None:
        """Commit or roll back, never cut short by an interrupt.

        ``keep``: the cell raised, but it is committed as an op marked failed.
        What was rolled back, kept, or could not persist is said in one line
        each at the end of the cell's output (unless ``silent``).
        """
        while True:
            try:
                with deferred_sigint():
                    if op.status is not Status.ACTIVE:
                        return op.report
                    if keep and isinstance(error, tuple):
                        op.keep_failed(*error)
                    if not ok and not keep:
                        try:
                            aborted = op.abort(error=error)
                        except DiskFull as problem:  # rolled back; its record found no room
                            self._last_report = {**self._rolled_back(op, op.abort_report,
                                                                     silent=silent),
                                                 "error": str(problem)}
                            return problem
                        self._last_report = self._rolled_back(op, aborted, silent=silent)
                        return None
                    try:
                        report = op.commit()
                    except KernosError as problem:
                        self._last_report = {**self._rolled_back(op, op.abort_report,
                                                                 silent=silent),
                                             "error": str(problem)}
                        return problem
                    self._last_report = {"status": "committed", **report.to_json()}
                    if not silent:
                        self.notices.commit_lines(report)
                    return report
            except KeyboardInterrupt:
                continue

    def _rolled_back(self, op: Op, aborted: AbortReport | None, *,
                     silent: bool) -> dict[str, Any]:
        """The reply metadata of a rolled-back op; its summary ends the cell's output."""
        summary: dict[str, Any] = {"status": "rolled back", "op": op.id,
                                   "outcome": op.outcome[0], "audit": self._audit_head(op)}
        if aborted is not None:
            summary.update(reloaded=aborted.reloaded, undone=aborted.undone(),
                           message=aborted.summary())
            if not silent and not aborted.nothing_undone:
                self._rollback_line = f"kernos: {aborted.summary()}"
        return summary

    @staticmethod
    def _audit_head(op: Op) -> dict[str, Any]:
        index, digest = op.image.audit.head()
        return {"index": index, "hash": digest}

    def _error_reply(self, error: BaseException,
                     reply: dict[str, Any] | None = None) -> dict[str, Any]:
        """An error reply for a problem outside the cell's code, shown in the output too."""
        name = type(error).__name__
        message = str(error) or name
        content = {"ename": name, "evalue": message,
                   "traceback": [f"\x1b[0;31m{name}\x1b[0m: {message}"]}
        sys.stdout.flush()  # what the cell printed comes first
        sys.stderr.flush()
        if self.session is not None:
            self.session.send(self.iopub_socket, "error", content,
                              parent=self.get_parent("shell"), ident=self._topic("error"))
        return {
            **(reply or {}),
            "status": "error",
            **content,
            "execution_count": self.ipython.execution_count - 1,
            "user_expressions": {},
            "payload": (reply or {}).get("payload", []),
        }

    def finish_metadata(self, parent: Any, metadata: dict[str, Any],
                        reply_content: dict[str, Any]) -> dict[str, Any]:
        metadata = super().finish_metadata(parent, metadata, reply_content)
        if self._last_report is not None:
            metadata["kernos"] = self._last_report
        return metadata

    # -- keeping other requests out of the way of ops ----------------------------

    async def durable(self, ticket: int) -> None:
        """Return once the commits of ``ticket`` are durable (``Durability.durable``)."""
        await self.durability.durable(ticket)

    def _after_ops(self, handler: Callable[..., Any]) -> Callable[..., Any]:
        async def serialized(*args: Any) -> Any:
            parent = args[2] if len(args) > 2 and isinstance(args[2], dict) else None
            await self.wait_for_restore(parent)
            try:
                async with self._op_lock:
                    result = handler(*args)
                    if asyncio.iscoroutine(result):
                        result = await result
                    return result
            finally:
                self.fold_when_idle()
                # An inspector's or a widget's button may have resumed a loop or reset a
                # circuit: the driver looks at once, not at its next idle poll.
                self.loop_driver.wake()

        return serialized

    def fold_when_idle(self) -> None:
        """Fold the tail into git once the kernel idles (``Durability.fold_when_idle``)."""
        self.durability.fold_when_idle()

    @property
    def kernel_info(self) -> dict[str, Any]:
        info = dict(super().kernel_info)
        info["supported_features"] = [feature for feature in info.get("supported_features", [])
                                      if feature not in _UNSUPPORTED_FEATURES]
        info["kernos"] = {"protocol": PROTOCOL_VERSION, "version": __version__}
        return info

    async def create_subshell_request(self, socket: Any, ident: Any, parent: Any) -> None:
        if self.session is None:
            return
        reply = {"status": "error", "ename": "SubshellsUnsupported",
                 "evalue": "Kernos runs one request at a time so that every op is atomic; "
                           "it does not offer kernel subshells.", "traceback": []}
        self.session.send(socket, "create_subshell_reply", reply, parent, ident)

    async def do_debug_request(self, msg: dict[str, Any]) -> dict[str, Any]:
        return {
            "type": "response", "request_seq": msg.get("seq"), "success": False,
            "command": msg.get("command"),
            "message": "Kernos does not offer the debugger: it would change the image "
                       "outside an op.",
        }

    def do_shutdown(self, restart: bool) -> dict[str, Any]:  # type: ignore[override]
        # An interrupted cell rolls back and replies before the workspace and the shell
        # channel close under it (kernos.kernel.leaving).
        if not self.in_flight.settle():
            self.log.info("Kernos: shutting down while a request is still being served")
        self.loop_driver.stop()
        if self.image is not None:
            self.control.withdraw(Path(self.image.workspace.path))
            self.image.workspace.close()
        if self.remote is not None:  # after the close's fold: a final push, then the lease
            self.remote.close()
        return super().do_shutdown(restart)


MAX_REACHED_NAMES = 500
"""More names than this in a cell's reach are reported as ``None`` (everything)."""


def reached_names(reach: Reach) -> list[str] | None:
    """The reply's ``names``: the global names a cell's code could read or write, sorted
    (None: any name, as for code that calls ``exec`` or runs a magic)."""
    if reach.everything or len(reach.names) > MAX_REACHED_NAMES:
        return None
    return sorted(reach.names)


def _malformed_execute_request(parent: Any) -> str | None:
    """What is wrong with an execute_request, or None if ipykernel can handle it."""
    if not isinstance(parent, dict):
        return "the message is not a dict"
    content = parent.get("content")
    if not isinstance(content, dict):
        return f"its content is {type(content).__name__}, not an object"
    if not isinstance(content.get("code"), str):
        return ("its content has no 'code'" if "code" not in content
                else f"its 'code' is {type(content['code']).__name__}, not a string")
    for flag in ("silent", "store_history", "allow_stdin", "stop_on_error"):
        if flag in content and not isinstance(content[flag], bool):
            return f"its {flag!r} is {type(content[flag]).__name__}, not a boolean"
    if "user_expressions" in content and not isinstance(content["user_expressions"],
                                                        (dict, type(None))):
        return "its 'user_expressions' is not an object"
    if not isinstance(parent.get("metadata"), dict):
        return "its metadata is not an object"
    return None
