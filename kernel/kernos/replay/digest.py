"""Canonical digests of namespace values: equal states digest equally in any process.

Replay re-runs recorded ops in a fresh process and checks each state against
the original.  Pickle bytes cannot be compared: a cell's functions carry a file
name with the kernel's PID, sets of strings iterate in hash-seed order, and a
restore changes which equal strings are one object.  A digest is a sha256 over
a canonical stream that the walk here writes; the stream is prefix-free (every
token starts with a tag and is length-prefixed, every container ends with
``)``), so equal streams mean equal walks.

What the stream holds, and what it leaves out on purpose:

* **Atoms** by value: ints (two's complement bytes), floats by their IEEE bits
  (so ``-0.0`` differs from ``0.0``; every NaN is one NaN), complex, str
  (UTF-8), bytes, bool, None, Ellipsis.  Exact types only: ``numpy.float64``
  and ``IntEnum`` members are not floats and ints here.
* **Order is state**: lists, tuples and dicts (insertion order, which code can
  observe) keep theirs, and so do instance ``__dict__`` items.  Sets and
  frozensets are sorted by the digests of their elements.  Class dicts are
  sorted by name, since a class body's order is source layout, not state.
* **Identity is state.**  Mutable objects (lists, dicts, sets, bytearrays,
  instances, functions, cells, classes defined by value, arrays) are labelled
  in walk order: the first visit writes the object, a later one ``@n``.  So
  ``b['ref'] is a`` digests differently from an equal copy, and cycles end.
  Immutable values (str, bytes, numbers, tuples, frozensets, code, dates,
  decimals, enum members, numpy scalars) carry no label: a restore does not
  keep which equal strings were one object.  Their digests are cached per
  object when their walk met no labelled object, so a DAG of shared tuples
  costs one walk per tuple, and a large string or bytes is hashed once.
* **Functions** imported from a module by qualified name are written by name;
  any other (cells, ``__main__``, ``<locals>``) by value: module, qualname,
  name, doc, the code object, defaults, keyword defaults, closure cells (walked;
  a cell is labelled, so closures sharing a cell are seen to share it),
  ``__dict__`` and annotations.  Code keeps bytecode (``co_code``, which Python
  3.11 returns without its specialisations), the exception table, constants
  (walked), names, variable names, free and cell variables, argument counts,
  stack size and flags, and leaves out ``co_filename``, ``co_firstlineno`` and
  the line table: where a function was defined is not state.  Globals are not
  walked (they are the namespace); the names a function uses are in
  ``co_names``.
* **Classes** implemented in C or importable by qualified name (outside
  ``__main__``) by name; any other by value: module, qualname, name,
  metaclass, bases, and its own ``__dict__`` sorted by name, without
  ``__dict__``, ``__weakref__``, ``__module__`` (written already), and caches
  that Python or pickling add behind the code's back: ``__slotnames__``,
  ``_abc_impl``, an empty ``__annotations__``, ``__firstlineno__``.
* **Other objects**: their type, then the parts of ``__reduce_ex__(4)``
  (reconstructor, arguments, state, list items, dict items), state dicts
  flattened into ``.attribute`` items (``iter(seq)`` without an index counts
  as index 0: an exhausted iterator reduces without one, and the iterator its
  reduce rebuilds with one).  A reducer that raises falls back to
  ``__dict__`` and ``__slots__``; an object with none of these is written as
  its type name only: ``repr()`` is never called, for digests or messages.
* **Library globals**: an object an imported module holds as a global (numpy's
  global generator, ``rcParams``, a function a library installed over another
  module's global) is written as ``module.name``, as the serializer stores it
  (``kinds.ModuleGlobals``): its state is the library's, not the namespace's,
  and digests of library internals need not agree across processes.
* **Live resources** Kernos does not persist (files, sockets, threads, locks,
  generators, frames, ... see ``kinds.transient_types``) are their type and a
  marker; the resource is never touched.
* **numpy** (only when already imported): dtype (``dtype.str``, or the
  ``descr`` of a structured dtype), shape and the C-order bytes, streamed into
  sha256 in place or in bounded chunks; object arrays walk their elements.
  Views are digested by content: that two arrays share memory is not seen.
* **pandas** (only when already imported): a DataFrame is its type, columns,
  index, each column's dtype name and ``to_numpy()`` values, ``attrs`` and
  ``allows_duplicate_labels``; a Series and an Index likewise.  Not its
  reduce, whose block layout depends on how the frame was built: two equal
  frames, one of them consolidated, would differ.

Known limits: elements of a set with equal digests, also equal in the context
of what the walk has labelled so far, are in an arbitrary order, so an object
labelled inside them and referred to after the set may get either label;
nested frozensets recurse in Python, one level per nesting level.

Where it lives: this module holds the walk (labels, per-object caches, the
order of set elements) and :func:`digest` and :func:`state_digest`;
``kernos.replay._encoding`` says which node each object is written as,
following the rules above; ``kernos.replay._stream`` holds the tokens both
write (atoms, nodes, markers).  Where two values differ is
:mod:`kernos.replay.difference`.
"""
from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Iterator, Mapping

