"""The corpus harness: the world payloads attack, and how a payload is run.

Every payload runs in a *forked* copy of the test process (:func:`run_isolated`):
the child opens the workspace the ``world`` fixture prepared, restores it into
an :class:`~kernos.Image` with an :class:`~kernos.agents.AgentRuntime`, runs
the payload as ``mallory`` (then its follow-ups, then a few ordinary ops),
checks the live state and sends a report back.  Forking keeps a payload that
gets its process killed (the watchdog's second layer) or that leaves agent
code behind to run later from taking pytest with it.  The parent then
restores the workspace on its own, checks what was *committed*, and checks
that fresh ops still work (:func:`committed_violations`).  What counts as a
goal reached is in ``goals``.

The world (:func:`build_world`):

* the human namespace holds ``SECRET`` (mallory holds no grant for it),
  ``canary_path`` (a file whose content is a secret too), ``target_path`` (a
  file that must never be created), ``public`` and ``scratch``;
* ``mallory`` holds read:public, read:canary_path, read:target_path,
  write:scratch, call:echo and spend:USD 10, under small limits;
* ``victim`` holds read:SECRET and call:echo and keeps ``vsecret``.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import signal
import sys
import time
import traceback
import types
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernos import Image, Workspace
from kernos.agents import AgentRuntime, Agents, context
from kernos.agents.guards import AGENT_BUILTINS
from kernos.agents.limits import AGENT_FILENAME_PREFIX, Limits
from kernos.errors import KernosError, OpVetoed
from security.goals import (
    MALLORY_GRANTS,
    VICTIM_GRANTS,
    World,
    describe_error,
    exception_violations,
    fingerprint,
    goal_violations,
)
from security.payload import Payload

MALLORY_LIMITS = {"seconds": 1, "hard_seconds": 8, "memory_mb": 64, "recursion": 60}
CHILD_TIMEOUT = 60.0
STEP_SLACK = 1.0
"""How far past its deadline an op may finish (commit included)."""


def echo(text: str) -> str:
    """The human's harmless tool that mallory may call."""
    return text


def peek() -> str:
    """A human tool mallory holds no grant for."""
    return "peeked"


ECHO_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}},
               "required": ["text"]}


# -- the world ------------------------------------------------------------------


def open_image(world: World) -> tuple[Workspace, Image, AgentRuntime, Agents, dict[str, Any]]:
    workspace = Workspace.open(world.workspace, purpose="security corpus", durable=False)
    namespace: dict[str, Any] = {}
    image = Image(workspace, namespace)
    image.restore()
    runtime = AgentRuntime(image, default_limits=Limits(seconds=5, hard_seconds=30))
    return workspace, image, runtime, Agents(lambda: runtime), namespace


def build_world(root: Path) -> World:
    token = uuid.uuid4().hex
    world = World(root=root, workspace=root / "ws", canary=root / "files" / "canary.txt",
                  target=root / "files" / "target.txt", secret=f"s3cr3t-{token}",
                  vsecret=f"v1ct1m-{token[::-1]}", canary_text=f"canary-{token[:16]}")
    world.canary.parent.mkdir(parents=True)
    world.canary.write_text(world.canary_text)
    workspace, image, runtime, agents, namespace = open_image(world)
    try:
        op = image.begin(source="setup")
        namespace.update(world.human_initial())
        agents.add("mallory", **MALLORY_LIMITS)
        agents.add("victim")
        agents.register_tool("echo", echo, schema=ECHO_SCHEMA, description="echo")
        agents.register_tool("peek", peek, schema={"type": "object", "properties": {}},
                             description="peek")
        for capability, limit in MALLORY_GRANTS:
            agents.grant("mallory", capability, limit)
        for capability, limit in VICTIM_GRANTS:
            agents.grant("victim", capability, limit)
        runtime.run("victim", f"vsecret = {world.vsecret!r}")
        op.commit()
    finally:
        workspace.close()
    return world


# -- agent code running where it must not -------------------------------------------------


class Unsupervised(Exception):
    """Raised into agent code found running outside any supervised run."""


