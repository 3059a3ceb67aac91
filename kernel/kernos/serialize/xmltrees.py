"""lxml trees kept whole: an element comes back inside its document, as its own class.

lxml pickles an element as ``fromstring(tostring(element))``: a copy of that
element alone.  After a restore it had no parent, no siblings and no document
(``getparent()`` is None), two names inside one tree came back as two
unrelated trees, and an objectify element could change class: an empty leaf
(a ``StringElement`` inside its document) re-parsed on its own is an
``ObjectifiedElement``.  An ``_ElementTree`` (what ``parse`` returns) did not
pickle at all.

Here (registered by exact type in ``kinds.SPECIAL`` once ``lxml.etree`` is
imported, so no other object pays anything) every node of a document is
written as a reference to that document plus the path of child indices from
its root.  The document is serialized once per dump (the serializer's memory
tokens memoize it by its root), and re-parsed at load with a parser of the
same family (objectify's, for objectify elements; lxml's XML parser
otherwise) that keeps whitespace, resolves no entities and reads no network.
So names that shared a tree share one again, and each node is found where it
was, with the class the same parse gives it.

Not covered (lxml's own pickling, a copy of the element, as before): HTML
documents (``lxml.html``: their serialization is not an XML round trip),
nodes outside the root element (a comment before it), and element classes
set up by custom lookups.  What is kept is the document as it serializes:
a custom parser's settings and ``docinfo`` other than what the XML
declaration carries are not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kernos.serialize import rebuild

__all__ = ["lxml_reducers"]

Reducer = Callable[[Any, Any], Any]


def _path(node: Any) -> tuple[int, ...] | None:
    """Child indices from the document's root element to ``node``; None if it is not under it."""
    steps: list[int] = []
    current = node
    parent = current.getparent()
    while parent is not None:
        steps.append(parent.index(current))
        current, parent = parent, parent.getparent()
    root = node.getroottree().getroot()
    if current is not root:
        return None
    steps.reverse()
    return tuple(steps)


def _document(pickler: Any, root: Any, family: str, etree: Any) -> object:
    """The memoized reference to ``root``'s whole document."""
    return pickler.memory_token(
        root, lambda: (rebuild.lxml_document,
                       (family, etree.tostring(root.getroottree(), encoding="UTF-8"))))


def lxml_reducers(etree: Any, objectify: Any | None) -> dict[type, Reducer]:
    """Reducers for lxml's own node classes and for its element tree."""
    objectified = () if objectify is None else (objectify.ObjectifiedElement,)

    def family(node: Any) -> str:
        return "objectify" if isinstance(node, objectified) else "etree"

    def reduce_node(pickler: Any, node: Any) -> Any:
        path = _path(node)
        if path is None:
            return NotImplemented
        root = node.getroottree().getroot()
        return (rebuild.lxml_node, (_document(pickler, root, family(root), etree), path))

    def reduce_tree(pickler: Any, tree: Any) -> Any:
        root = tree.getroot()
        if root is None:
            return NotImplemented  # an empty tree: nothing to hold, and lxml refuses it anyway
        return (rebuild.lxml_tree, (_document(pickler, root, family(root), etree),))

    reducers: dict[type, Reducer] = {
        etree._Element: reduce_node,
        etree._Comment: reduce_node,
        etree._ProcessingInstruction: reduce_node,
        etree._Entity: reduce_node,
        etree._ElementTree: reduce_tree,
    }
    if objectify is not None:
        for name in ("ObjectifiedElement", "ObjectifiedDataElement", "NumberElement",
                     "IntElement", "FloatElement", "StringElement", "NoneElement",
                     "BoolElement"):
            reducers[getattr(objectify, name)] = reduce_node
    return reducers
