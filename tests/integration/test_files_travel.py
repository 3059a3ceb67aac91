"""A snapshot from elsewhere is hostile, through real kernels and the CLI: a directory
tracked by absolute path on one machine (or in one workspace) is left alone by a clone or a
fork of it until its own human tracks it there (kernos.files.here)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from cli_support import kernos, ok
from remote_support import trust_flags

if TYPE_CHECKING:
    from conftest import Kernel

pytestmark = pytest.mark.kernel


def tree(root: Path) -> dict[str, str]:
    return {str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(root.rglob("*")) if path.is_file()}


def test_a_directory_tracked_elsewhere_is_not_written_by_a_clone_or_a_fork(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    outside = tmp_path / "somewhere-outside"
    outside.mkdir()
    source = kernel_factory(tmp_path / "source")
    tracked = source.run(f"%kernos track {outside}")
    assert tracked.committed, (tracked.kernos, tracked.errors)
    wrote = source.run(f"open({str(outside / 'results.csv')!r}, 'w').write('a,b\\n1,2\\n')")
    assert wrote.committed and wrote.kernos["files"]["added"] == [
        "somewhere-outside:results.csv"], wrote.kernos
    url = tmp_path / "remote.git"
    ok(kernos("remote", "add", "origin", str(url), "-w", str(source.workspace)))
    ok(kernos("push", "-w", str(source.workspace)))
    ok(kernos("fork", str(source.workspace), str(tmp_path / "forked")))
    source.stop()

    # The directory moves on here; what a clone or a fork holds must not overwrite it.
    (outside / "results.csv").write_text("the owner's newer table\n")
    (outside / "notes.txt").write_text("not in any snapshot\n")
    mine = tree(outside)
    ok(kernos("clone", str(url), str(tmp_path / "copy"), *trust_flags(url)))
    for where in (tmp_path / "copy", tmp_path / "forked"):
        other = kernel_factory(where)
        assert tree(outside) == mine  # not at open
        first = other.run("x = 1")
        assert first.committed, first.kernos
        notices = first.kernos["files"]["notices"]
        assert any(str(outside) in notice and f"%kernos track {outside}" in notice
                   for notice in notices), notices
        failed = other.run(f"open({str(outside / 'stray')!r}, 'w').write('x')\n1 / 0")
        assert failed.rolled_back
        (outside / "stray").unlink()  # a rollback does not touch it either: it stays
        checkout = other.run("%kernos checkout @1")
        assert checkout.committed, (checkout.kernos, checkout.errors)
        assert tree(outside) == mine  # nor a checkout
        other.stop()

    # Its human accepts it on the clone: from then on it moves with the ops there.
    copy = kernel_factory(tmp_path / "copy")
    accepted = copy.run(f"%kernos track {outside}")
    assert accepted.committed, (accepted.kernos, accepted.errors)
    assert "tracked here from this cell on" in accepted.stdout
    # (its head is the checkout of op 1, when the directory was still empty)
    assert sorted(accepted.kernos["files"]["added"]) == [
        "somewhere-outside:notes.txt", "somewhere-outside:results.csv"], accepted.kernos
    failed = copy.run(f"open({str(outside / 'stray')!r}, 'w').write('x')\n1 / 0")
    assert failed.rolled_back and not (outside / "stray").exists()
