"""Checks shared by the integration tests: the history on disk and the image in a kernel."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# A canonical dump of the image, computed inside the kernel: every persisted name,
# its value walked recursively, and the identity of every object met on the way
# (the first visit of an object is labelled ``#n``, a later one ``@n``), so that
# ``b['ref'] is a`` is part of what is compared.  It is defined under a dunder
# name, which Kernos does not persist: the probe adds nothing to the image.
CANON = r'''
def __canon__():
    import hashlib
    shell = get_ipython()
    labels = {}

    def walk(value):
        if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
            return repr(value)
        if id(value) in labels:
            return '@%d' % labels[id(value)]
        labels[id(value)] = len(labels)
        tag = '#%d ' % labels[id(value)]
        kind = type(value)
        if kind is list:
            return tag + '[' + ', '.join(map(walk, value)) + ']'
        if kind is tuple:
            return tag + '(' + ', '.join(map(walk, value)) + ')'
        if kind is dict:
            return tag + '{' + ', '.join(walk(k) + ': ' + walk(v) for k, v in value.items()) + '}'
        if kind in (set, frozenset):
            return tag + kind.__name__ + '{' + ', '.join(map(walk, sorted(value, key=repr))) + '}'
        if isinstance(value, type):
            return tag + 'class ' + value.__qualname__
        if kind.__name__ == 'module':
            return tag + 'module ' + value.__name__
        if kind.__name__ == 'ndarray':
            digest = hashlib.sha1(value.tobytes()).hexdigest()
            return tag + 'ndarray %s %s %s' % (value.dtype.str, value.shape, digest)
        if kind.__name__ == 'DataFrame':
            return tag + 'DataFrame %s %s' % (value.to_json(orient='split'), dict(value.dtypes))
        if callable(value) and hasattr(value, '__code__'):
            return tag + 'function ' + value.__qualname__
        if hasattr(value, '__dict__'):
            return tag + 'instance of ' + walk(kind) + ' ' + walk(vars(value))
        return tag + kind.__name__ + ' ' + repr(value)

    # Not user_ns_hidden: IPython can wrongly hide restored names (see test_durability).
    ipython = {'In', 'Out', 'exit', 'quit', 'get_ipython', 'open'}
    names = sorted(name for name in shell.user_ns
                   if not name.startswith('_') and name not in ipython)
    return '\n'.join(name + ' = ' + walk(shell.user_ns[name]) for name in names)
'''


def canon(kernel: Any) -> str:
    """The kernel's canonical dump (defining the dump function first in a new kernel)."""
    result = kernel.run("print(__canon__())")
    if result.status == "error" and result.reply["content"]["ename"] == "NameError":
        defined = kernel.run(CANON)
        assert defined.committed, (defined.errors, defined.kernos)
        result = kernel.run("print(__canon__())")
    assert result.status == "ok", result.errors
    return str(result.stdout)


def git_view_current(workspace: Path, timeout: float = 30) -> None:
    """Make git's own view of the workspace hold every commit, then return.

    Ops commit to the tail (``kernos.store.tail``), which a running kernel
    folds into git once it has been idle for 50 ms, and the next process to
    open the workspace writable folds at once.  Tests that ask git itself
    (not Kernos) call this first: it waits for a live kernel's fold, and
    opens the workspace (folding it) when no kernel holds it.
    """
    from kernos import Workspace
    from kernos.errors import WorkspaceLocked

    tail = workspace / "tail"
    deadline = time.monotonic() + timeout
    while True:
        try:
            if tail.stat().st_size == 0:
                return
        except FileNotFoundError:
            return
        try:
            with Workspace.open(workspace, create=False, purpose="a test reading git"):
                return  # the open folded what a stopped kernel left
        except WorkspaceLocked:
            if time.monotonic() > deadline:
                raise AssertionError("the kernel holding the workspace never folded its "
                                     "tail") from None
            time.sleep(0.01)


def history_length(workspace: Path) -> int:
    """How many snapshots the workspace's branch holds."""
    git_view_current(workspace)
    done = subprocess.run(["git", "-C", str(workspace / "history.git"), "rev-list", "--count",
                           "main"], capture_output=True, text=True, check=True)
    return int(done.stdout)


def assert_workspace_sound(workspace: Path) -> None:
    """git fsck is clean (no dangling or unreachable object) and no commit is half-written."""
    git_view_current(workspace)  # not in the middle of a fold: its pack is there, its ref not yet
    done = subprocess.run(["git", "-C", str(workspace / "history.git"), "fsck", "--full",
                           "--strict", "--unreachable"], capture_output=True, text=True)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "dangling" not in output and "unreachable" not in output, output
    journal = workspace / "pending"  # kept open between commits, empty when none is pending
    assert not journal.exists() or journal.read_bytes() == b"", journal.read_text()
    packs = workspace / "history.git" / "objects" / "pack"
    assert not list(packs.glob("tmp_kernos_*")), "a half-written pack was left behind"
    scratch = workspace / "tmp"
    assert not scratch.exists() or not any(scratch.iterdir()), list(scratch.iterdir())


@contextlib.contextmanager
def raw_kernel(directory: Path, env: dict[str, str], *argv: str
               ) -> Iterator[tuple[subprocess.Popen[str], Any]]:
    """A kernel process started from a connection file in ``directory`` (ipc sockets),
    its stderr captured, and a ready ``BlockingKernelClient`` of it.  ``argv``: what
    to run instead of ``-m kernos.kernel``.  At the end the channels are stopped, and
    the process is killed if it still runs."""
    from jupyter_client import BlockingKernelClient
    from jupyter_client.connect import write_connection_file

    connection, _ = write_connection_file(str(directory / "connection.json"),
                                          transport="ipc", ip=str(directory / "k"))
    process = subprocess.Popen([sys.executable, *(argv or ("-m", "kernos.kernel")), "-f",
                                connection], stderr=subprocess.PIPE, text=True,
                               env={**os.environ, **env})
    client = BlockingKernelClient(connection_file=connection)
    client.load_connection_file()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=120)
        yield process, client
    finally:
        client.stop_channels()
        if process.poll() is None:
            process.kill()
            process.wait()


def token_api(base: str, token: str, path: str, method: str = "GET", body: object = None
              ) -> Any:
    """A JSON REST call to a Jupyter server or gateway at ``base`` that wants ``token``;
    the decoded answer (None when empty)."""
    request = urllib.request.Request(
        f"{base}{path}", method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read()
    return json.loads(text) if text else None


def git(repo: Path, *args: str, data: bytes | None = None) -> bytes:
    """``git --git-dir=repo ARGS`` (stdin: ``data``), which must succeed; its stdout."""
    return subprocess.run(["git", f"--git-dir={repo}", *args], input=data, capture_output=True,
                          check=True).stdout