class Detector:
    """A trace function that catches agent frames starting outside the runtime's runs.

    The supervisor replaces it during a run and puts it back afterwards, so it
    only ever sees host time: commits, rollbacks, restores, the human's calls.
    It also stops that code (so a payload cannot hang the test).
    """

    def __init__(self) -> None:
        self.seen: list[str] = []

    def __call__(self, frame: types.FrameType, event: str, arg: object) -> Any:
        if frame.f_code.co_filename.startswith(AGENT_FILENAME_PREFIX):
            return self._line  # a generator closed without running a line is harmless
        return None

    def _line(self, frame: types.FrameType, event: str, arg: object) -> Any:
        if event == "line" and context.running() is None:
            name = frame.f_code.co_filename
            self.seen.append(f"{name} {frame.f_code.co_name}() line {frame.f_lineno}")
            raise Unsupervised(f"agent code ran unsupervised: {name}")
        return self._line

    @contextlib.contextmanager
    def active(self) -> Iterator[Detector]:
        previous_trace, previous_hook = sys.gettrace(), sys.unraisablehook
        sys.unraisablehook = self._unraisable
        sys.settrace(self)
        try:
            yield self
        finally:
            sys.settrace(previous_trace)
            sys.unraisablehook = previous_hook

    def _unraisable(self, info: Any) -> None:
        text = "".join(traceback.format_exception(info.exc_type, info.exc_value,
                                                  info.exc_traceback))
        if AGENT_FILENAME_PREFIX in text and info.exc_type is not Unsupervised:
            self.seen.append(f"an error from agent code in host time: {info.exc_type.__name__}")


# -- running a payload (in the child) ----------------------------------------------------------


@dataclass
class Step:
    who: str
    raised: str | None = None
    committed: bool = False
    vetoed: bool = False
    denials: int = 0
    seconds: float = 0.0
    output: str = ""


