"""Name the path from a variable to an object inside it: ``data['conn']._sock``.

Used only on the slow path, when something cannot be persisted and the user
must be told where it is.  The search is breadth-first, so the path is the
shortest one, and bounded, so a huge value cannot stall a commit.
"""

from __future__ import annotations

import gc
import types
from collections import deque
from collections.abc import Iterator

_MAX_VISITS = 200_000


def find_path(root: object, target: object, root_label: str) -> str | None:
    """The shortest readable path from ``root`` to ``target``, or None if not found."""
    if root is target:
        return root_label
    seen = {id(root)}
    queue: deque[tuple[object, str]] = deque([(root, root_label)])
    visits = 0
    while queue and visits < _MAX_VISITS:
        obj, label = queue.popleft()
        visits += 1
        for child, step in _children(obj):
            if child is target:
                return label + step
            if id(child) in seen or _is_leaf(child):
                continue
            seen.add(id(child))
            queue.append((child, label + step))
    return None


def _is_leaf(obj: object) -> bool:
    return type(obj) in (str, bytes, int, float, complex, bool, type(None)) or isinstance(
        obj, types.ModuleType
    )


def _short(key: object) -> str:
    try:
        text = repr(key)
    except Exception:  # a key with a broken __repr__ must not lose the whole value
        text = f"<{type(key).__name__}>"
    return text if len(text) <= 40 else text[:37] + "..."


def _children(obj: object) -> Iterator[tuple[object, str]]:
    if type(obj) is dict or isinstance(obj, dict):
        for key, value in list(obj.items()):
            yield value, f"[{_short(key)}]"
            yield key, f".<key {_short(key)}>"
        return
    if isinstance(obj, (list, tuple)):
        for index, value in enumerate(list(obj)):
            yield value, f"[{index}]"
        return
    if isinstance(obj, (set, frozenset)):
        for value in list(obj):
            yield value, ".<set element>"
        return
    if isinstance(obj, types.FunctionType):
        for index, cell in enumerate(obj.__closure__ or ()):
            try:
                yield cell.cell_contents, f".__closure__[{index}].cell_contents"
            except ValueError:
                continue
        for index, value in enumerate(obj.__defaults__ or ()):
            yield value, f".__defaults__[{index}]"
        yield obj.__dict__, ".__dict__"
        return
    if isinstance(obj, types.CellType):
        try:
            contents = obj.cell_contents
        except ValueError:
            return  # an empty cell
        yield contents, ".cell_contents"
        return
    attributes = getattr(obj, "__dict__", None)
    if isinstance(attributes, (dict, types.MappingProxyType)):
        for key, value in list(attributes.items()):
            yield value, f".{key}"
    found_slots = False
    for klass in type(obj).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            try:
                value = getattr(obj, slot)
            except AttributeError:
                continue
            found_slots = True
            yield value, f".{slot}"
    if attributes is None and not found_slots:
        for child in gc.get_referents(obj):
            yield child, ".<internal>"
