"""The compiler state a notebook's cells ran under, for replaying them exactly.

A kernel compiles each cell with IPython's ``CachingCompiler`` (a
:class:`codeop.Compile`): once a cell has run ``from __future__ import
annotations``, every later cell of that kernel process is compiled with the
feature in force, and its functions carry the flag in ``__code__.co_flags``
(and keep their annotations as strings).  A replayed cell must be compiled
with the same ``__future__`` flags, and with no others: not those of the
module that calls :func:`compile`.  A cell may ``await`` at its top level
(IPython's autoawait compiles with ``PyCF_ALLOW_TOP_LEVEL_AWAIT`` and awaits
a code object flagged ``CO_COROUTINE``); replay runs such a cell to its end
in an event loop of its own.

:class:`CellCompiler` follows those flags along the replayed cells, as the
kernel's compiler did.  The audit log does not record a kernel's restart (a
restart starts a new compiler with no flags), only a kernel's death, so the
flags are cleared at a ``died`` record and otherwise kept for the whole
history.  No Jupyter import: IPython's compiler is a ``codeop.Compile`` with
extra flags that never reach a code object's ``co_flags``.
"""

from __future__ import annotations
import __future__

import ast
import asyncio
import concurrent.futures
import inspect
from typing import Any

__all__ = ["CellCompiler"]

FILENAME = "<kernos-replay-cell>"

_FUTURE_FLAGS = tuple(getattr(__future__, name).compiler_flag
                      for name in __future__.all_feature_names)


class CellCompiler:
    """The ``__future__`` flags in force for the next cell of one kernel process."""

    def __init__(self) -> None:
        self.flags = 0
        """The ``__future__`` compiler flags the next cell is compiled under."""

    def ran(self, code: str) -> int:
        """Note a cell the kernel compiled (its transformed source); the flags it ran under.

        The cell's own ``from __future__`` imports count for it too: they must
        open the cell, and IPython compiles the statements after them with the
        features in force.  A cell that does not compile changes nothing (the
        kernel never compiled it either).
        """
        try:
            compiled = compile(code, "<cell>", "exec", dont_inherit=True,
                               flags=self.flags | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        except (SyntaxError, ValueError):
            return self.flags
        for flag in _FUTURE_FLAGS:
            if compiled.co_flags & flag:
                self.flags |= flag
        return self.flags

    def run(self, code: str, namespace: dict[str, Any]) -> tuple[bool, object]:
        """Run a cell (transformed, and noted with :meth:`ran`) in ``namespace``, as IPython
        did: under :attr:`flags`, awaiting it if it awaits at its top level; (whether it
        ended in an expression, that expression's value)."""
        flags = self.flags | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        tree = compile(code, FILENAME, "exec", flags=flags | ast.PyCF_ONLY_AST,
                       dont_inherit=True)
        final = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = tree.body.pop()
            assert isinstance(last, ast.Expr)
            final = compile(ast.Expression(body=last.value), FILENAME, "eval", flags=flags,
                            dont_inherit=True)
        _run(compile(tree, FILENAME, "exec", flags=flags, dont_inherit=True), namespace)
        if final is None:
            return False, None
        return True, _run(final, namespace)

    def restarted(self) -> None:
        """A new kernel process: a new compiler, with no ``__future__`` in force."""
        self.flags = 0


def _run(code: Any, namespace: dict[str, Any]) -> object:
    if not code.co_flags & inspect.CO_COROUTINE:
        return eval(code, namespace)
    return _await(eval(code, namespace))


def _await(coroutine: Any) -> object:
    """Run a top-level-await cell's coroutine to its end, in an event loop of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        with asyncio.Runner() as runner:
            return runner.run(coroutine)
    # A loop already runs in this thread (a replay started from a notebook): another thread.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(_await, coroutine).result()
