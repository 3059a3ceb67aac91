"""Git objects: their ids and the encoding of trees and commits.

A workspace's history is a git repository, written by Kernos itself (see
:mod:`kernos.store.object_store`, which writes the objects, and
:mod:`kernos.store.loose`, the loose layout it still reads).  This module is
the format: :func:`object_id` is git's id of an object, and trees and commits
are encoded and decoded byte for byte as git does, so ``git fsck`` and ``git
log`` read what Kernos writes.  It reads and writes no file.
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "BLOB_MODE",
    "TREE_MODE",
    "CommitData",
    "TreeEntry",
    "decode_commit",
    "decode_tree",
    "encode_commit",
    "encode_tree",
    "object_id",
]

BLOB_MODE = b"100644"
TREE_MODE = b"40000"

def object_id(kind: bytes, data: bytes | memoryview) -> bytes:
    """The binary git id of an object of ``kind`` holding ``data``."""
    digest = hashlib.sha1(b"%s %d\0" % (kind, len(data)))
    digest.update(data)
    return digest.digest()


@dataclass(frozen=True, slots=True)
class TreeEntry:
    mode: bytes
    name: str
    sha: bytes

    @property
    def is_tree(self) -> bool:
        return self.mode == TREE_MODE


def encode_tree(entries: Iterable[TreeEntry]) -> bytes:
    keyed = []
    for entry in entries:  # each name checked and encoded once (a namespace has thousands)
        name = entry.name
        if not name or "/" in name or "\0" in name:
            raise ValueError(f"{name!r} cannot be a git tree entry name")
        raw = name.encode()
        keyed.append((raw + b"/" if entry.mode == TREE_MODE else raw,
                      b"%s %s\0%s" % (entry.mode, raw, entry.sha)))
    keyed.sort(key=operator.itemgetter(0))  # git's order: a tree's name as if ending in /
    return b"".join(encoded for _, encoded in keyed)


def decode_tree(data: bytes) -> list[TreeEntry]:
    entries = []
    position = 0
    while position < len(data):
        space = data.index(b" ", position)
        nul = data.index(b"\0", space)
        sha = data[nul + 1 : nul + 21]
        if len(sha) != 20:
            raise ValueError("truncated tree object")
        entries.append(TreeEntry(data[position:space], data[space + 1 : nul].decode(), sha))
        position = nul + 21
    return entries


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitData:
    tree: bytes
    parents: tuple[bytes, ...]
    author: str
    timestamp: int
    message: str


def encode_commit(commit: CommitData) -> bytes:
    lines = [b"tree " + commit.tree.hex().encode()]
    lines += [b"parent " + parent.hex().encode() for parent in commit.parents]
    signature = f"{commit.author} {commit.timestamp} +0000".encode()
    lines += [b"author " + signature, b"committer " + signature]
    message = commit.message if commit.message.endswith("\n") else commit.message + "\n"
    return b"\n".join(lines) + b"\n\n" + message.encode()


def decode_commit(data: bytes) -> CommitData:
    header, _, message = data.partition(b"\n\n")
    tree = b""
    parents = []
    author = ""
    timestamp = 0
    for line in header.split(b"\n"):
        key, _, value = line.partition(b" ")
        if key == b"tree":
            tree = bytes.fromhex(value.decode())
        elif key == b"parent":
            parents.append(bytes.fromhex(value.decode()))
        elif key == b"author":
            who, _, rest = value.decode().rpartition(">")
            author = who + ">"
            timestamp = int(rest.split()[0])
    return CommitData(tree=tree, parents=tuple(parents), author=author.strip(),
                      timestamp=timestamp, message=message.decode())
