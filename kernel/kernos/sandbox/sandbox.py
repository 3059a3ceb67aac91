"""AsyncSandbox and Sandbox: an E2B-shaped code interpreter on one Kernos kernel.

The contract is the package docstring's (``kernos.sandbox``).  Here:
:class:`AsyncSandbox` does the work over an
:class:`~kernos.client.AsyncKernosClient`; :class:`Sandbox` is its blocking
facade, running it on an event loop in a thread of its own (callbacks are
called in the caller's thread, after the op).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import secrets
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

from kernos.client import (
    AsyncKernosClient,
    ClientError,
    KernelDied,
    KernosManager,
    NoKernelRunning,
    RequestError,
    RequestTimeout,
)
from kernos.harness.results import OpResult
from kernos.sandbox.errors import (
    InvalidArgumentException,
    SandboxDied,
    SandboxException,
    TimeoutException,
)
from kernos.sandbox.files import AsyncFilesystem, Filesystem
from kernos.sandbox.models import Execution, ExecutionError, OutputMessage, execution_from_op

__all__ = ["HUMAN", "AsyncSandbox", "Grant", "Sandbox"]

HUMAN = "human"
Grant = str | tuple[str, int | str | None]
"""A capability (``"read:ledger"``) or a capability with its limit (``("spend:USD", 100)``)."""

LANGUAGES = (None, "python", "py")
E2B_IGNORED = frozenset({"template", "timeout", "metadata", "api_key", "access_token",
                         "domain", "debug", "request_timeout", "secure",
                         "allow_internet_access", "proxy", "headers", "network",
                         "lifecycle", "auto_pause", "mcp"})
"""E2B's ``create`` options that mean nothing here (no cloud, no lifetime): accepted, unused."""

Returned = TypeVar("Returned")
Callback = Callable[[Any], Any]


