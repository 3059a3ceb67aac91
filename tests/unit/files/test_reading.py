"""What ``kernos log`` / ``show`` / ``diff`` say of tracked files (kernos.files.reading and
its rendering in kernos.history), on an in-process image."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import kernos.files
from core_support import CoreEnv
from kernos import history
from kernos.files.reading import DIFF_LINES, MAX_DIFFS, TEXT_LIMIT, FileChange
from kernos.store.snapshots import CHUNK_BYTES


@pytest.fixture
def env(tmp_path: Path) -> Iterator[CoreEnv]:
    opened = CoreEnv(tmp_path / "ws")
    yield opened
    opened.close()


def op(env: CoreEnv, **files: bytes | None) -> None:
    """One committed op that writes (or, for None, deletes) files in the files root."""
    running = env.image.begin(source="# files")
    for name, data in files.items():
        path = kernos.files.path(name.replace("__", "/"))
        if data is None:
            path.unlink()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    running.commit()


def shown_files(env: CoreEnv, ref: str = "HEAD") -> dict[str, FileChange]:
    assert env.workspace is not None
    return {change.path: change for change in history.show(env.workspace, ref)["files"]}


def test_show_lists_an_ops_files_with_sizes_and_text_diffs(env: CoreEnv) -> None:
    op(env, keep=b"same\n", edit=b"one\ntwo\n", gone=b"bye\n")
    op(env, edit=b"one\nthree\n", gone=None, new=b"hello\n")
    files = shown_files(env)
    assert [(c.path, c.change) for c in files.values()] == [
        ("new", "added"), ("edit", "changed"), ("gone", "deleted")]
    assert (files["edit"].before, files["edit"].after) == (8, 10)
    assert files["edit"].diff == ("--- a/edit\n+++ b/edit\n@@ -1,2 +1,2 @@\n one\n-two\n"
                                  "+three\n")
    assert files["new"].diff is not None and files["new"].diff.startswith("--- /dev/null\n")
    assert files["gone"].before == 4 and files["gone"].after is None
    assert "+++ /dev/null" in (files["gone"].diff or "")
    text = history.format_show(history.show(env.workspace, "HEAD"))  # type: ignore[arg-type]
    assert "files (+1 ~1 -1):" in text
    assert "    ~ edit  (8 B -> 10 B)\n        --- a/edit" in text
    assert "    - gone  (was 4 B)" in text


def test_binary_large_and_linked_files_say_why_there_is_no_diff(env: CoreEnv) -> None:
    op(env, nul=b"text\0with a NUL", latin=b"\xffnot UTF-8", small=b"x" * TEXT_LIMIT,
       large=b"x" * (TEXT_LIMIT + 1))
    os.symlink("small", kernos.files.path("link"))
    op(env)
    files = shown_files(env, "HEAD~1")
    assert files["nul"].diff is None and files["nul"].note == "binary: no text diff"
    assert files["latin"].diff is None and files["latin"].note == "binary: no text diff"
    assert files["small"].diff is not None  # exactly the limit: shown
    assert files["large"].diff is None
    assert files["large"].note == "larger than 64 KiB: no text diff"
    link = shown_files(env)["link"]
    assert link.diff is None and link.note == "a symbolic link: (none) -> link to 'small'"


def test_the_size_of_a_chunked_file_is_exact(env: CoreEnv) -> None:
    size = 2 * CHUNK_BYTES + 12345
    op(env, big=os.urandom(size))
    [change] = shown_files(env).values()
    assert (change.after, change.note) == (size, "larger than 64 KiB: no text diff")


def test_a_long_diff_is_cut_and_says_how_much(env: CoreEnv) -> None:
    op(env, lines="".join(f"{i}\n" for i in range(1000)).encode())
    op(env, lines="".join(f"{i}!\n" for i in range(1000)).encode())
    diff = shown_files(env)["lines"].diff or ""
    lines = diff.splitlines()
    assert len(lines) == DIFF_LINES + 1
    assert lines[-1] == f"... {2003 - DIFF_LINES} more diff lines not shown"


def test_a_missing_final_newline_is_said(env: CoreEnv) -> None:
    op(env, f=b"a\nb")
    op(env, f=b"a\nc")
    assert shown_files(env)["f"].diff == ("--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n"
                                          "\\ No newline at end of file\n+c\n"
                                          "\\ No newline at end of file\n")


def test_diff_lists_only_the_files_that_differ(env: CoreEnv, tmp_path: Path) -> None:
    op(env, same=b"1\n", edit=b"a\n")
    other = tmp_path / "data"
    other.mkdir()
    running = env.image.begin(source="# track and write")
    env.image.files.track(other)
    (other / "in-other.txt").write_text("x\n")
    kernos.files.path("edit").write_bytes(b"b\n")
    running.commit()
    assert env.workspace is not None
    result = history.diff(env.workspace, "HEAD~1", "HEAD")
    assert [(c.path, c.change) for c in result.files] == [
        ("data:in-other.txt", "added"), ("edit", "changed")]
    text = history.format_diff(result, "HEAD~1", "HEAD")
    assert "  no names differ\nfiles:\n    + data:in-other.txt  (2 B)" in text
    assert history.format_diff(history.diff(env.workspace, "HEAD", "HEAD"), "HEAD", "HEAD") \
        .endswith("no names differ; no tracked file differs")


def test_log_counts_the_files_of_each_op(env: CoreEnv) -> None:
    op(env, a=b"1", b=b"2")
    running = env.image.begin(source="x = 1")
    env.ns["x"] = 1
    kernos.files.path("a").write_bytes(b"changed")
    kernos.files.path("b").unlink()
    running.commit()
    running = env.image.begin(source="y = 2")
    env.ns["y"] = 2
    running.commit()
    assert env.workspace is not None
    entries = history.log(env.workspace)
    assert [entry.files for entry in entries] == [
        {}, {"changed": ["a"], "deleted": ["b"]}, {"added": ["a", "b"]}]
    rows = history.format_log(entries).splitlines()[1:]
    assert "files:" not in rows[0]
    assert "+x | files: +0 ~1 -1" in rows[1]
    assert " files: +2 ~0 -0 " in rows[2] and "(none)" not in rows[2]


def test_only_the_first_files_get_a_text_diff(env: CoreEnv) -> None:
    op(env, **{f"f{i:03d}": b"x\n" for i in range(MAX_DIFFS + 5)})
    files = list(shown_files(env).values())
    assert len(files) == MAX_DIFFS + 5
    assert all(change.diff for change in files[:MAX_DIFFS])
    assert [change.note for change in files[MAX_DIFFS:]] == [
        f"no text diff: only the first {MAX_DIFFS} files get one"] * 5
    assert all(change.after == 2 for change in files)
