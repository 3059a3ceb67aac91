"""The reach of a notebook cell, after IPython has transformed it.

IPython turns ``%magic`` and ``!shell`` lines into calls such as
``get_ipython().run_line_magic('time', 'x.append(1)')``.  A call to
``get_ipython()`` could do anything to the namespace, so by default it makes
a cell's reach *everything* (see ``kernos.analysis``).  That would make every
``%kernos log`` re-check the whole image, so a few well-known cases are read
more closely (an allowlist; anything else stays "everything"):

* magics that only read the namespace (``%who``, ``%kernos``, ``x?``) and shell
  escapes (``!ls``; an assignment such as ``files = !ls`` is a rebinding,
  which commits find by identity anyway) add nothing;
* ``%%agent`` runs restricted code that cannot touch the namespace except
  through the agent runtime, which tells the op what it changed;
* magics that run their argument as code in the namespace (``%time``,
  ``%timeit``, ``%%capture``, ``%prun``) add the reach of that code.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

from kernos.analysis import Reach, reach_of_source

__all__ = ["cell_reach"]

READ_ONLY_MAGICS = frozenset({
    "kernos", "who", "whos", "who_ls", "pwd", "lsmagic", "magic", "history", "pinfo",
    "pinfo2", "psearch", "pdoc", "pdef", "psource", "pfile", "quickref", "env",
})
CODE_MAGICS = frozenset({"time", "timeit", "capture", "prun"})
# Magics whose changes the agent runtime reports to the op itself (op.touch).
RUNTIME_MAGICS = frozenset({"agent"})
SHELL_CALLS = frozenset({"system", "getoutput"})


def cell_reach(transformed: str, transform: Callable[[str], str]) -> Reach:
    """The reach of an IPython-transformed cell; ``transform`` handles nested code."""
    try:
        tree = ast.parse(transformed)
    except SyntaxError:
        return Reach()  # does not compile: nothing will run
    extra = _Rewriter(transform)
    tree = ast.fix_missing_locations(extra.visit(tree))
    return reach_of_source(tree).union(extra.reach)


class _Rewriter(ast.NodeTransformer):
    def __init__(self, transform: Callable[[str], str]) -> None:
        self.transform = transform
        self.reach = Reach()

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        method = _ipython_method(node)
        if method is None:
            return node
        args = [arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                else None for arg in node.args]
        if method in SHELL_CALLS:
            return ast.copy_location(ast.Constant(None), node)
        if method == "run_line_magic" and len(args) >= 2 and args[0] is not None:
            name, line = args[0], args[1]
            if name in READ_ONLY_MAGICS:
                return ast.copy_location(ast.Constant(None), node)
            if name in CODE_MAGICS and line is not None:
                self._add_code(_strip_options(line))
                return ast.copy_location(ast.Constant(None), node)
        if method == "run_cell_magic" and len(args) >= 3 and args[0] is not None:
            name, line, body = args[0], args[1], args[2]
            if name in RUNTIME_MAGICS:
                return ast.copy_location(ast.Constant(None), node)
            if name in CODE_MAGICS and line is not None and body is not None:
                self._add_code(_strip_options(line))
                self._add_code(body)
                return ast.copy_location(ast.Constant(None), node)
        return node

    def _add_code(self, source: str) -> None:
        try:
            transformed = self.transform(source)
            ast.parse(transformed)
        except Exception:
            # The magic may still run something; assume it touches anything.
            self.reach = Reach.all("a magic's argument is not plain Python")
            return
        self.reach = self.reach.union(cell_reach(transformed, self.transform))


def _ipython_method(node: ast.Call) -> str | None:
    """``name`` for a call of the form ``get_ipython().name(...)``."""
    function = node.func
    if not isinstance(function, ast.Attribute):
        return None
    receiver = function.value
    if (isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Name)
            and receiver.func.id == "get_ipython" and not receiver.args):
        return function.attr
    return None


_OPTIONS_WITH_VALUES = frozenset({"-n", "-r", "-p", "-s", "-l", "-T", "-D"})


def _strip_options(line: str) -> str:
    """Drop leading ``-n 10 -r 3``-style options of %timeit and friends."""
    words = line.split(" ")
    while words and words[0].startswith("-"):
        option = words.pop(0)
        if option in _OPTIONS_WITH_VALUES and words:
            words.pop(0)
    return " ".join(words)
