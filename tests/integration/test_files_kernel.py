"""Files in the transaction through real kernels (issue 36's first "Done when"): a failing
cell's file writes vanish, a committed one's survive ``kill -9``, ``kill -9`` in the middle
of a file-writing cell leaves the directory as the last commit had it before the next
kernel's first cell, ``%kernos checkout`` brings files back and forth, and a fork and a
clone carry them (through the CLI)."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from cli_support import kernos, ok
from remote_support import trust_flags

if TYPE_CHECKING:
    from conftest import Kernel

pytestmark = pytest.mark.kernel


def committed(kernel: Kernel, code: str) -> dict[str, object]:
    result = kernel.run(code)
    assert result.committed, (result.kernos, result.errors)
    return result.kernos


def tree(root: Path) -> dict[str, str]:
    """Every file under ``root``: its SHA-256 (and '->' target for a link)."""
    found = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if path.is_symlink():
            found[name] = "-> " + str(path.readlink())
        elif path.is_file():
            found[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


BIG = "bytes(range(256)) * 12000"  # 3 MB: several chunks


def populate(kernel: Kernel) -> Path:
    report = committed(kernel, "import kernos.files, os\n"
                      "kernos.files.path('keep.txt').write_text('version one\\n')\n"
                      "kernos.files.path('gone.txt').write_text('deleted by the failing cell\\n')\n"
                      "(kernos.files.root() / 'data').mkdir()\n"
                      f"kernos.files.path('data/big.bin').write_bytes({BIG})\n")
    kernel.populated = report  # type: ignore[attr-defined]
    root = Path(kernel.value("str(kernos.files.root())"))
    assert root == kernel.workspace / "files"
    assert kernel.value("str(kernos.files.path('x'))") == str(root / "x")
    return root


def test_a_failing_cells_file_writes_vanish_and_a_committed_ones_survive_kill9(
        kernel_factory: Callable[..., Kernel]) -> None:
    kernel = kernel_factory()
    root = populate(kernel)
    before = tree(root)
    big_before = (root / "data" / "big.bin").read_bytes()

    failed = kernel.run("kernos.files.path('keep.txt').write_text('changed, then failed')\n"
                        "kernos.files.path('gone.txt').unlink()\n"
                        "kernos.files.path('created.csv').write_text('a,b\\n')\n"
                        "(kernos.files.root() / 'newdir').mkdir()\n"
                        "kernos.files.path('newdir/x').write_bytes(b'x')\n"
                        "with open(kernos.files.path('data/big.bin'), 'r+b') as f:\n"
                        "    f.seek(1_500_000); f.write(b'EDITED')\n"
                        "raise RuntimeError('the cell fails')")
    assert failed.rolled_back, failed.kernos
    assert tree(root) == before
    assert not (root / "created.csv").exists() and not (root / "newdir").exists()
    assert (root / "gone.txt").read_text() == "deleted by the failing cell\n"
    assert (root / "data" / "big.bin").read_bytes() == big_before

    report = committed(kernel, "kernos.files.path('keep.txt').write_text('version two\\n')\n"
                               "kernos.files.path('gone.txt').unlink()\n"
                               "kernos.files.path('made.csv').write_text('x,y\\n1,2\\n')\n")
    assert report["files"] == {"added": ["made.csv"], "changed": ["keep.txt"],
                               "deleted": ["gone.txt"]}, report
    after = tree(root)
    kernel.kill9()
    (root / "keep.txt").write_text("scribbled on while no kernel ran")
    (root / "made.csv").unlink()
    (root / "stray").write_text("not in any commit")

    again = kernel_factory(kernel.workspace)
    assert tree(root) == after  # before its first cell
    assert (root / "keep.txt").read_text() == "version two\n"
    assert again.value("open(kernos.files.path('made.csv')).read()") == "x,y\n1,2\n"


def test_kill9_in_the_middle_of_a_file_writing_cell(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    kernel = kernel_factory()
    root = populate(kernel)
    last_commit = tree(root)
    ready = tmp_path / "ready"
    kernel.client.execute(
        "import time\n"
        "kernos.files.path('keep.txt').write_text('half way')\n"
        "kernos.files.path('gone.txt').unlink()\n"
        "kernos.files.path('partial.csv').write_text('1,2\\n')\n"
        "with open(kernos.files.path('data/big.bin'), 'ab') as f:\n"
        "    f.write(b'appended')\n"
        f"open({str(ready)!r}, 'w').close()\n"
        "time.sleep(600)")
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert time.monotonic() < deadline, "the cell never got ready"
        time.sleep(0.02)
    assert tree(root) != last_commit  # the writes are on disk when it dies
    kernel.kill9()

    again = kernel_factory(kernel.workspace)
    # The next kernel put them back before its first cell; look without running one.
    assert tree(root) == last_commit
    assert not (root / "partial.csv").exists()
    assert again.value("open(kernos.files.path('keep.txt')).read()") == "version one\n"


def test_checkout_restores_earlier_files_and_back(kernel_factory: Callable[..., Kernel]) -> None:
    kernel = kernel_factory()
    root = populate(kernel)
    first = tree(root)
    first_op = kernel.populated["op"]  # type: ignore[attr-defined]
    second_op = committed(kernel, "kernos.files.path('keep.txt').write_text('version two\\n')\n"
                      "kernos.files.path('data/big.bin').unlink()\n"
                      "kernos.files.path('report.md').write_text('# later\\n')\n")["op"]
    second = tree(root)
    log = kernel.run("%kernos log")
    assert log.status == "ok", log.errors

    back = kernel.run(f"%kernos checkout @{first_op}")
    assert back.committed, (back.kernos, back.errors)
    assert tree(root) == first
    assert (root / "keep.txt").read_text() == "version one\n"
    assert not (root / "report.md").exists()

    forth = kernel.run(f"%kernos checkout @{second_op}")
    assert forth.committed, (forth.kernos, forth.errors)
    assert tree(root) == second
    kernel.kill9()
    kernel_factory(kernel.workspace)
    assert tree(root) == second


def test_a_fork_and_a_clone_carry_the_files(kernel_factory: Callable[..., Kernel],
                                            tmp_path: Path) -> None:
    kernel = kernel_factory(tmp_path / "source")
    root = populate(kernel)
    committed(kernel, "kernos.files.path('report.md').write_text('# for the others\\n')")
    expected = tree(root)
    url = tmp_path / "remote.git"
    ok(kernos("remote", "add", "origin", str(url), "-w", str(kernel.workspace)))
    ok(kernos("push", "-w", str(kernel.workspace)))  # beside the running kernel
    forked = json.loads(ok(kernos("fork", str(kernel.workspace), str(tmp_path / "forked"),
                                  "--json")))
    ok(kernos("clone", str(url), str(tmp_path / "copy"), *trust_flags(url)))
    for where in (Path(forked["dest"]), tmp_path / "copy"):
        assert not (where / "files").exists()  # only the history travelled
        other = kernel_factory(where)
        assert tree(where / "files") == expected  # the new kernel put them on disk
        if where != tmp_path / "copy":  # (a cell on the clone would fork its history)
            assert other.value("open(kernos.files.path('report.md')).read()") == \
                "# for the others\n"
        other.stop()

    # A pull brings a file change.
    committed(kernel, "kernos.files.path('report.md').write_text('# revised\\n')")
    ok(kernos("push", "-w", str(kernel.workspace)))
    ok(kernos("pull", "-w", str(tmp_path / "copy")))
    kernel_factory(tmp_path / "copy")
    assert (tmp_path / "copy" / "files" / "report.md").read_text() == "# revised\n"
