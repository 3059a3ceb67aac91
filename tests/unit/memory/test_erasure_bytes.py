"""Erasure in the index FILE: no byte of an erased subject's text survives, even mid-way.

``MemoryIndex.erase_subject`` (and a catch-up over an ``erasure`` record)
deletes the subject's entries with ``secure_delete`` on, merges the FTS
segments, then vacuums.  Two proofs, each reading the file's bytes:

* a process SIGKILLed between the delete and the VACUUM (crash point
  ``memory.erased``) leaves none of the text: ``secure_delete`` zeroed it;
* after the erasure the file holds no free page at all: the VACUUM ran.

The erased entries carry vectors (``kernos.memory.vectors``) too: their blobs go
with them.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import struct
import subprocess
import sys
from pathlib import Path

from kernos.memory import MemoryIndex
from kernos.memory.index import INDEX_PATH

SECRET = "Quillibrand"
WORDS = " ".join(f"{SECRET}{n} filler text of an erased visit" for n in range(400))
VECTOR = [1234.5678 + n / 7 for n in range(64)]
"""The vector of every erased entry: its float32 bytes must leave the file too."""
BLOB = b"".join(struct.pack("<f", x) for x in VECTOR)

BUILD = f"""
import sys
from pathlib import Path
from kernos.memory import MemoryIndex
from kernos.memory.vectors import store

index = MemoryIndex.open(Path(sys.argv[1]))
erased = []
with index._writing():
    for n in range(40):
        erased.append(index._add(kind="episodic", principal="human", body={WORDS!r} + str(n),
                                 title=f"op {{n}}", op=n, subjects=["c-q"]))
        index._add(kind="episodic", principal="human", body="a public note " * 50,
                   title=f"note {{n}}", op=1000 + n)
store(index, "test/embed", 64, [(entry, {VECTOR!r}) for entry in erased])
index.close()
"""
ERASE = """
import sys
from pathlib import Path
from kernos.memory import MemoryIndex

index = MemoryIndex.open(Path(sys.argv[1]))
print(index.erase_subject("c-q"), flush=True)
index.close()
"""


def _run(code: str, workspace: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, str(workspace)], capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=120)


def _holds_secret(workspace: Path) -> bool:
    data = b"".join(path.read_bytes() for path in (workspace / "memory").iterdir()
                    if path.is_file())
    return SECRET.lower().encode() in data.lower() or BLOB in data


def test_a_kill_before_the_vacuum_leaves_no_erased_text(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    assert _run(BUILD, workspace).returncode == 0
    assert _holds_secret(workspace)  # the test can see the text when it is there
    assert BLOB in (workspace / INDEX_PATH).read_bytes()  # and the vectors
    killed = _run(ERASE, workspace, KERNOS_CRASH_AT="memory.erased")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not _holds_secret(workspace)
    # What the kill left is a sound index without the subject.
    index = MemoryIndex.open(workspace)
    assert index.recall(f"{SECRET}1", principal="human") == []
    assert len(index.recall("public note", principal="human", k=100)) == 40
    index.close()


def test_after_an_erasure_the_file_has_no_free_pages(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    assert _run(BUILD, workspace).returncode == 0
    done = _run(ERASE, workspace)
    assert done.returncode == 0 and done.stdout.strip() == "40", done.stderr
    assert not _holds_secret(workspace)
    with sqlite3.connect(workspace / INDEX_PATH) as db:
        assert db.execute("SELECT count(*) FROM vectors").fetchone() == (0,)
    with sqlite3.connect(workspace / INDEX_PATH) as db:
        assert db.execute("PRAGMA freelist_count").fetchone() == (0,)