from kernos.replay._encoding import node_of
from kernos.replay._stream import ATOMS, Namespace, encode_atom, int_bytes, length_prefixed
from kernos.serialize.kinds import MODULE_GLOBALS

__all__ = ["digest", "state_digest"]

#: Written first: a change of the stream's format changes every digest.
FORMAT = b"kernos-digest/1\n"


class _Frame:
    __slots__ = ("children", "obj", "sub", "touches")

    def __init__(self, children: Iterator[object], obj: object, sub: bool, touches: int) -> None:
        self.children = children
        self.obj = obj
        self.sub = sub
        self.touches = touches


class SharedDigests:
    """What the walks of one call share: per-object digests valid in any context."""

    def __init__(self) -> None:
        # Objects are kept alive next to their digests, so that no id is reused meanwhile.
        self.cache: dict[int, tuple[object, bytes]] = {}
        self.keys: dict[int, tuple[object, bytes]] = {}

    def key(self, obj: object) -> tuple[int, bytes]:
        """The sort key of a set element: its digest on its own."""
        atom = encode_atom(obj)
        if atom is not None:
            return 0, atom
        known = self.keys.get(id(obj))
        if known is None:
            known = self.keys[id(obj)] = (obj, _Walker(self).run(obj))
        return 1, known[1]


class _Walker:
    """One walk with its own labels; ``parent`` lends its labels to a set's tie-break."""

    def __init__(self, shared: SharedDigests, parent: _Walker | None = None) -> None:
        self.shared = shared
        self.parent = parent
        self.memo: dict[int, tuple[int, object]] = {}
        self.touches = 0
        self.hashers = [hashlib.sha256(FORMAT)]

    def run(self, root: object) -> bytes:
        MODULE_GLOBALS.refresh("__main__")
        # An explicit stack: a 100,000-deep list must not exhaust the C stack.
        stack: list[_Frame] = []
        self.visit(root, stack)
        while stack:
            frame = stack[-1]
            for child in frame.children:
                if self.visit(child, stack):
                    break
            else:
                stack.pop()
                self.close(frame)
        return self.hashers[0].digest()

    def visit(self, obj: object, stack: list[_Frame]) -> bool:
        """Write ``obj``; True if it pushed a frame for its children."""
        encode = ATOMS.get(type(obj))
        if encode is not None:
            atom = encode(obj)
            if atom is not None:
                self.hashers[-1].update(atom)
                return False
        key = id(obj)
        seen = self.memo.get(key)
        if seen is not None:
            self.touches += 1
            self.hashers[-1].update(b"@" + length_prefixed(int_bytes(seen[0])))
            return False
        depth, lender = 1, self.parent
        while lender is not None:
            lent = lender.memo.get(key)
            if lent is not None:
                self.touches += 1
                self.hashers[-1].update(b"^" + length_prefixed(int_bytes(depth))
                                        + length_prefixed(int_bytes(lent[0])))
                return False
            depth, lender = depth + 1, lender.parent
        cached = self.shared.cache.get(key)
        if cached is not None:
            self.hashers[-1].update(b"H" + cached[1])
            return False
        node = node_of(obj)
        if node.memo:
            self.memo[key] = (len(self.memo), obj)
            self.touches += 1
        if node.sub:
            self.hashers.append(hashlib.sha256())
        self.hashers[-1].update(node.tag + int_bytes(len(node.fields))
                                + b"".join(length_prefixed(value) for _, value in node.fields))
        children = self.ordered(node.children) if node.unordered else node.children
        stack.append(_Frame(iter(children), obj, node.sub, self.touches))
        return True

    def close(self, frame: _Frame) -> None:
        self.hashers[-1].update(b")")
        if frame.sub:
            sub_digest = self.hashers.pop().digest()
            self.hashers[-1].update(b"H" + sub_digest)
            if frame.touches == self.touches:
                self.shared.cache[id(frame.obj)] = (frame.obj, sub_digest)

    def ordered(self, elements: Iterable[object]) -> list[object]:
        """A set's elements sorted by digest; equal digests by their digest in context."""
        keyed = sorted(((self.shared.key(element), element) for element in elements),
                       key=lambda pair: pair[0])
        result: list[object] = []
        for key, group in itertools.groupby(keyed, key=lambda pair: pair[0]):
            members = [element for _, element in group]
            if len(members) > 1 and key[0] == 1:
                members.sort(key=lambda element: _Walker(self.shared, parent=self).run(element))
            result.extend(members)
        return result


def digest(value: object) -> str:
    """The hex sha256 of ``value``'s canonical stream (see the module docstring)."""
    return _Walker(SharedDigests()).run(value).hex()


def state_digest(names: Mapping[str, object]) -> tuple[str, dict[str, str]]:
    """The digest of a whole namespace and of each name, in sorted order of names.

    The whole is one walk over the sorted names, so that two names holding one
    object differ from two names holding equal copies; each name's digest is a
    walk of its own, to tell which names diverged.
    """
    shared = SharedDigests()
    each = {name: _Walker(shared).run(names[name]).hex() for name in sorted(names)}
    return _Walker(shared).run(Namespace(names)).hex(), each

