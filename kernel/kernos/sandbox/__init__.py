"""An E2B-style code interpreter on a Kernos kernel: switch by changing one import.

::

    from kernos.sandbox import Sandbox          # was: from e2b_code_interpreter import Sandbox

    with Sandbox.create() as sandbox:
        execution = sandbox.run_code("x = 40\\nprint('hi')\\nx + 2")
        execution.text                          # '42'
        execution.logs.stdout                   # ['hi\\n']
        sandbox.files.write("notes.md", "# found\\n")

``Sandbox`` (blocking) and ``AsyncSandbox`` (``await AsyncSandbox.create()``)
have ``e2b_code_interpreter.Sandbox``'s shape: ``create(...)`` (and the
constructor form ``Sandbox(...)``), ``run_code(code, language=None,
on_stdout=, on_stderr=, on_result=, on_error=, envs=, timeout=)`` returning an
``Execution`` (``results``, ``logs.stdout`` / ``logs.stderr``, ``error`` with
``name``, ``value``, ``traceback``, ``execution_count``, ``text``), ``files``
(``read``, ``write``, ``write_files``, ``list``, ``exists``, ``remove``),
``kill()``, ``is_running()``, ``sandbox_id`` and use as a context manager.
What differs is what a Kernos workspace gives that a cloud sandbox does not.

The design
----------
**A sandbox is one principal on one workspace, behind a real kernel.**
``Sandbox.create(workspace=None, principal=None, grants=(), limits=None,
keep=False, envs=None)`` starts a Kernos kernel on ``workspace`` through
``kernos.client`` (``KernosManager``), or joins the kernel that already
serves it.  With no workspace it makes a temporary one, deleted by ``kill()``
unless ``keep=True``.  With no principal it adds a new agent named after the
sandbox id (``sbx_1a2b3c4d``) with no grants; a named agent is added if
missing; each of ``grants`` (``"read:ledger"`` or ``("spend:USD", 100)``)
that it does not hold yet is granted, as the human.  E2B's cloud options
(``template``, ``timeout``, ``api_key``, ``metadata``, ...) are accepted and
ignored: a Kernos sandbox is local and lives until ``kill()``.

**Each ``run_code`` is one op of that principal** (the harness ``op``
request, with a fresh idempotency key): a cell that raises rolls back whole,
the principal's grants and budgets apply, and the op is in ``kernos log``
under the principal's name and in the audit chain.  ``execution_count`` is
the op number.  The namespace is the principal's: variables persist across
cells, and across sandboxes on the same workspace and principal.

**What runs: Kernos's restricted dialect** (docs/how-to/agents.md).  An
agent's code is a restricted Python: no imports beyond the allowlisted views
(``math``, ``json``, ``re``, ``datetime``, ``decimal``), no dunder access, no
``open``, no network; state outside its namespace is reached through
``read``/``write``/``call``/``spend``/``files`` under its grants.  Code an E2B
user writes for a full Linux box (``import pandas``, ``subprocess``,
``open("/tmp/x")``) is refused, and the refusal is the cell's
``execution.error``: ``name`` is the Kernos error's class
(``AgentCodeRejected`` for code the dialect refuses before it runs,
``CapabilityDenied`` or ``OpVetoed`` for a missing grant, which vetoes the
op even if the code catches it), ``value`` the message, which says what was
refused and what to do.  ``principal="human"`` is the explicit opt-in to
full Python: the code runs unrestricted in the kernel process, with the
operating-system rights of the user who started it, under no grants or
budgets.  Rollback, history and audit still hold, but it is not a security
boundary: use it only for code you would run in your own notebook.

**Output.**  The kernel captures what an op prints, stdout and stderr
together, into one bounded text (64 KiB) returned with its result: it is
``logs.stdout`` (one entry per line); ``logs.stderr`` stays empty unless the
kernel publishes a ``stream`` for the op.  What the code displays
(``IPython.display.display``: HTML, PNG, SVG, ..., in practice the human
principal's code, as agent code cannot import IPython) arrives on IOPub and is
collected through the client's ``output`` callback: each display is a
``Result`` (``is_main_result`` False) with E2B's fields per MIME type, and
other MIME types in ``extra``.  The final expression's value is the main
result: ``text`` its bounded repr, ``json`` its JSON when it is a dict or list
(the harness op sends a repr, not the value's MIME bundle, so a final
``HTML(...)`` expression is text: ``display`` it for its HTML).  The
callbacks are called after the op is over, in order (stdout chunks, stderr
chunks, results, the error), not as output arrives: the harness op does not
stream what it prints.  The error's ``traceback`` is the kernel's text (it
sends no frames): ``"Name: value"`` and what happened to the op.

**Files** are the workspace's files root, through the client's file requests
as the sandbox's principal (one op each, under its ``file:`` grants); relative
paths start at the working directory, ``agents/NAME/`` for an agent (its own,
no grant needed) and the root for the human; ``/path`` starts at the root
(``kernos.sandbox.files``).

**Persistence: kill and come back.**  ``kill()`` shuts the kernel down; a
new ``Sandbox.create(workspace=W, principal=P)`` finds P's variables and
files as the last committed op left them, which an E2B sandbox does not give.
**A kernel that dies** (``kill -9``, a crash) is not restarted behind the
caller's back: the next ``run_code`` raises ``SandboxDied``, which names the
workspace and principal to reopen; the cell that was running rolled back.
The caller decides whether to run it again.

**Not provided**: languages other than Python, code contexts
(``create_code_context``; a sandbox is one principal's namespace), per-run
``envs``, ``commands`` / ``pty`` (no shell: that is what the dialect keeps
out), ``Sandbox.connect(sandbox_id)`` and the class-level ``kill(sandbox_id)``
(reopen by workspace and principal instead), ``set_timeout`` / ``pause``
(nothing expires), and ``files`` streams, ``make_dir``, ``rename`` and
``watch_dir``.  Each refused argument raises ``InvalidArgumentException``
saying what to do instead.
"""

from __future__ import annotations

from kernos.sandbox.errors import (
    InvalidArgumentException,
    NotFoundException,
    PermissionDeniedException,
    SandboxDied,
    SandboxException,
    TimeoutException,
)
from kernos.sandbox.files import AsyncFilesystem, EntryInfo, Filesystem, FileType, WriteInfo
from kernos.sandbox.models import (
    Execution,
    ExecutionError,
    Logs,
    OutputMessage,
    Result,
    execution_from_op,
    result_from_bundle,
)
from kernos.sandbox.sandbox import AsyncSandbox, Sandbox

__all__ = [
    "AsyncFilesystem",
    "AsyncSandbox",
    "EntryInfo",
    "Execution",
    "ExecutionError",
    "FileType",
    "Filesystem",
    "InvalidArgumentException",
    "Logs",
    "NotFoundException",
    "OutputMessage",
    "PermissionDeniedException",
    "Result",
    "Sandbox",
    "SandboxDied",
    "SandboxException",
    "TimeoutException",
    "WriteInfo",
    "execution_from_op",
    "result_from_bundle",
]
