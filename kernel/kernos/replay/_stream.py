"""The vocabulary of the digest's canonical stream (:mod:`kernos.replay.digest`).

What every part of the stream is made of: atoms (values written whole, with
no children and no identity: :data:`ATOMS`, :func:`encode_atom`), the
:class:`Node` an object with children writes, the markers that break a node's
children into sections, the length-prefixed encodings every token uses, and
the labels that name a child in a difference message
(:mod:`kernos.replay.difference`).  Which node each object is written as is
:mod:`kernos.replay._encoding`'s business; walking them is the digest's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from kernos.serialize.kinds import qualified

#: Strings and bytes from this size on are hashed apart and cached per object.
BIG = 64 * 1024
#: How much of a value a difference message shows.
SHOW = 60


class Marker:
    """A token with no value: a section break inside a node's children, an absent slot."""

    def __init__(self, token: bytes, text: str) -> None:
        self.token = token
        self.text = text


SEP = Marker(b"|", "(no more items)")
ABSENT = Marker(b"a", "(unset)")
END = Marker(b"", "(nothing)")


def int_bytes(value: int) -> bytes:
    return value.to_bytes(value.bit_length() // 8 + 1, "little", signed=True)


def length_prefixed(data: bytes) -> bytes:
    return len(data).to_bytes(8, "little") + data


def utf8(value: str) -> bytes:
    return value.encode("utf-8", "surrogatepass")


def _float(value: float) -> bytes:
    return b"\x7f\xf8\0\0\0\0\0\0" if value != value else struct.pack("<d", value)


def _small(kind: bytes, encode: Callable[[Any], bytes]) -> Callable[[Any], bytes | None]:
    return lambda value: kind + length_prefixed(encode(value)) if len(value) < BIG else None


ATOMS: dict[type, Callable[[Any], bytes | None]] = {
    type(None): lambda value: b"N",
    bool: lambda value: b"T" if value else b"F",
    int: lambda value: b"i" + length_prefixed(int_bytes(value)),
    float: lambda value: b"f" + _float(value),
    complex: lambda value: b"c" + _float(value.real) + _float(value.imag),
    str: _small(b"s", utf8),
    bytes: _small(b"b", bytes),
    type(Ellipsis): lambda value: b"E",
    type(NotImplemented): lambda value: b"n",
    Marker: lambda value: value.token,
}


def encode_atom(value: object) -> bytes | None:
    """The whole encoding of ``value`` if it is an atom (no children, no identity)."""
    encode = ATOMS.get(type(value))
    return encode(value) if encode is not None else None


@dataclasses.dataclass(slots=True, kw_only=True)
class Node:
    """What one object writes: a tag, fixed fields, then its children and ``)``."""

    tag: bytes
    """One byte per kind of node; it fixes what the fields and children mean."""
    fields: tuple[tuple[str, bytes], ...] = ()
    """Named byte strings; the names are for difference messages only."""
    children: Iterable[object] = ()
    """Walked in order (sorted by digest first if ``unordered``)."""
    labels: Callable[[], Iterator[str]] | None = None
    """Path suffixes of the children, for difference messages; made only when asked."""
    memo: bool = True
    """Whether the object's identity is state (it gets a label)."""
    sub: bool = False
    """Hashed apart and cached per object when its walk met no labelled object."""
    unordered: bool = False


class Namespace:
    """A namespace's names in sorted order, walked as one value so names can share objects."""

    def __init__(self, names: Mapping[str, object]) -> None:
        self.items = [(name, names[name]) for name in sorted(names)]


def index_labels() -> Iterator[str]:
    return (f"[{index}]" for index in itertools.count())


def fixed_labels(*labels: str) -> Callable[[], Iterator[str]]:
    return lambda: iter(labels)


def show(value: object) -> str:
    """A short text for a message: the repr of an atom, else only the type's name."""
    if isinstance(value, Marker):
        return value.text
    if type(value) in ATOMS:
        text = repr(value)
        return text if len(text) <= SHOW else text[: SHOW - 3] + "..."
    return f"<{qualified(type(value))}>"


def flat_pairs(items: Iterable[tuple[object, object]]) -> Iterator[object]:
    for key, value in items:
        yield key
        yield value


def key_labels(keys: Iterable[object], attribute: bool = False) -> Iterator[str]:
    for key in keys:
        shown = key if attribute and type(key) is str else None
        yield f"<key {show(key)}>"
        yield f".{shown}" if shown is not None else f"[{show(key)}]"


def dict_node(mapping: Mapping[Any, Any], tag: bytes = b"D", memo: bool = True) -> Node:
    return Node(tag=tag, children=flat_pairs(mapping.items()), memo=memo,
                 labels=lambda: key_labels(list(mapping)))


def blob_digest(data: Any) -> bytes:
    hasher = hashlib.sha256()
    view = memoryview(data)
    if view.contiguous:
        hasher.update(view.cast("B"))
    else:
        hasher.update(view.tobytes())
    return hasher.digest()


def big_text_digest(value: str) -> bytes:
    hasher = hashlib.sha256()
    for start in range(0, len(value), BIG):
        hasher.update(utf8(value[start:start + BIG]))
    return hasher.digest()

