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

A reach also says *how* the op's own code uses a name, when every use is one
that touches known entries only (``uses``): ``memory.append(r)``,
``table[7]['v'] += 1``, ``log.get('k')``, ``len(d)``.  A big list or dict
stored in segments (``kernos.serialize.segments``) then re-pickles only the
segments those entries are in.  Any other use of the name anywhere in the
code (passed to a call, aliased, iterated, sliced, deleted from, rebound,
mentioned in a nested function or by code stored with another value) drops
it from ``uses``, and the whole value is checked.  The same known limit
applies: a change made through a path that does not name the variable (an
alias outside the namespace) is saved by the next op that checks the whole
value (``%kernos scan``).
"""

from __future__ import annotations

import ast
import types
from collections.abc import Mapping
from dataclasses import dataclass, field

from kernos.serialize.pickler import code_names

__all__ = ["DYNAMIC_NAMES", "Reach", "Use", "reach_of_code", "reach_of_names", "reach_of_source",
           "uses_of_tree"]

#: Names through which code can read or write the namespace without naming a variable.
DYNAMIC_NAMES = frozenset({
    "globals", "vars", "locals", "eval", "exec", "execfile", "__import__", "__main__",
    "get_ipython", "modules", "user_ns", "user_global_ns", "f_globals", "f_locals", "f_back",
    "__globals__", "_getframe", "currentframe", "run_path", "run_module",
    "get_objects", "get_referrers", "ctypes",
})


@dataclass(frozen=True)
class Use:
    """Every way an op's code uses one name, when all of them touch known entries only.

    ``appends``: ``N.append(...)`` or ``N.extend(...)``; ``keys``: the constant
    keys (or indices) of ``N[key]``, ``N.get(key)`` and ``N.setdefault(key)``,
    read or written; ``calls_len``: ``len(N)``, which holds only while ``len``
    is the builtin.
    """

    appends: bool = False
    keys: frozenset[object] = frozenset()
    calls_len: bool = False

    def merge(self, other: Use) -> Use:
        return Use(appends=self.appends or other.appends, keys=self.keys | other.keys,
                   calls_len=self.calls_len or other.calls_len)


@dataclass(frozen=True)
class Reach:
    """The global names an op may touch, or everything."""

    names: frozenset[str] = frozenset()
    everything: bool = False
    why: str = ""
    uses: Mapping[str, Use] = field(default_factory=dict, compare=False)
    """Names of ``names`` that the code uses only in the ways a :class:`Use` lists."""

    @classmethod
    def all(cls, why: str) -> Reach:
        return cls(everything=True, why=why)

    def union(self, other: Reach) -> Reach:
        if self.everything:
            return self
        if other.everything:
            return other
        return Reach(self.names | other.names, uses=_merge_uses(self, other))

    def without_uses(self, names: frozenset[str] | set[str]) -> Reach:
        """This reach, with ``names`` used in unknown ways."""
        if self.everything or not names & self.uses.keys():
            return self
        return Reach(self.names, uses={name: use for name, use in self.uses.items()
                                       if name not in names})


def _merge_uses(one: Reach, other: Reach) -> dict[str, Use]:
    """A name keeps a use only if each side that reaches it knows how it is used."""
    merged: dict[str, Use] = {}
    for name in one.names | other.names:
        uses = [side.uses.get(name) for side in (one, other) if name in side.names]
        if all(use is not None for use in uses):
            found = [use for use in uses if use is not None]
            merged[name] = found[0].merge(found[1]) if len(found) == 2 else found[0]
    return merged


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
        tree = source if isinstance(source, ast.Module) else compile(
            source, filename, "exec", dont_inherit=True,
            flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT | ast.PyCF_ONLY_AST)
    except (SyntaxError, ValueError, TypeError):
        return Reach()
    reach = reach_of_code(code)
    if reach.everything:
        return reach
    uses = uses_of_tree(tree)
    return Reach(reach.names, uses={name: use for name, use in uses.items()
                                    if name in reach.names})


_APPENDS = frozenset({"append", "extend"})
_KEYED = frozenset({"get", "setdefault"})
_KEY_TYPES = (int, str, bytes, float, type(None))


def uses_of_tree(tree: ast.AST) -> dict[str, Use]:
    """The names that ``tree`` uses only in the ways a :class:`Use` lists, with those uses.

    Every ``Name`` node counts, in any scope (a local that happens to share
    the name only makes the answer more cautious).
    """
    parents: dict[int, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    found: dict[str, Use] = {}
    unknown: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Name):
            continue
        use = _use_of(node, parents)
        if use is None:
            unknown.add(node.id)
        else:
            found[node.id] = found[node.id].merge(use) if node.id in found else use
    return {name: use for name, use in found.items() if name not in unknown}


def _use_of(node: ast.Name, parents: dict[int, ast.AST]) -> Use | None:
    if not isinstance(node.ctx, ast.Load):
        return None
    parent = parents.get(id(node))
    grand = parents.get(id(parent)) if parent is not None else None
    if isinstance(parent, ast.Attribute) and isinstance(grand, ast.Call) and grand.func is parent:
        if parent.attr in _APPENDS:
            return Use(appends=True)
        if parent.attr in _KEYED and grand.args and not isinstance(grand.args[0], ast.Starred):
            key = _constant_key(grand.args[0])
            return None if key is _NOT_CONSTANT else Use(keys=frozenset({key}))
        return None
    if isinstance(parent, ast.Subscript) and parent.value is node and not isinstance(
            parent.ctx, ast.Del):
        key = _constant_key(parent.slice)
        return None if key is _NOT_CONSTANT else Use(keys=frozenset({key}))
    if (isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name)
            and parent.func.id == "len" and parent.args == [node] and not parent.keywords):
        return Use(calls_len=True)
    return None


_NOT_CONSTANT = object()


def _constant_key(node: ast.AST) -> object:
    """The value of a constant key expression (``7``, ``-1``, ``'a'``, ``(1, 'b')``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, _KEY_TYPES):
        return node.value
    if (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub)
            and isinstance(node.operand, ast.Constant)
            and type(node.operand.value) in (int, float)):
        return -node.operand.value  # type: ignore[operator]
    if isinstance(node, ast.Tuple):
        items = tuple(_constant_key(item) for item in node.elts)
        return _NOT_CONSTANT if any(item is _NOT_CONSTANT for item in items) else items
    return _NOT_CONSTANT