class AsyncSandbox:
    """One principal's code interpreter on a Kernos workspace; make one with :meth:`create`."""

    def __init__(self, *, client: AsyncKernosClient, manager: KernosManager | None,
                 workspace: Path, principal: str, sandbox_id: str,
                 temporary: Path | None) -> None:
        self._client = client
        self._manager = manager
        self.workspace = workspace
        """The Kernos workspace (its history, image and files) this sandbox runs on."""
        self.principal = principal
        """Who every ``run_code`` and file call runs as."""
        self.sandbox_id = sandbox_id
        self._temporary = temporary
        self._killed = False
        cwd = "" if principal == HUMAN else f"agents/{principal}"
        self.files = AsyncFilesystem(lambda: self._live_client(), principal, cwd)

    # -- making one ----------------------------------------------------------------

    @classmethod
    async def create(cls, *, workspace: str | Path | None = None,
                     principal: str | None = None, grants: Iterable[Grant] = (),
                     limits: Mapping[str, int] | None = None, keep: bool = False,
                     envs: Mapping[str, str] | None = None, start_timeout: float = 120,
                     **e2b_options: Any) -> Self:
        """A sandbox on ``workspace`` (None: a fresh temporary one, deleted by
        :meth:`kill` unless ``keep``) running as ``principal`` (None: a new agent named
        after the sandbox id; ``"human"``: full Python, see the package docstring),
        which is added if missing and given each of ``grants`` it does not hold yet
        (``limits``: the new agent's limits).  If a kernel already serves
        ``workspace`` the sandbox joins it (and :meth:`kill` leaves it running);
        otherwise it starts one, with ``envs`` in its environment."""
        unknown = sorted(set(e2b_options) - E2B_IGNORED)
        if unknown:
            raise TypeError(f"Sandbox.create() got unexpected options {unknown}; it takes "
                            "workspace, principal, grants, limits, keep, envs, "
                            f"start_timeout, and ignores E2B's {sorted(E2B_IGNORED)}")
        wanted = [_grant(item) for item in grants]
        if principal == HUMAN and (wanted or limits):
            raise InvalidArgumentException("the human principal holds every capability and "
                                           "has no limits: drop grants= and limits=")
        sandbox_id = "sbx_" + secrets.token_hex(4)
        temporary = None
        if workspace is None:
            temporary = Path(tempfile.mkdtemp(prefix=f"kernos-{sandbox_id}-"))
            root = temporary / "workspace"
        else:
            root = Path(workspace).expanduser().absolute()
        manager: KernosManager | None = None
        try:
            client = None
            if temporary is None and (root / "kernel.json").exists():
                with contextlib.suppress(NoKernelRunning):
                    client = await AsyncKernosClient.connect(root)
            if client is None:
                manager = KernosManager(root, env=dict(envs or {}))
                await manager.start(timeout=start_timeout)
                client = await manager.client()
            name = principal or sandbox_id
            await _ensure_principal(client, name, wanted, limits)
        except BaseException:
            if manager is not None:
                await manager.shutdown()
            if temporary is not None:
                shutil.rmtree(temporary, ignore_errors=True)
            raise
        sandbox = cls(client=client, manager=manager, workspace=root, principal=name,
                      sandbox_id=sandbox_id, temporary=None if keep else temporary)
        return sandbox

    # -- running code --------------------------------------------------------------

    async def run_code(self, code: str, language: str | None = None, context: Any = None,
                       on_stdout: Callback | None = None, on_stderr: Callback | None = None,
                       on_result: Callback | None = None, on_error: Callback | None = None,
                       envs: Mapping[str, str] | None = None, timeout: float | None = None,
                       request_timeout: float | None = None) -> Execution:
        """Run ``code`` as one op of the sandbox's principal; its :class:`Execution`.

        A cell that fails (an exception, a denied capability, a vetoed op) rolls
        back and is an execution whose ``error`` is set, never an exception.
        Callbacks (plain or async) are called once the op is over, in order:
        each stdout chunk, each result, the error.  ``timeout`` (seconds):
        the op is interrupted (and rolls back) and :class:`TimeoutException` raised.
        Raises :class:`SandboxDied` if the kernel is gone."""
        execution = await self._execute(code, language, context, envs, timeout)
        for call in _callbacks(execution, on_stdout, on_stderr, on_result, on_error):
            outcome = call()
            if inspect.isawaitable(outcome):
                await outcome
        return execution

    async def _execute(self, code: str, language: str | None, context: Any,
                       envs: Mapping[str, str] | None, timeout: float | None) -> Execution:
        _check_run(code, language, context, envs)
        client = self._live_client()
        key = f"{self.sandbox_id}-{uuid.uuid4().hex}"
        outputs: list[tuple[str, dict[str, Any]]] = []
        try:
            reply = await client.request("op", timeout=timeout, principal=self.principal,
                                         code=code, key=key,
                                         output=lambda kind, content:
                                         outputs.append((kind, content)))
            result = OpResult.from_json(reply)
        except RequestTimeout:
            answer: dict[str, Any] = {}
            with contextlib.suppress(ClientError):
                answer = await client.interrupt(key=key, timeout=10)
            if answer.get("interrupted"):
                raise TimeoutException(
                    f"run_code ran over its timeout of {timeout:g} s: the op was interrupted "
                    "and rolled back; nothing it did was kept") from None
            raise TimeoutException(
                f"run_code ran over its timeout of {timeout:g} s and its op could not be "
                f"interrupted ({answer.get('reason', 'no answer')}): it may still be waiting "
                "for its turn or committing, and may commit; see sandbox.log()") from None
        except KernelDied as died:
            raise self._died(died) from None
        except RequestError as refused:
            return Execution(error=ExecutionError(
                name="RequestError", value=f"{refused.kind}: {refused.message}",
                traceback=f"RequestError: the kernel refused the op ({refused.kind}): "
                          f"{refused.message}"), status="rejected", principal=self.principal)
        return execution_from_op(result, outputs)

    def _live_client(self) -> AsyncKernosClient:
        if self._killed:
            raise SandboxDied(f"the sandbox {self.sandbox_id} was killed; make a new one "
                              f"(Sandbox.create(workspace={str(self.workspace)!r}, "
                              f"principal={self.principal!r}) finds its state)")
        return self._client

    def _died(self, died: KernelDied) -> SandboxDied:
        return SandboxDied(
            f"the sandbox {self.sandbox_id}'s kernel died ({died}); the cell did not run or "
            "rolled back. What committed before is kept: make a new sandbox with "
            f"Sandbox.create(workspace={str(self.workspace)!r}, "
            f"principal={self.principal!r}) to go on from there")

    # -- Kernos facts --------------------------------------------------------------

    @property
    def kernel_pid(self) -> int | None:
        """The kernel process's id (None if this sandbox joined a kernel it does not own)."""
        return None if self._manager is None else self._manager.pid

    async def log(self, limit: int | None = 10) -> list[dict[str, Any]]:
        """The history as the principal sees it, newest first (``kernos log``)."""
        return await self._live_client().log(limit, principal=self.principal)

    async def is_running(self) -> bool:
        if self._killed or not self._client.alive:
            return False
        return True if self._manager is None else await self._manager.is_alive()

    # -- ending --------------------------------------------------------------------

    async def kill(self) -> bool:
        """Stop the sandbox: shut its kernel down (a kernel it joined stays up) and
        delete its temporary workspace (unless ``keep``).  False if already killed."""
        if self._killed:
            return False
        self._killed = True
        try:
            await self._client.close()
            if self._manager is not None:
                await self._manager.shutdown()
        finally:
            if self._temporary is not None:
                shutil.rmtree(self._temporary, ignore_errors=True)
        return True

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await self.kill()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(sandbox_id={self.sandbox_id!r}, "
                f"principal={self.principal!r}, workspace={str(self.workspace)!r})")


