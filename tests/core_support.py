"""An in-process workspace for unit tests of the core: an image, an event bus, reopening.

``CoreEnv(path)`` opens (or creates) the workspace at ``path`` with an image
whose namespace is a fresh ``__main__`` module (so functions defined by
``run`` persist by value, as in notebook cells) and an event bus bound to the
name ``bus``; ``reopen()`` is a kernel restart.  ``hidden`` names are put in
the namespace at every reopen and never persisted.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

from kernos import Image, Workspace
from kernos.events.bus import EventBus
from kernos.image import default_is_persistent
from kernos.op import AbortReport, CommitReport

__all__ = ["CoreEnv", "abort"]


class CoreEnv:
    """A workspace with an image and a bus on it; ``reopen()`` is a kernel restart."""

    def __init__(self, path: Path, hidden: dict[str, Any] | None = None) -> None:
        self.path = path
        self.hidden = {"bus": None, **(hidden or {})}
        self.workspace: Workspace | None = None
        self.reopen()

    @property
    def chain(self) -> Path:
        return self.path / "audit" / "chain.jsonl"

    def reopen(self) -> CoreEnv:
        self.close()
        self.workspace = Workspace.open(self.path)
        self.module = types.ModuleType("__main__")
        self.ns: dict[str, Any] = self.module.__dict__
        self.image = Image(self.workspace, self.ns, module=self.module,
                           is_persistent=lambda name: default_is_persistent(name)
                           and name not in self.hidden)
        self.restore_report = self.image.restore()
        self.bus = EventBus(self.image)
        self.ns.update({**self.hidden, "bus": self.bus})
        return self

    def close(self) -> None:
        if self.workspace is not None:
            self.workspace.close()
            self.workspace = None

    def __enter__(self) -> CoreEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, source: str, *, principal: str = "human") -> CommitReport:
        """Run ``source`` as one op; commit, or abort and re-raise."""
        op = self.image.begin(source=source, principal=principal)
        try:
            exec(compile(source, f"<op {op.id}>", "exec"), self.ns)
        except BaseException as error:
            op.abort(error=error)
            raise
        return op.commit()


def abort(env: CoreEnv, source: str) -> AbortReport:
    """Run ``source`` as an op that fails; return its rollback report."""
    op = env.image.begin(source=source)
    try:
        exec(compile(source, "<cell>", "exec"), env.ns)
    except BaseException as error:
        return op.abort(error=error)
    raise AssertionError(f"{source!r} did not fail")
