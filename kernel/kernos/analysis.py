"""Which variables can an op change?  Answered before it runs, from its code.

Re-serializing the whole namespace after every op would make a ``counter += 1``
cell cost as much as pickling a 200 MB image.  Instead an op's *reach* is the
set of global names its code (and nested code) mentions, widened afterwards by
the image to the code stored by value in the groups it reaches (a function
defined in an earlier cell, the methods of a cell-defined class, a lambda kept
in a dict).  Values outside the reach cannot have been touched by the op
through the namespace, so they are neither re-pickled nor re-hashed.

Rebinding is never guessed: the image compares the identity of every bound
value with the last commit, so ``global x; x = 1`` inside a function is seen
whatever the reach says.

When code can reach the namespace without naming variables (``globals()``,
``exec``, ``sys.modules['__main__']``, frames, ...), the reach is *everything*
and every value is checked.  This list is a cost heuristic for trusted code,
not a security boundary; agent code is contained by other means.  Known
limit: objects reachable both from the namespace and from outside it (module
state, other threads, a library's registry) can change without the op naming
them; such changes are saved by the next op that names the variable, or by
an op that runs ``%kernos scan``.
"""

from __future__ import annotations

import ast
import types
from dataclasses import dataclass

from kernos.serialize.pickler import code_names

__all__ = ["DYNAMIC_NAMES", "Reach", "reach_of_code", "reach_of_names", "reach_of_source"]

#: Names through which code can read or write the namespace without naming a variable.
DYNAMIC_NAMES = frozenset({
    "globals", "vars", "locals", "eval", "exec", "execfile", "__import__", "__main__",
    "get_ipython", "modules", "user_ns", "user_global_ns", "f_globals", "f_locals", "f_back",
    "__globals__", "_getframe", "currentframe", "run_path", "run_module",
    "get_objects", "get_referrers", "ctypes",
})


@dataclass(frozen=True)
class Reach:
    """The global names an op may touch, or everything."""

    names: frozenset[str] = frozenset()
    everything: bool = False
    why: str = ""

    @classmethod
    def all(cls, why: str) -> Reach:
        return cls(everything=True, why=why)

    def union(self, other: Reach) -> Reach:
        if self.everything:
            return self
        if other.everything:
            return other
        return Reach(self.names | other.names)


def reach_of_names(names: frozenset[str]) -> Reach:
    dynamic = names & DYNAMIC_NAMES
    if dynamic:
        return Reach.all(f"the code uses {', '.join(sorted(dynamic))}")
    return Reach(names)


def reach_of_code(code: types.CodeType) -> Reach:
    return reach_of_names(code_names(code))


def reach_of_source(source: str | ast.Module, filename: str = "<op>") -> Reach:
    """The reach of Python source (or a parsed module); empty if it does not compile.

    Code that does not compile never runs, so it can change nothing.
    """
    try:
        code = compile(source, filename, "exec", dont_inherit=True,
                       flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except (SyntaxError, ValueError, TypeError):
        return Reach()
    return reach_of_code(code)