class Sandbox:
    """The blocking :class:`AsyncSandbox`: ``Sandbox.create(...)`` or ``Sandbox(...)``
    (the same keyword arguments), ``run_code``, ``files``, ``kill``, ``with``."""

    def __init__(self, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="kernos-sandbox")
        self._thread.start()
        try:
            self._sandbox: AsyncSandbox = self._run(AsyncSandbox.create(**options))
        except BaseException:
            self._stop()
            raise
        self.files = Filesystem(self._sandbox.files, self._run)

    @classmethod
    def create(cls, **options: Any) -> Sandbox:
        """See :meth:`AsyncSandbox.create`."""
        return cls(**options)

    def _run(self, work: Awaitable[Returned]) -> Returned:
        if threading.current_thread() is self._thread:
            raise SandboxException("a blocking Sandbox method was called from its own event "
                                   "loop; use AsyncSandbox there")
        if not self._loop.is_running():
            raise SandboxDied("this Sandbox was killed; make a new one")
        future: Future[Returned] = asyncio.run_coroutine_threadsafe(_awaited(work),
                                                                    self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def _stop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        if not self._loop.is_closed():
            self._loop.close()

    @property
    def sandbox_id(self) -> str:
        return self._sandbox.sandbox_id

    @property
    def principal(self) -> str:
        return self._sandbox.principal

    @property
    def workspace(self) -> Path:
        return self._sandbox.workspace

    @property
    def kernel_pid(self) -> int | None:
        return self._sandbox.kernel_pid

    def run_code(self, code: str, language: str | None = None, context: Any = None,
                 on_stdout: Callback | None = None, on_stderr: Callback | None = None,
                 on_result: Callback | None = None, on_error: Callback | None = None,
                 envs: Mapping[str, str] | None = None, timeout: float | None = None,
                 request_timeout: float | None = None) -> Execution:
        """See :meth:`AsyncSandbox.run_code`; callbacks run in this thread."""
        if not self._loop.is_running():
            raise SandboxDied(f"the sandbox {self.sandbox_id} was killed; make a new one")
        execution = self._run(self._sandbox._execute(code, language, context, envs, timeout))
        for call in _callbacks(execution, on_stdout, on_stderr, on_result, on_error):
            call()
        return execution

    def log(self, limit: int | None = 10) -> list[dict[str, Any]]:
        return self._run(self._sandbox.log(limit))

    def is_running(self) -> bool:
        return self._loop.is_running() and self._run(self._sandbox.is_running())

    def kill(self) -> bool:
        """See :meth:`AsyncSandbox.kill`."""
        if not self._loop.is_running():
            return False
        try:
            return self._run(self._sandbox.kill())
        finally:
            self._stop()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.kill()

    def __repr__(self) -> str:
        return (f"Sandbox(sandbox_id={self.sandbox_id!r}, principal={self.principal!r}, "
                f"workspace={str(self.workspace)!r})")


async def _awaited(work: Awaitable[Returned]) -> Returned:
    return await work


def _grant(item: Any) -> tuple[str, int | str | None]:
    if isinstance(item, str):
        return item, None
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
        return item[0], item[1]
    raise InvalidArgumentException(f"a grant is a capability string or a (capability, "
                                   f"limit) pair, not {item!r}")


async def _ensure_principal(client: AsyncKernosClient, name: str,
                            grants: list[tuple[str, int | str | None]],
                            limits: Mapping[str, int] | None) -> None:
    """Add the agent ``name`` if missing, and grant it what it does not hold yet."""
    if name == HUMAN:
        return
    if name not in await client.agents():
        await client.add_agent(name, limits)
    held = {str(grant["capability"]) for grant in await client.grants(name)
            if grant.get("active", True)}
    for capability, limit in grants:
        if capability not in held:
            await client.grant(name, capability, limit)


def _check_run(code: str, language: str | None, context: Any,
               envs: Mapping[str, str] | None) -> None:
    if not isinstance(code, str):
        raise InvalidArgumentException(f"run_code: code is a str, not {type(code).__name__}")
    if language not in LANGUAGES:
        raise InvalidArgumentException(f"run_code: a Kernos sandbox runs Python only, not "
                                       f"{language!r}; leave language out")
    if context is not None:
        raise InvalidArgumentException("run_code: code contexts are not provided; a sandbox "
                                       "is one namespace, its principal's (make another "
                                       "sandbox, with another principal, for another)")
    if envs:
        raise InvalidArgumentException("run_code: per-run envs are not provided (an op "
                                       "does not change the kernel's environment); pass "
                                       "envs= to Sandbox.create for the kernel's")


def _callbacks(execution: Execution, on_stdout: Callback | None, on_stderr: Callback | None,
               on_result: Callback | None,
               on_error: Callback | None) -> list[Callable[[], Any]]:
    """The callback calls for ``execution``, in E2B's order."""
    calls: list[Callable[[], Any]] = []
    now = time.time_ns()

    def bind(callback: Callback, argument: Any) -> Callable[[], Any]:
        return lambda: callback(argument)

    if on_stdout is not None:
        calls += [bind(on_stdout, OutputMessage(line, now)) for line in execution.logs.stdout]
    if on_stderr is not None:
        calls += [bind(on_stderr, OutputMessage(line, now, error=True))
                  for line in execution.logs.stderr]
    if on_result is not None:
        calls += [bind(on_result, result) for result in execution.results]
    if on_error is not None and execution.error is not None:
        calls.append(bind(on_error, execution.error))
    return calls