@dataclass
class Report:
    steps: list[dict[str, Any]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    crashed: str | None = None
    """The runner raised (a traceback)."""
    killed: str | None = None
    """The process died without a report (the watchdog's kill, faulthandler's exit): how."""


class Session:
    """The child's image and runtime, and the record of what happened."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.workspace, self.image, self.runtime, self.agents, self.ns = open_image(world)
        self.violations: list[str] = []
        self.steps: list[Step] = []
        self.texts: list[str] = []
        self.results: dict[str, object] = {}
        self.builtins_before = {key: id(value) for key, value in AGENT_BUILTINS.items()}

    def agent_op(self, who: str, source: str) -> Step:
        """Run ``source`` as ``who`` in an op and commit it, as a kernel cell would."""
        step = Step(who=who)
        denials = len(self.runtime.denials)
        before = self.fingerprint(who)
        op = self.image.begin(source="")
        started = time.monotonic()
        try:
            step.output = self.runtime.run(who, source).output
        except BaseException as error:
            problems = exception_violations(error)
            step.raised = describe_error(error, problems)
            step.vetoed = isinstance(error, OpVetoed)
            self.violations += [f"{who}'s op: {problem}" for problem in problems]
            if not isinstance(error, Exception):
                self.violations.append(f"{who}'s op raised a {type(error).__name__}, which is "
                                       "not an Exception")
            op.abort()
        else:
            try:
                op.commit()
                step.committed = True
            except OpVetoed:
                step.vetoed = True
            except BaseException as error:
                step.raised = f"commit: {describe_error(error)}"
                self.violations.append(f"{who}'s commit failed: {step.raised}")
        step.seconds = time.monotonic() - started
        step.denials = len(self.runtime.denials) - denials
        self.texts += [step.output, step.raised or ""]
        limit = self.runtime.limits_for(who).seconds
        if step.seconds > limit + STEP_SLACK:
            self.violations.append(f"{who}'s op took {step.seconds:.1f} s, past its {limit} s "
                                   "deadline")
        if step.denials and step.committed:
            self.violations.append(f"{who}'s op committed after {step.denials} denial(s)")
        if not step.committed and self.fingerprint(who) != before:
            self.violations.append(f"{who}'s namespace changed although its op did not commit")
        self.steps.append(step)
        return step

    def host_op(self, source: str) -> None:
        """The human's own Python in an op (``agents`` in scope); ``result`` is checked."""
        op = self.image.begin(source=source)
        scope: dict[str, Any] = {"agents": self.agents, "runtime": self.runtime}
        try:
            exec(compile(source, "<host>", "exec"), scope)
        except KernosError as error:
            self.texts.append(describe_error(error))
            op.abort()
        except BaseException as error:
            self.violations.append(f"the human's call broke: {describe_error(error)}")
            op.abort()
        else:
            with contextlib.suppress(OpVetoed):
                op.commit()
        if "result" in scope:
            self.results["the human's result"] = scope["result"]

    def fingerprint(self, who: str) -> str:
        items = self.runtime.namespace(who).user_items()
        return fingerprint(sorted(items.items()))

    def check(self) -> None:
        self.violations += goal_violations(self.world, self.runtime, self.ns,
                                           texts=self.texts, host_values=self.results)
        if {key: id(value) for key, value in AGENT_BUILTINS.items()} != self.builtins_before:
            self.violations.append("the agent builtins (shared by every agent) changed")


def run_payload(world: World, payload: Payload) -> Report:
    """Run one payload, its follow-ups and ordinary ops after it, then check (in the child)."""
    session = Session(world)
    detector = Detector()
    with detector.active():
        try:
            session.agent_op("mallory", payload.source)
            if payload.followup is not None:
                session.agent_op("mallory", payload.followup)
            if payload.victim is not None:
                session.agent_op("victim", payload.victim)
            if payload.host is not None:
                session.host_op(payload.host)
            # Ordinary ops after the attack: what it left behind may go off in them.
            session.agent_op("mallory", "tail = 1")
            session.agent_op("victim", "v_tail = 3")
            session.check()
        finally:
            session.workspace.close()
        report = Report(steps=[step.__dict__ for step in session.steps],
                        violations=session.violations)
        del session  # and with it whatever only the session kept alive
        gc.collect()
    report.violations += [f"agent code ran outside a supervised run: {where}"
                          for where in detector.seen]
    return report


def run_isolated(world: World, payload: Payload,
                 runner: Callable[[World, Payload], Report] = run_payload,
                 timeout: float = CHILD_TIMEOUT) -> Report:
    """``runner(world, payload)`` in a forked child; a killed child is a violation."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 0
        try:
            os.close(read_end)
            try:
                report = runner(world, payload)
            except BaseException:
                report = Report(crashed=traceback.format_exc())
            with os.fdopen(write_end, "wb") as pipe:
                pipe.write(json.dumps(report.__dict__, default=repr).encode())
        except BaseException:
            status = 1
        finally:
            os._exit(status)
    os.close(write_end)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                chunks = [json.dumps({"crashed": "the child timed out"}).encode()]
                break
            ready, _, _ = select.select([read_end], [], [], 0.2)
            if ready:
                chunk = os.read(read_end, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
    finally:
        os.close(read_end)
        _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        killed = f"the process was killed by signal {os.WTERMSIG(status)}"
    elif not chunks:  # faulthandler's hard deadline exits the process with status 1
        killed = (f"the process exited (status {os.waitstatus_to_exitcode(status)}) "
                  "without a report")
    else:
        return Report(**json.loads(b"".join(chunks)))
    return Report(killed=killed, violations=[
        f"{killed}: the in-interpreter layer did not stop the payload"])


def committed_violations(world: World) -> list[str]:
    """Restore the workspace afresh (in this process), check it, and check it still serves."""
    found: list[str] = []
    detector = Detector()
    with detector.active():
        workspace, image, runtime, _, ns = open_image(world)
        try:
            found += goal_violations(world, runtime, ns, texts=[], host_values={})
            for who, source in (("victim", "x = 1\nr = len([1, 2, 3])"), ("mallory", "y = 2")):
                op = image.begin(source="")
                try:
                    runtime.run(who, source)
                    op.commit()
                except BaseException as error:
                    found.append(f"a fresh {who} op fails: {describe_error(error)}")
                    with contextlib.suppress(Exception):
                        op.abort()
            names = runtime.namespace("victim").user_items()
            if names.get("x") != 1 or names.get("r") != 3:
                found.append(f"a fresh victim op did not take effect: {sorted(names)}")
        finally:
            workspace.close()
    return found + [f"agent code ran outside a supervised run (restore): {where}"
                    for where in detector.seen]
