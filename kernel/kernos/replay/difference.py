"""Where two values differ: the first place their canonical digests part.

:func:`describe_difference` and :func:`describe_state_difference` answer
"why are these digests not equal?" with a short path, such as
``value['bob'].balance: 5 != 7``.  They walk the two values side by side as
:mod:`kernos.replay.digest` walks one (same nodes, same labels for objects
seen before, sets in the same order), so the first difference found is one
the digest sees; two values whose digests are equal have no difference.
Messages show atoms' reprs, cut short, and only the type name of anything
else.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping

from kernos.replay._encoding import node_of
from kernos.replay._stream import END, Namespace, encode_atom, show
from kernos.replay.digest import SharedDigests, digest, state_digest
from kernos.serialize.kinds import qualified

__all__ = ["describe_difference", "describe_state_difference"]

#: How long a difference message can get.
_MESSAGE = 300


def describe_difference(first: object, second: object, *, root: str = "value") -> str | None:
    """A short path to the first place where two values' digests part, or None if equal.

    For example ``value['bob'].balance: 5 != 7``.  Messages show atoms' reprs,
    cut short, and only the type name of anything else.
    """
    if digest(first) == digest(second):
        return None
    found = _Differ().run(root, first, second)
    return _bounded(found or f"{root}: differs")


def describe_state_difference(first: Mapping[str, object],
                              second: Mapping[str, object]) -> str | None:
    """Like :func:`describe_difference` for two namespaces; paths start at the name."""
    if state_digest(first)[0] == state_digest(second)[0]:
        return None
    if set(first) != set(second):
        only_first = sorted(set(first) - set(second))
        only_second = sorted(set(second) - set(first))
        return _bounded(f"names differ: only in the first {only_first}, "
                        f"only in the second {only_second}")
    found = _Differ().run("", Namespace(first), Namespace(second))
    return _bounded(found or "the namespaces differ")


def _bounded(message: str) -> str:
    return message if len(message) <= _MESSAGE else message[: _MESSAGE - 3] + "..."


class _Differ:
    """Walks two values side by side, as the digest's walk would, to the first difference."""

    def __init__(self) -> None:
        self.shared = SharedDigests()
        self.memos: tuple[dict[int, tuple[int, str, object]], ...] = ({}, {})

    def run(self, root: str, first: object, second: object) -> str | None:
        stack: list[Iterator[tuple[str, object, object]]] = [iter([(root, first, second)])]
        while stack:
            for path, left, right in stack[-1]:
                found, pushed = self.visit(path, left, right, stack)
                if found is not None:
                    return found
                if pushed:
                    break
            else:
                stack.pop()
        return None

    def visit(self, path: str, left: object, right: object,
              stack: list[Iterator[tuple[str, object, object]]]) -> tuple[str | None, bool]:
        """The message if ``left`` and ``right`` differ here; whether it pushed their children."""
        message = self.compare(path, left, right)
        if message is not None or self.children is None:
            return message, False
        stack.append(self.children)
        return None, True

    def compare(self, path: str, left: object, right: object) -> str | None:
        self.children: Iterator[tuple[str, object, object]] | None = None
        atoms = encode_atom(left), encode_atom(right)
        if atoms[0] is not None or atoms[1] is not None:
            return None if atoms[0] == atoms[1] else f"{path}: {show(left)} != {show(right)}"
        seen = self.memos[0].get(id(left)), self.memos[1].get(id(right))
        if seen[0] is not None or seen[1] is not None:
            if seen[0] is not None and seen[1] is not None:
                if seen[0][0] == seen[1][0]:
                    return None
                return (f"{path}: is the object at {seen[0][1]} in the first, "
                        f"the object at {seen[1][1]} in the second")
            which, other = ("first", "second") if seen[0] is not None else ("second", "first")
            earlier = (seen[0] or seen[1] or (0, "", None))[1]
            return (f"{path}: is the same object as {earlier} in the {which}, "
                    f"a separate object in the {other}")
        nodes = node_of(left), node_of(right)
        if qualified(type(left)) != qualified(type(right)):
            return f"{path}: {qualified(type(left))} != {qualified(type(right))}"
        if nodes[0].tag != nodes[1].tag or len(nodes[0].fields) != len(nodes[1].fields):
            return f"{path}: {qualified(type(left))} objects differ in kind"
        for (name, one), (_, two) in zip(nodes[0].fields, nodes[1].fields, strict=True):
            if one != two:
                return f"{path}: {qualified(type(left))} {name} differs"
        for side, obj, node in ((0, left, nodes[0]), (1, right, nodes[1])):
            if node.memo:
                self.memos[side][id(obj)] = (len(self.memos[side]), path, obj)
        children = [list(node.children) for node in nodes]
        if nodes[0].unordered:
            keyed = [sorted(((self.shared.key(element), element) for element in elements),
                            key=lambda pair: pair[0]) for elements in children]
            keys = [[key for key, _ in pairs] for pairs in keyed]
            if keys[0] != keys[1]:
                only = [[element for key, element in keyed[side] if key not in keys[1 - side]]
                        for side in (0, 1)]
                shown = [", ".join(show(element) for element in elements[:3]) or "nothing"
                         for elements in only]
                return (f"{path}: set elements differ: only in the first {shown[0]}; "
                        f"only in the second {shown[1]}")
            children = [[element for _, element in pairs] for pairs in keyed]
            labels: Iterator[str] = (f"<element {index}>" for index in itertools.count())
        else:
            made = nodes[0].labels() if nodes[0].labels is not None else iter(())
            labels = itertools.chain(made, (f"<{index}>" for index in itertools.count()))
        self.children = self.pairs(path, children[0], children[1], labels)
        return None

    @staticmethod
    def pairs(path: str, first: list[object], second: list[object],
              labels: Iterator[str]) -> Iterator[tuple[str, object, object]]:
        for index, label in enumerate(labels):
            left = first[index] if index < len(first) else END
            right = second[index] if index < len(second) else END
            if left is END and right is END:
                return
            yield path + label, left, right
