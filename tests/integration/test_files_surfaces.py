"""The human's surfaces for tracked files (issue 36), through a real kernel and the CLI.

A cell writes ``kernos.files.path("out.csv")``; ``%kernos show`` and the
``kernos`` command's ``show``, ``log`` and ``diff`` list it, with a text diff.
``%kernos track DIR`` makes a directory commit and roll back with the ops that
follow; ``%kernos untrack DIR`` stops it; ``%kernos track`` lists them.  A bad
path is refused with a clear error and the image as it was.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agents_support import committed, error_text, fails
from integration.test_cli import kernos_command

pytestmark = pytest.mark.kernel

WRITE = ('import kernos.files\n'
         'kernos.files.path("out.csv").write_text("a,b\\n1,2\\n")')
EDIT = 'kernos.files.path("out.csv").write_text("a,b\\n1,3\\n4,5\\n")'


def cli(*args: str, workspace: Path) -> str:
    """``kernos ARGS -w WORKSPACE`` (the workspace's kernel running): its stdout."""
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("KERNOS_WORKSPACE", "JPY_SESSION_NAME")}
    result = subprocess.run([*kernos_command(), *args, "-w", str(workspace)],
                            capture_output=True, text=True, env=environment, timeout=120)
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result.stdout


def test_a_written_file_is_listed_with_its_text_diff(kernel: Any, tmp_path: Path) -> None:
    workspace = kernel.workspace
    committed(kernel, WRITE)
    committed(kernel, EDIT)
    shown = committed(kernel, "%kernos show").stdout
    assert "files (+0 ~1 -0):" in shown, shown
    assert "~ out.csv  (8 B -> 12 B)" in shown, shown
    assert "--- a/out.csv" in shown and "+++ b/out.csv" in shown, shown
    assert "        -1,2\n        +1,3\n        +4,5" in shown, shown

    added = committed(kernel, "%kernos show HEAD~1").stdout
    assert "+ out.csv  (8 B)" in added, added
    assert "--- /dev/null" in added and "+a,b" in added, added

    magic_diff = committed(kernel, "%kernos diff @1 @2").stdout
    assert "files:\n    ~ out.csv  (8 B -> 12 B)\n        --- a/out.csv" in magic_diff, magic_diff
    assert "files: +0 ~1 -0" in committed(kernel, "%kernos log 5").stdout

    log = cli("log", workspace=workspace)
    lines = {line.split()[0]: line for line in log.splitlines()[1:]}
    assert "files: +0 ~1 -0" in lines["2"], log
    assert "files: +1 ~0 -0" in lines["1"], log
    assert "files:" not in lines.get("3", ""), log  # `%kernos show` changed nothing

    show = cli("show", "@2", workspace=workspace)
    assert "~ out.csv  (8 B -> 12 B)" in show and "        +4,5" in show, show

    diff = cli("diff", "@1", "@2", workspace=workspace)
    assert "files:" in diff and "~ out.csv" in diff and "        -1,2" in diff, diff
    same = cli("diff", "@2", "@2", workspace=workspace)
    assert "no names differ; no tracked file differs" in same, same

    shown_json = json.loads(cli("show", "@2", "--json", workspace=workspace))
    [change] = shown_json["files"]
    assert change["path"] == "out.csv" and change["change"] == "changed"
    assert (change["before"], change["after"]) == (8, 12)
    assert "+4,5" in change["diff"] and change["note"] is None
    diff_json = json.loads(cli("diff", "@1", "@2", "--json", workspace=workspace))
    assert [(c["path"], c["change"]) for c in diff_json["files"]] == [("out.csv", "changed")]
    log_json = json.loads(cli("log", "--json", workspace=workspace))
    files = {entry["op"]: entry["files"] for entry in log_json["snapshots"]}
    assert files[1] == {"added": ["out.csv"], "changed": [], "deleted": []}
    assert files[2] == {"added": [], "changed": ["out.csv"], "deleted": []}


def test_binary_and_large_files_say_so(kernel: Any) -> None:
    committed(kernel, 'import kernos.files\n'
                      'kernos.files.path("b.bin").write_bytes(bytes(range(256)))\n'
                      'kernos.files.path("big.txt").write_text("x" * 70000)')
    shown = committed(kernel, "%kernos show").stdout
    assert "+ b.bin  (256 B)  binary: no text diff" in shown, shown
    assert "+ big.txt  (70.0 kB)  larger than 64 KiB: no text diff" in shown, shown


