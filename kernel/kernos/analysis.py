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

A reach also says which names the code only *reads* (``reads``): every
occurrence a chain of attribute reads, subscripts and a few methods, ending
in a sink that keeps no reference (``arr[5] == 1.0``, ``print(d['k']['v'])``,
``len(d)``, ``f"{df.shape}"``), or a name bound to a fresh result
(``head = arr[:10].copy()``).  For the value types ``kernos.readonly``
knows, such a name is neither re-pickled nor re-hashed.
"""

from __future__ import annotations

import ast
import types
from collections.abc import Mapping
from dataclasses import dataclass, field

from kernos.serialize.kinds import code_names

__all__ = ["DYNAMIC_NAMES", "FRESH_METHODS", "NONCONSTANT", "READ_ATTRS", "READ_METHODS",
           "SINK_CALLS", "Reach", "Read", "Use", "reach_of_code", "reach_of_names",
           "reach_of_source", "reads_of_tree", "uses_of_tree"]

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


NONCONSTANT = "<not a constant>"
"""The key of a ``Read`` step whose subscript is not a constant."""


@dataclass(frozen=True)
class Read:
    """One place where the op's code only reads a name: a chain of steps, then a sink.

    ``steps``: ``("attr", name)`` (an attribute of :data:`READ_ATTRS`),
    ``("item", key)`` (a subscript, ``key`` its constant or :data:`NONCONSTANT`),
    ``("call", method)`` (a method of :data:`READ_METHODS` called with constant
    arguments only).  ``sink``: what consumes the result, which keeps no
    reference to it: ``compare`` or ``arith`` (with constants only), ``format``
    (an f-string), ``test`` (``if``, ``while``, ``assert``), ``discard`` (an
    expression statement), ``call:F`` (the builtin ``F`` of :data:`SINK_CALLS`)
    or ``assign`` (``x = arr[:10].copy()``: the chain ends in a method of
    :data:`FRESH_METHODS`, whose result, on the types that accept it, holds
    nothing of the value).  Whether the chain indeed changes nothing depends on
    the value's type, which only the image knows (``kernos.readonly``).
    """

    steps: tuple[tuple[str, object], ...]
    sink: str


@dataclass(frozen=True)
class Reach:
    """The global names an op may touch, or everything."""

    names: frozenset[str] = frozenset()
    everything: bool = False
    why: str = ""
    uses: Mapping[str, Use] = field(default_factory=dict, compare=False)
    """Names of ``names`` that the code uses only in the ways a :class:`Use` lists."""
    reads: Mapping[str, frozenset[Read]] = field(default_factory=dict, compare=False)
    """Names of ``names`` that the code only reads, each through these chains."""

    @classmethod
    def all(cls, why: str) -> Reach:
        return cls(everything=True, why=why)

    def union(self, other: Reach) -> Reach:
        if self.everything:
            return self
        if other.everything:
            return other
        return Reach(self.names | other.names, uses=_merge_uses(self, other),
                     reads=_merge_reads(self, other))

    def without_uses(self, names: frozenset[str] | set[str]) -> Reach:
        """This reach, with ``names`` used in unknown ways."""
        if self.everything or not names & (self.uses.keys() | self.reads.keys()):
            return self
        return Reach(self.names, uses={name: use for name, use in self.uses.items()
                                       if name not in names},
                     reads={name: reads for name, reads in self.reads.items()
                            if name not in names})


def _merge_reads(one: Reach, other: Reach) -> dict[str, frozenset[Read]]:
    """A name keeps its reads only if each side that reaches it only reads it."""
    merged: dict[str, frozenset[Read]] = {}
    for name in one.names | other.names:
        reads = [side.reads.get(name) for side in (one, other) if name in side.names]
        if all(found is not None for found in reads):
            merged[name] = frozenset().union(*(found for found in reads if found is not None))
    return merged


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
    parents = parents_of(tree)
    uses = uses_of_tree(tree, parents)
    reads = reads_of_tree(tree, parents)
    return Reach(reach.names, uses={name: use for name, use in uses.items()
                                    if name in reach.names},
                 reads={name: chains for name, chains in reads.items() if name in reach.names})


_APPENDS = frozenset({"append", "extend"})
_KEYED = frozenset({"get", "setdefault"})
_KEY_TYPES = (int, str, bytes, float, type(None))


def parents_of(tree: ast.AST) -> dict[int, ast.AST]:
    """Every node's parent, by the child's id (one walk, shared by the analyses below)."""
    parents: dict[int, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    return parents


def uses_of_tree(tree: ast.AST, parents: dict[int, ast.AST] | None = None) -> dict[str, Use]:
    """The names that ``tree`` uses only in the ways a :class:`Use` lists, with those uses.

    Every ``Name`` node counts, in any scope (a local that happens to share
    the name only makes the answer more cautious).  ``parents``: the tree's
    :func:`parents_of`, if the caller has it.
    """
    parents = parents_of(tree) if parents is None else parents
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


#: Attributes whose reading changes nothing on the types ``kernos.readonly`` accepts.
READ_ATTRS = frozenset({
    "shape", "dtype", "dtypes", "ndim", "size", "nbytes", "itemsize", "T", "real", "imag",
    "columns", "index", "values", "empty", "iloc", "loc", "iat", "at", "name",
})
#: Methods that return a new value (or a view) and change nothing, called with constants only.
READ_METHODS = frozenset({
    "sum", "mean", "min", "max", "std", "var", "prod", "any", "all", "argmax", "argmin",
    "median", "count", "nunique", "unique", "head", "tail", "describe", "copy", "tolist",
    "to_list", "to_numpy", "item", "isna", "notna", "abs", "equals", "value_counts", "cumsum",
    "get", "keys", "values", "items",
})
#: Of those, the ones whose result shares no object or memory with a numeric array or
#: frame (never a view, as ``head`` or ``to_numpy`` may give): a name may be bound to it.
#: ``copy`` counts only without arguments (``df.copy(False)`` shares the data).
FRESH_METHODS = frozenset({
    "sum", "mean", "min", "max", "std", "var", "prod", "any", "all", "argmax", "argmin",
    "median", "count", "nunique", "unique", "describe", "copy", "tolist", "to_list", "item",
    "isna", "notna", "abs", "equals", "value_counts", "cumsum",
})
#: Keywords those methods may be given (never ``out`` or ``inplace``).
_READ_KEYWORDS = frozenset({"axis", "dtype", "ddof", "skipna", "numeric_only", "keepdims",
                            "decimals", "ascending", "n", "normalize", "dropna"})
#: Builtins that read their one argument and keep no reference to it.
SINK_CALLS = frozenset({"print", "len", "bool", "int", "float", "str", "repr", "abs", "round",
                        "min", "max", "sum", "type"})


def reads_of_tree(tree: ast.AST, parents: dict[int, ast.AST] | None = None
                  ) -> dict[str, frozenset[Read]]:
    """The names that ``tree`` only reads (every occurrence a :class:`Read`), with the reads."""
    parents = parents_of(tree) if parents is None else parents
    found: dict[str, set[Read]] = {}
    unknown: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id not in unknown:
            read = _read_of(node, parents)
            if read is None:
                unknown.add(node.id)
            else:
                found.setdefault(node.id, set()).add(read)
    return {name: frozenset(reads) for name, reads in found.items() if name not in unknown}


def _read_of(node: ast.Name, parents: dict[int, ast.AST]) -> Read | None:
    if not isinstance(node.ctx, ast.Load):
        return None
    steps: list[tuple[str, object]] = []
    top: ast.AST = node
    while True:
        parent = parents.get(id(top))
        if (isinstance(parent, ast.Attribute) and parent.value is top
                and isinstance(parent.ctx, ast.Load)):
            grand = parents.get(id(parent))
            if isinstance(grand, ast.Call) and grand.func is parent:
                if parent.attr not in READ_METHODS or not _constant_arguments(grand):
                    return None
                steps.append(("call", parent.attr))
                top = grand
            elif parent.attr in READ_ATTRS:
                steps.append(("attr", parent.attr))
                top = parent
            else:
                return None
        elif (isinstance(parent, ast.Subscript) and parent.value is top
              and isinstance(parent.ctx, ast.Load)):
            key = _constant_key(parent.slice)
            steps.append(("item", NONCONSTANT if key is _NOT_CONSTANT else key))
            top = parent
        else:
            break
    sink = _sink(top, parents)
    if sink == "assign" and not (
            isinstance(top, ast.Call) and steps and steps[-1][0] == "call"
            and steps[-1][1] in FRESH_METHODS
            and (steps[-1][1] != "copy" or not (top.args or top.keywords))):
        return None  # the name bound would hold (a view of) the value itself
    return None if sink is None else Read(tuple(steps), sink)


def _sink(node: ast.AST, parents: dict[int, ast.AST]) -> str | None:
    """What consumes ``node``'s value, if it is a sink that keeps no reference to it."""
    parent = parents.get(id(node))
    # ``a and b``, ``a if c else b``: the value passes through to what consumes them.
    while isinstance(parent, ast.BoolOp) or (isinstance(parent, ast.IfExp)
                                             and parent.test is not node):
        node, parent = parent, parents.get(id(parent))
    if isinstance(parent, ast.Compare):
        others = [parent.left, *parent.comparators]
        return "compare" if all(_inert(other) for other in others if other is not node) else None
    if isinstance(parent, ast.BinOp):
        other = parent.right if parent.left is node else parent.left
        return "arith" if _inert(other) else None
    if isinstance(parent, ast.UnaryOp):
        return "arith"
    if isinstance(parent, ast.FormattedValue) and parent.value is node:
        return "format"
    if isinstance(parent, ast.Expr):
        return "discard"
    if (isinstance(parent, ast.Assign) and parent.value is node
            and all(isinstance(target, ast.Name) for target in parent.targets)):
        return "assign"
    if isinstance(parent, ast.If | ast.While | ast.Assert | ast.IfExp) and parent.test is node:
        return "test"
    if (isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name)
            and parent.func.id in SINK_CALLS and any(arg is node for arg in parent.args)):
        if parent.func.id != "print" and (len(parent.args) != 1 or parent.keywords):
            return None  # min(x, y), max(x, key=f): other code would see the value
        return "call:" + parent.func.id
    return None


def _inert(node: ast.AST) -> bool:
    """A constant operand: nothing it runs can be handed the other operand."""
    return _constant_key(node) is not _NOT_CONSTANT


def _constant_arguments(call: ast.Call) -> bool:
    return (all(_inert(arg) for arg in call.args)
            and all(keyword.arg in _READ_KEYWORDS and _inert(keyword.value)
                    for keyword in call.keywords))
