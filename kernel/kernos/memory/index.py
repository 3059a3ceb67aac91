"""The memory index: SQLite FTS5 beside the history, a cache of the chain and the image.

Schema (``<workspace>/memory/index.sqlite``, format :data:`FORMAT`)::

    meta(key, value)          format, built_index, built_hash: the chain head indexed
    entries(id, kind, principal, name, op, audit, at, status, title)
    subjects(entry, subject)  the data subjects whose payloads an entry holds
    vectors(entry, model, dims, vector)  embeddings (kernos.memory.vectors), when on
    text(body, owner, kind)   FTS5, rowid = entries.id; owner is the principal as one
                              token (``p`` + UTF-8 hex), so that the principal and
                              kind filters run inside the MATCH; ranked by
                              bm25 over ``body`` only (weights 1, 0, 0)

Contract:

* **A cache.** :meth:`MemoryIndex.open` rebuilds the file when it is missing,
  unreadable or of another format, or when the chain's record at
  ``built_index`` no longer has ``built_hash`` (the chain was replaced),
  or when ``memory/index.dirty`` says a write was cut short;
  otherwise it indexes the records after ``built_index`` (catch-up).  Writes
  keep their journal in memory (no fsync): a process killed mid-write leaves
  the ``index.dirty`` mark, and the next open rebuilds.  An OS crash can
  leave a damaged file the mark does not name: delete the file.
* **Filtered.** :meth:`MemoryIndex.recall` returns only what ``principal`` may
  read (see :mod:`kernos.memory`; one rule, :class:`Scope`), ranked by bm25
  (best first), or, given the query's vector (``meaning``), by bm25 and cosine
  fused (:mod:`kernos.memory.vectors`).
* **Safe queries.** The query is split into words (``\\w+``, at most
  :data:`MAX_TERMS`, each at most :data:`MAX_TERM_CHARS`), each quoted as an
  FTS5 string and OR-ed; no user character reaches FTS5 as syntax.
* **Current.** The runtime calls :meth:`MemoryIndex.catch_up` before a
  recall (cheap when the chain has not grown); it also notices that an
  erasure deleted the file (``kernos.audit.erase`` does) and rebuilds.
  After any rebuild (``rebuilt``) the working and semantic layers are empty
  until the runtime feeds them again (:func:`kernos.memory.sources.sync_from_image`).
* **Erasure.** Entries holding a subject's payloads are deleted with
  ``secure_delete`` on, the FTS segments merged (``optimize``) and the file
  vacuumed, so the subject's text is no longer in the file.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path

from kernos import _faults
from kernos.audit.log import AuditLog
from kernos.errors import UsageError
from kernos.memory.context import count_tokens, render
from kernos.memory.episodes import llm_store, op_entries, records_from
from kernos.memory.facts import Facts
from kernos.memory.records import HUMAN, Memory, Scope, WorkingItem
from kernos.memory.vectors import Meaning, fuse, nearest

__all__ = ["FORMAT", "FUSION_DEPTH", "INDEX_PATH", "KINDS", "MAX_TERMS", "MAX_TERM_CHARS",
           "Memory", "MemoryIndex", "Scope", "WorkingItem", "fts_query"]

FORMAT = "4"
"""Moved whenever what an entry holds changes, so that older caches are rebuilt (4: each
episodic entry belongs to the principal that made it, not to the op's)."""
INDEX_PATH = "memory/index.sqlite"
KINDS = frozenset({"working", "episodic", "semantic"})
MAX_TERMS = 32
MAX_TERM_CHARS = 64
MAX_BODY_CHARS = 16_384
"""Text indexed per entry at most (a big payload is cut, not skipped)."""
PREVIEW_CHARS = 200
FUSION_DEPTH = 50
"""Each ranking is cut at max(k, this) before fusion."""
DIRTY = "index.dirty"
"""Beside the index while a write runs (the journal is in memory, for speed)."""
VECTOR_CHANGES = 256
"""How many vector changes the index remembers for its cache (an older cache reloads all)."""
_WORD = re.compile(r"\w+", re.UNICODE)

_SCHEMA = """
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE entries(id INTEGER PRIMARY KEY, kind TEXT NOT NULL, principal TEXT NOT NULL,
    name TEXT, op INTEGER, audit INTEGER, at TEXT, status TEXT, title TEXT NOT NULL,
    vec INTEGER NOT NULL DEFAULT 0);
CREATE INDEX entries_owner ON entries(kind, principal);
CREATE INDEX entries_unembedded ON entries(principal, id) WHERE vec = 0;
CREATE INDEX entries_audit ON entries(audit);
CREATE TABLE subjects(entry INTEGER NOT NULL, subject TEXT NOT NULL);
CREATE INDEX subjects_subject ON subjects(subject);
CREATE INDEX subjects_entry ON subjects(entry);
CREATE VIRTUAL TABLE text USING fts5(body, owner, kind, tokenize='unicode61');
INSERT INTO text(text, rank) VALUES ('rank', 'bm25(1.0, 0.0, 0.0)');
CREATE TABLE vectors(entry INTEGER PRIMARY KEY, model TEXT NOT NULL, dims INTEGER NOT NULL,
    vector BLOB NOT NULL);
"""


def fts_query(query: str, *, join: str = " OR ") -> str | None:
    """The FTS5 expression for user text: quoted words joined by ``join`` (`` OR `` or
    `` AND ``); None if there is no word."""
    if join not in (" OR ", " AND "):
        raise ValueError(f"join must be ' OR ' or ' AND ', not {join!r}")
    if type(query) is not str:
        raise UsageError(f"recall() takes the query as a str, not {type(query).__name__}")
    words = []
    for word in _WORD.findall(query)[:MAX_TERMS]:
        word = word[:MAX_TERM_CHARS]
        words.append('"' + word.replace('"', '""') + '"')
    return join.join(dict.fromkeys(words)) if words else None


class MemoryIndex:
    """The memory index of one workspace (see the module docstring for the contract)."""

    def __init__(self, path: Path, connection: sqlite3.Connection) -> None:
        self.path = path
        self.db = connection
        self.rebuilt = False
        """Whether the last open or catch-up rebuilt the index from scratch."""
        self.generation = 0
        """Moves whenever the vectors table may have changed (the vector cache follows it)."""
        self.vector_changes: list[tuple[int, frozenset[int] | None]] = []
        """(generation, the entries whose vector it may have changed; None: any), newest
        last, at most :data:`VECTOR_CHANGES` of them: the cache reloads only those."""
        self.vector_cache: object = None
        """The vectors of the model last asked, in memory (kernos.memory.vectors)."""
        self._identity = _identity(path)

    # -- opening and building -----------------------------------------------------

    @classmethod
    def open(cls, workspace: Path, log: AuditLog | None = None) -> MemoryIndex:
        """Open (or build) the index of ``workspace``; catch up with ``log`` if given."""
        if not workspace.is_dir():
            raise UsageError(f"there is no workspace at {workspace} to keep a memory index in; "
                             "open the workspace (or start a kernel on it) first")
        path = workspace / INDEX_PATH
        path.parent.mkdir(exist_ok=True)
        try:
            index = cls(path, _connect(path))
        except sqlite3.DatabaseError:  # not a database: a cache, so start again
            path.unlink()
            index = cls(path, _connect(path))
        if not index._usable() or path.with_name(DIRTY).exists():
            index._recreate()
        if log is not None:
            index.catch_up(log)
        return index

    def close(self) -> None:
        self.db.close()

    def _usable(self) -> bool:
        try:
            row = self.db.execute("SELECT value FROM meta WHERE key='format'").fetchone()
            self.db.execute("SELECT count(*) FROM text WHERE text MATCH '\"x\"'").fetchone()
        except sqlite3.DatabaseError:
            return False
        return row is not None and row[0] == FORMAT

    def _recreate(self) -> None:
        self.db.close()
        for suffix in ("", "-journal", "-wal", "-shm"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        self.path.with_name(DIRTY).unlink(missing_ok=True)
        self.db = _connect(self.path)
        with self.db:
            self.db.executescript(_SCHEMA)
            self._set("format", FORMAT)
            self._set("built_index", "-1")
            self._set("built_hash", "")
        self.rebuilt = True
        self.vectors_changed(None)
        self.vector_cache = None
        self._identity = _identity(self.path)

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """One write transaction, marked by the ``index.dirty`` file while it runs: an
        open that finds the mark (the process died mid-write) rebuilds."""
        mark = self.path.with_name(DIRTY)
        mark.touch()
        with self.db:
            yield
        mark.unlink()

    def _replaced(self) -> bool:
        """Whether the file this connection reads was deleted or replaced under it."""
        try:
            now = self.path.stat()
        except FileNotFoundError:
            return True
        return (now.st_dev, now.st_ino) != self._identity

    def _set(self, key: str, value: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value))

    def vectors_changed(self, entries: Iterable[int] | None) -> None:
        """Move the generation: the vectors of ``entries`` (None: of any entry) may differ."""
        self.generation += 1
        self.vector_changes.append((self.generation,
                                    None if entries is None else frozenset(entries)))
        del self.vector_changes[:-VECTOR_CHANGES]

    def _get(self, key: str) -> str:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return "" if row is None else str(row[0])

    def built_to(self) -> tuple[int, str]:
        """(index, hash) of the newest chain record indexed; (-1, '') when none."""
        return int(self._get("built_index")), self._get("built_hash")

    def catch_up(self, log: AuditLog) -> int:
        """Index the chain's records after the built head; rebuild if the chain was
        replaced.  Returns how many records were read."""
        if self._replaced():  # an erasure deleted the file: start again, from the chain
            self._recreate()
        built, digest = self.built_to()
        if built == len(log) - 1 and (built < 0 or log.entries[built].hash == digest):
            return 0  # current: the common case before a recall, kept cheap
        if built >= len(log) or (built >= 0 and log.entries[built].hash != digest):
            self._recreate()
            built = -1
        start = built + 1
        erased: set[str] = set()
        llm = llm_store(log)
        with self._writing():
            for record in records_from(log, start):
                kind = record.get("type")
                if kind == "op":
                    for entry in op_entries(log, record, llm):
                        self._add(**entry)
                elif kind == "void" and type(record.get("voids")) is int:
                    self.db.execute("UPDATE entries SET status='void' WHERE audit=?",
                                    (record["voids"],))
                elif kind == "erasure":
                    erased.add(str(record["subject"]))
            if len(log):
                self._set("built_index", str(len(log) - 1))
                self._set("built_hash", log.entries[-1].hash)
        if erased:
            self._forget(erased)
        return len(log) - start

    def _add(self, *, kind: str, principal: str, body: str, title: str,
             name: str | None = None, op: int | None = None, audit: int | None = None,
             at: str | None = None, status: str | None = None,
             subjects: Iterable[str] = ()) -> int:
        held = sorted(set(subjects))
        # vec: 0 until a vector is stored (1); -1 for a data subject's text, never embedded
        cursor = self.db.execute(
            "INSERT INTO entries(kind, principal, name, op, audit, at, status, title, vec) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (kind, principal, name, op, audit, at, status, title, -1 if held else 0))
        entry = cursor.lastrowid
        assert entry is not None
        self.db.execute("INSERT INTO text(rowid, body, owner, kind) VALUES (?, ?, ?, ?)",
                        (entry, body[:MAX_BODY_CHARS], _owner(principal), kind))
        self.db.executemany("INSERT INTO subjects(entry, subject) VALUES (?, ?)",
                            [(entry, subject) for subject in held])
        return entry

    # -- the working and semantic layers -------------------------------------------

    def sync_working(self, principal: str, items: Iterable[WorkingItem]) -> None:
        """Replace the working layer of ``principal``'s namespace with ``items``."""
        with self._writing():
            carried = self._drop("working", principal)
            added = []
            for item in items:
                preview = item.preview[:PREVIEW_CHARS]
                body = f"{item.name} {item.type} {preview}"
                added.append((self._add(kind="working", principal=principal, name=item.name,
                                        body=body, title=f"{item.name}: {item.type}"), body))
            self._carry(carried, added)

    def sync_semantic(self, principal: str, facts: Facts | None) -> None:
        """Replace ``principal``'s semantic layer with ``facts`` (as the image holds them)."""
        with self._writing():
            carried = self._drop("semantic", principal)
            added = []
            for fact in (facts.items if facts is not None else []):
                body = " ".join((fact.text, *fact.tags))
                added.append((self._add(kind="semantic", principal=principal, op=fact.op,
                                        at=fact.at, name=str(fact.id), body=body,
                                        title=f"fact {fact.id}"), body))
            self._carry(carried, added)

    def semantic_principals(self) -> set[str]:
        """The principals the semantic layer holds facts of."""
        return {row[0] for row in self.db.execute(
            "SELECT DISTINCT principal FROM entries WHERE kind='semantic'")}

    def _drop(self, kind: str, principal: str) -> dict[str, tuple[str, int, bytes]]:
        """Delete a layer of ``principal``; returns its vectors by text, to carry over."""
        carried = {str(body)[:MAX_BODY_CHARS]: (model, dims, vector)
                   for body, model, dims, vector in self.db.execute(
                       "SELECT t.body, v.model, v.dims, v.vector FROM entries e "
                       "JOIN vectors v ON v.entry = e.id JOIN text t ON t.rowid = e.id "
                       "WHERE e.kind=? AND e.principal=?", (kind, principal))}
        ids = [row[0] for row in self.db.execute(
            "SELECT id FROM entries WHERE kind=? AND principal=?", (kind, principal))]
        self._delete(ids)
        return carried

    def _carry(self, carried: dict[str, tuple[str, int, bytes]],
               added: list[tuple[int, str]]) -> None:
        """Give re-added entries whose text is unchanged their vector back (not paid twice)."""
        kept = [(entry, *carried[body[:MAX_BODY_CHARS]]) for entry, body in added
                if body[:MAX_BODY_CHARS] in carried]
        if kept:
            self.vectors_changed(entry for entry, *_ in kept)
            self.db.executemany(
                "INSERT INTO vectors(entry, model, dims, vector) VALUES (?, ?, ?, ?)", kept)
            self.db.executemany("UPDATE entries SET vec = 1 WHERE id = ?",
                                [(entry,) for entry, *_ in kept])

    def _delete(self, ids: list[int]) -> None:
        for start in range(0, len(ids), 500):
            chunk = [(entry,) for entry in ids[start:start + 500]]
            self.db.executemany("DELETE FROM text WHERE rowid=?", chunk)
            self.db.executemany("DELETE FROM subjects WHERE entry=?", chunk)
            if self.db.executemany("DELETE FROM vectors WHERE entry=?", chunk).rowcount:
                self.vectors_changed(entry for (entry,) in chunk)
            self.db.executemany("DELETE FROM entries WHERE id=?", chunk)

    # -- erasure --------------------------------------------------------------------

    def erase_subject(self, subject: str) -> int:
        """Delete every entry holding ``subject``'s payloads, securely; returns how many."""
        return self._forget({subject})

    def _forget(self, subjects: set[str]) -> int:
        marks = ",".join("?" * len(subjects))
        with self._writing():
            ids = [row[0] for row in self.db.execute(
                f"SELECT DISTINCT entry FROM subjects WHERE subject IN ({marks})",
                sorted(subjects))]
            self._delete(ids)
            self.db.execute("INSERT INTO text(text) VALUES ('optimize')")
        # Deleted and merged, not yet vacuumed: secure_delete has zeroed the freed cells
        # and pages already (a process killed here leaves none of the text behind).
        _faults.point("memory.erased")
        self.db.execute("VACUUM")  # and no free page is left in the file either
        return len(ids)

    # -- recall ---------------------------------------------------------------------

    def recall(self, query: str, *, principal: str, k: int = 5,
               kinds: Iterable[str] | None = None,
               may_read: Callable[[str], bool] | None = None,
               meaning: Meaning | None = None) -> list[Memory]:
        """The ``k`` best entries for ``query`` that ``principal`` may read; with
        ``meaning`` (the query's vector), the words' and the vectors' rankings fused."""
        if type(k) is not int or not 1 <= k <= 1000:
            raise UsageError(f"recall() takes k from 1 to 1000, not {k!r}")
        chosen = KINDS if kinds is None else _kinds(kinds)
        scope = Scope(principal=principal, kinds=chosen, may_read=may_read)
        if meaning is None:
            return self._by_words(query, scope, k) if chosen else []
        depth = max(k, FUSION_DEPTH)
        words = self._by_words(query, scope, depth) if chosen else []
        near = [entry for entry, _ in nearest(self, scope, meaning, depth)] if chosen else []
        known = {memory.entry: memory for memory in words}
        known.update(self._load([entry for entry in near if entry not in known], scope))
        found: list[Memory] = []
        for entry, score, matched in fuse([memory.entry for memory in words], near):
            if entry in known and len(found) < k:
                found.append(replace(known[entry], score=score, matched=matched))
        return found

    def _by_words(self, query: str, scope: Scope, k: int) -> list[Memory]:
        every = fts_query(query, join=" AND ")
        if every is None:
            return []
        found = self._recall(every, scope, k)
        some = fts_query(query)
        if len(found) < k and some != every:  # then entries with only some of the words
            seen = {memory.entry for memory in found}
            more = self._recall(f"({some}) NOT ({every})", scope, k)
            found += [memory for memory in more if memory.entry not in seen][:k - len(found)]
        return found

    def _recall(self, expression: str, scope: Scope, k: int) -> list[Memory]:
        kind_filter = " OR ".join(f'"{kind}"' for kind in sorted(scope.kinds))
        mine = (f'owner : "{_owner(scope.principal)}" AND kind : ({kind_filter}) '
                f"AND ({expression})")
        found = self._ranked(mine, k, scope, every_row=False)
        if scope.reads_human_names():
            theirs = f'owner : "{_owner(HUMAN)}" AND kind : "working" AND ({expression})'
            found += self._ranked(theirs, k, scope, every_row=True)
            found.sort(key=lambda memory: memory.score)
        return found[:k]

    def _ranked(self, expression: str, k: int, scope: Scope, *,
                every_row: bool) -> list[Memory]:
        """The best ``k`` entries matching ``expression`` that ``scope`` admits (read
        ``every_row`` when some may be refused, else only ``k``)."""
        rows = self.db.execute(
            "SELECT e.id, e.kind, e.principal, e.name, e.op, e.at, e.status, e.title, t.body, "
            "t.score FROM "
            "(SELECT rowid, body, rank AS score FROM text WHERE text MATCH ? "
            "ORDER BY rank LIMIT ?) t JOIN entries e ON e.id = t.rowid ORDER BY t.score",
            (expression, -1 if every_row else k))
        found: list[Memory] = []
        for entry, kind, owner, name, op, at, status, title, body, score in rows:
            if not scope.admits(kind, owner, name):
                continue
            found.append(Memory(entry=entry, kind=kind, principal=owner, text=body, title=title,
                                score=float(score), op=op, name=name, at=at, status=status))
            if len(found) >= k:
                break
        return found

    def _load(self, entries: list[int], scope: Scope) -> dict[int, Memory]:
        """The entries ``scope`` admits among ``entries``, by id (score 0 until fused)."""
        found: dict[int, Memory] = {}
        for start in range(0, len(entries), 500):
            chunk = entries[start:start + 500]
            marks = ",".join("?" * len(chunk))
            for entry, kind, owner, name, op, at, status, title, body in self.db.execute(
                    "SELECT e.id, e.kind, e.principal, e.name, e.op, e.at, e.status, e.title, "
                    f"t.body FROM entries e JOIN text t ON t.rowid = e.id WHERE e.id IN ({marks})",
                    chunk):
                if scope.admits(kind, owner, name):
                    found[entry] = Memory(entry=entry, kind=kind, principal=owner, text=body,
                                          title=title, score=0.0, op=op, name=name, at=at,
                                          status=status)
        return found

    def recent(self, *, principal: str, k: int) -> list[Memory]:
        """``principal``'s ``k`` newest facts and ops (facts first): a context without a query."""
        rows = self.db.execute(
            "SELECT e.id, e.kind, e.principal, e.name, e.op, e.at, e.status, e.title, t.body "
            "FROM entries e JOIN text t ON t.rowid = e.id WHERE e.principal = ? AND e.kind IN "
            "('semantic', 'episodic') ORDER BY e.kind = 'episodic', e.id DESC LIMIT ?",
            (principal, k))
        return [Memory(entry=entry, kind=kind, principal=owner, text=body, title=title,
                       score=0.0, op=op, name=name, at=at, status=status)
                for entry, kind, owner, name, op, at, status, title, body in rows]

    def subjects_of(self, entries: Iterable[int]) -> set[str]:
        """The data subjects whose text ``entries`` hold."""
        found: set[str] = set()
        for entry in entries:
            found |= {row[0] for row in self.db.execute(
                "SELECT subject FROM subjects WHERE entry = ?", (entry,))}
        return found

    def context(self, query: str, *, principal: str, max_tokens: int,
                kinds: Iterable[str] | None = None,
                may_read: Callable[[str], bool] | None = None,
                counter: Callable[[str], int] | None = None) -> str:
        """The most relevant memories for ``query``, one per line, within ``max_tokens``."""
        if type(max_tokens) is not int or max_tokens < 1:
            raise UsageError(f"context() takes max_tokens as a positive int, not {max_tokens!r}")
        count = counter or count_tokens
        lines: list[str] = []
        used = 0
        for memory in self.recall(query, principal=principal, k=50, kinds=kinds,
                                  may_read=may_read):
            line = render(memory)
            cost = count(line + "\n")
            if used + cost > max_tokens:
                continue
            lines.append(line)
            used += cost
        return "\n".join(lines)

    def count(self) -> dict[str, int]:
        """Entries per kind."""
        return {kind: n for kind, n in self.db.execute(
            "SELECT kind, count(*) FROM entries GROUP BY kind")}


def _identity(path: Path) -> tuple[int, int]:
    try:
        found = path.stat()
    except FileNotFoundError:
        return (0, 0)
    return (found.st_dev, found.st_ino)


def _connect(path: Path) -> sqlite3.Connection:
    connection = sqlite3.connect(path, isolation_level="DEFERRED", check_same_thread=False)
    connection.execute("PRAGMA secure_delete=ON")
    connection.execute("PRAGMA journal_mode=MEMORY")
    connection.execute("PRAGMA synchronous=OFF")
    return connection


def _owner(principal: str) -> str:
    """A principal as one FTS5 token (hex digits only: nothing in it is syntax)."""
    return "p" + principal.encode("utf-8", "surrogatepass").hex()


def _kinds(kinds: Iterable[str]) -> frozenset[str]:
    if isinstance(kinds, str):
        kinds = [kinds]
    chosen = frozenset(kinds)
    unknown = chosen - KINDS
    if unknown:
        raise UsageError(f"recall() knows the kinds {sorted(KINDS)}, not {sorted(unknown)}")
    return chosen


def iter_entries(index: MemoryIndex) -> Iterator[tuple[str, str, str]]:
    """(kind, principal, body) of every entry (for tests and inspection)."""
    yield from index.db.execute(
        "SELECT e.kind, e.principal, text.body FROM entries e JOIN text ON text.rowid = e.id")