def test_track_commits_a_directory_and_untrack_stops_it(
        kernel_factory: Callable[..., Any], tmp_path: Path) -> None:
    kernel = kernel_factory()
    data = tmp_path / "data"
    data.mkdir()
    (data / "before.txt").write_text("there before\n")
    committed(kernel, f"%cd {tmp_path}")
    said = committed(kernel, "%kernos track data").stdout
    assert f"Tracking {data} as 'data'" in said, said

    listing = committed(kernel, "%kernos track").stdout.splitlines()
    assert listing[0].split() == ["key", "directory", "files", "size"], listing
    assert listing[1].split()[0] == "files", listing  # the files root first
    assert listing[1].split()[1] == str(kernel.workspace / "files"), listing
    assert listing[2].split() == ["data", str(data), "1", "13", "B"], listing

    wrote = committed(kernel, f"open({str(data / 'new.txt')!r}, 'w').write('hello\\n')")
    assert wrote.kernos.get("files") == {"added": ["data:new.txt"]}, wrote.kernos
    shown = committed(kernel, "%kernos show HEAD").stdout
    assert "+ data:new.txt  (6 B)" in shown and "+hello" in shown, (
        shown, committed(kernel, "%kernos log 5").stdout)

    # A failing cell's write into the tracked directory vanishes.
    failed = kernel.run(f"open({str(data / 'stray.txt')!r}, 'w').write('x')\n1 / 0")
    assert failed.rolled_back, failed.kernos
    assert not (data / "stray.txt").exists()
    assert (data / "new.txt").read_text() == "hello\n"

    # The list is image state: after kill -9 the next kernel lists it, as committed.
    kernel.kill9()
    kernel = kernel_factory(kernel.workspace)
    listing = committed(kernel, "%kernos track").stdout.splitlines()
    assert listing[2].split() == ["data", str(data), "2", "19", "B"], listing

    said = committed(kernel, f"%kernos untrack {data}").stdout
    assert f"Stopped tracking {data}" in said, said
    assert "data" not in committed(kernel, "%kernos track").stdout.split()
    failed = kernel.run(f"open({str(data / 'after.txt')!r}, 'w').write('kept')\n1 / 0")
    assert failed.rolled_back, failed.kernos
    assert (data / "after.txt").read_text() == "kept"  # no longer tracked: left alone


def test_a_tracking_cell_that_fails_tracks_nothing(kernel: Any, tmp_path: Path) -> None:
    data = tmp_path / "d"
    data.mkdir()
    failed = kernel.run(f"%kernos track {data}\n1 / 0")
    assert failed.rolled_back, failed.kernos
    listing = committed(kernel, "%kernos track").stdout
    assert str(data) not in listing, listing


def test_bad_paths_are_refused_and_change_nothing(kernel: Any, tmp_path: Path) -> None:
    data = tmp_path / "outer" / "data"
    (data / "sub").mkdir(parents=True)
    (tmp_path / "a-file").write_text("x")
    committed(kernel, f"%kernos track {data}")
    before = committed(kernel, "%kernos track").stdout
    head_before = committed(kernel, "%kernos log 1").stdout.splitlines()[1].split()[:2]
    checks = [
        (f"%kernos track {tmp_path / 'nowhere'}", "UsageError", "does not exist"),
        (f"%kernos track {tmp_path / 'a-file'}", "PathRefused", "it is not a directory"),
        (f"%kernos track {data / 'sub'}", "PathRefused", f"overlaps the tracked directory {data}"),
        (f"%kernos track {tmp_path / 'outer'}", "PathRefused",
         f"overlaps the tracked directory {data}"),
        (f"%kernos track {tmp_path}", "PathRefused", "inside, the workspace"),
        (f"%kernos track {kernel.workspace}", "PathRefused", "inside, the workspace"),
        (f"%kernos track {kernel.workspace / 'history.git'}", "PathRefused", "the workspace"),
        (f"%kernos untrack {kernel.workspace / 'files'}", "UsageError", "always tracked"),
        (f"%kernos untrack {tmp_path / 'nowhere'}", "UsageError", "is not a tracked directory"),
        (f"%kernos track {data} {data}", "UsageError", "wrong arguments"),
    ]
    for code, ename, fragment in checks:
        result = fails(kernel, code, ename, fragment)
        assert "Traceback" not in error_text(result)
    assert committed(kernel, "%kernos track").stdout == before
    assert committed(kernel, "%kernos log 1").stdout.splitlines()[1].split()[:2] == head_before
    assert "files:" not in cli("log", "-n", "1", workspace=kernel.workspace).splitlines()[1]


def test_help_names_the_file_commands(kernel: Any) -> None:
    shown = committed(kernel, "%kernos help").stdout
    assert "%kernos track [PATH]" in shown and "%kernos untrack PATH" in shown, shown
