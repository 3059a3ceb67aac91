"""I8 erasure: erasing a data subject leaves no byte of it on disk, and history still verifies.

A real kernel tags a value as personal, keeps it in a dict, sends it in an
event and commits more ops around it; the kernel is killed and restored once,
then stopped, and the history is packed (``git gc --aggressive`` and ``git
repack -a -d``), so the value's sealed bytes live in old commits and packfiles.
After ``%kernos erase`` (in a cell) or ``kernos erase`` (from the command line)
a byte scanner finds neither the plaintext nor the subject's key anywhere in
the workspace: not in a file's raw bytes, not in an inflated loose object, not
in any packed object.  The same scanner finds a non-personal canary in the same
workspace, loose and packed, so it is known to work.  The chain still verifies,
an old snapshot still checks out (showing ``personal(<erased>, ...)``), and the
code of the op that created the value is gone from the audit.

Every kernel here gets its own IPYTHONDIR, so the cells' text (which holds the
plaintext) never reaches the user's IPython history.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from agents_support import committed, error_text, fails
from audit_support import (
    Hit,
    cli,
    files_of,
    git,
    key_needles,
    loose_objects,
    scan,
    shut_down,
    verify,
)

if TYPE_CHECKING:
    from conftest import Kernel

pytestmark = pytest.mark.kernel

PLAINTEXT = "Zebulon Quixotic-Marsh 4471"
SUBJECT = "c-77"
CANARY = "Canary-Ophelia-9902"
DIGEST = hashlib.sha256(PLAINTEXT.encode()).hexdigest()
SECRET = {"plaintext": PLAINTEXT.encode(), "surname": b"Quixotic-Marsh"}
ERASED = f"personal(<erased>, subject={SUBJECT!r})"

# name -> cell.  Only the first cell's text holds the plaintext (its code is sealed);
# no other cell may, or the plaintext would be stored in the clear as that cell's code.
CELLS = {
    "create": f"secret = personal({PLAINTEXT!r}, subject={SUBJECT!r})",
    "hold": "holder = {'name': secret, 'n': 1}",
    "emit": "events.emit('customer.created', {'who': secret, 'id': 77})",
    "canary": f"canary = {CANARY!r}",
    "count": "n = 1",
    "count again": "n += 1",
}
DIGESTS = ("(__import__('hashlib').sha256(secret.reveal().encode()).hexdigest(), "
           "__import__('hashlib').sha256(holder['name'].reveal().encode()).hexdigest())")


@dataclass
class Built:
    workspace: Path
    env: dict[str, str]
    ops: dict[str, int]

    @property
    def ipython(self) -> Path:
        return Path(self.env["IPYTHONDIR"])


def own_ipython(tmp_path: Path) -> dict[str, str]:
    return {"IPYTHONDIR": str(tmp_path / "ipython")}


def kinds(hits: list[Hit], needle: str) -> set[str]:
    return {hit.channel for hit in hits if hit.needle == needle}


def key_of(workspace: Path, subject: str) -> tuple[Path, str] | None:
    """The key file of ``subject`` and its key (hex), if it exists."""
    for path in sorted((workspace / "keys").glob("*.key")):
        data = json.loads(path.read_text())
        if data["subject"] == subject:
            return path, data["key"]
    return None


def chain(workspace: Path) -> list[dict[str, Any]]:
    path = workspace / "audit" / "chain.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def sealed_refs(workspace: Path, subject: str) -> set[str]:
    """The audit payloads sealed whole for ``subject``: the code of the ops that tagged its
    values.  (Event payloads keep their other fields; only the values inside are sealed.)"""
    refs = set()
    for record in chain(workspace):
        code = record.get("code") or {}
        if subject in code.get("sealed", []):
            refs.add(code["ref"])
    return refs


def event_payload(kernel: Kernel, topic: str) -> Any:
    (found,) = [event for event in kernel.value("events.since(0)") if event["topic"] == topic]
    return found["payload"]


def build(kernel_factory: Callable[..., Kernel], tmp_path: Path) -> Built:
    """The workspace described in the module docstring, its kernel stopped, its history packed."""
    workspace = tmp_path / "workspace"
    env = own_ipython(tmp_path)
    kernel = kernel_factory(workspace, env)
    ops = {name: committed(kernel, cell).kernos["op"] for name, cell in CELLS.items()}
    assert kernel.value(DIGESTS) == (DIGEST, DIGEST)
    kernel.kill9()

    kernel = kernel_factory(workspace, env)
    assert kernel.value(DIGESTS) == (DIGEST, DIGEST), "restored after kill -9"
    assert kernel.value("repr(secret)") == f"personal(<hidden>, subject={SUBJECT!r})"
    for _ in range(2):
        committed(kernel, "n += 1")
    shut_down(kernel)

    needles = {"canary": CANARY.encode(), **SECRET}
    hits = scan(workspace, needles)
    assert {"packed", "file"} <= kinds(hits, "canary"), hits  # it sees into Kernos's packs
    assert [hit for hit in hits if hit.needle != "canary"] == [], "never on disk in the clear"

    git(workspace, "gc", "--aggressive", "--quiet")
    git(workspace, "repack", "-a", "-d", "-q")
    assert loose_objects(workspace / "history.git") == {}
    assert list((workspace / "history.git" / "objects" / "pack").glob("*.pack"))
    hits = scan(workspace, needles)
    assert "packed" in kinds(hits, "canary"), hits  # the scanner sees inside packfiles
    assert [hit for hit in hits if hit.needle != "canary"] == [], hits
    return Built(workspace, env, ops)


def check_before_erasure(kernel: Kernel, built: Built) -> tuple[str, set[str]]:
    """The value is there and readable; returns the subject's key (hex) and sealed payloads."""
    found = key_of(built.workspace, SUBJECT)
    assert found is not None, "the subject's key file exists under keys/"
    key_path, key_hex = found
    assert kernel.value(DIGESTS) == (DIGEST, DIGEST)
    assert kernel.value("audit.subjects()") == [SUBJECT]
    assert kernel.value(f"audit.code({built.ops['create']})") == CELLS["create"]
    assert event_payload(kernel, "customer.created") == {
        "who": {"$personal": {"subject": SUBJECT, "value": PLAINTEXT}}, "id": 77}
    hits = scan(built.workspace, key_needles(key_hex))
    assert {(hit.needle, hit.channel, hit.where) for hit in hits} == {
        ("key hex", "file", str(key_path.relative_to(built.workspace)))}, hits
    records = {record.get("op"): record for record in chain(built.workspace)
               if record["type"] == "op"}
    create, emit = records[built.ops["create"]], records[built.ops["emit"]]
    assert "text" not in create["code"] and create["code"]["sealed"] == [SUBJECT]
    (event,) = emit["events"]
    assert "payload" not in event and event["subjects"] == [SUBJECT]
    refs = sealed_refs(built.workspace, SUBJECT)
    assert create["code"]["ref"] in refs and event["ref"] not in refs
    assert all((built.workspace / "audit" / "payloads" / ref).is_file() for ref in refs)
    return key_hex, refs


def check_erased_on_disk(built: Built, key_hex: str, refs: set[str]) -> None:
    assert key_of(built.workspace, SUBJECT) is None
    assert not any((built.workspace / "audit" / "payloads" / ref).exists() for ref in refs)
    needles = {"canary": CANARY.encode(), **SECRET, **key_needles(key_hex)}
    hits = scan(built.workspace, needles)
    leaks = [hit for hit in hits if hit.needle != "canary"]
    assert leaks == [], leaks
    assert {"file", "packed"} <= kinds(hits, "canary"), hits  # the scan still sees
    verdict = verify(built.workspace)
    assert verdict.returncode == 0 and verdict.ok, verdict.problems()
    erasures = [record for record in chain(built.workspace) if record["type"] == "erasure"]
    assert [(record["subject"], record["key_destroyed"], set(record["refs"]))
            for record in erasures] == [(SUBJECT, True, refs)]


def check_erased_in_kernel(kernel: Kernel, built: Built) -> None:
    assert kernel.value("repr(secret)") == ERASED
    assert kernel.value("repr(holder)") == f"{{'name': {ERASED}, 'n': 1}}"
    fails(kernel, "secret.reveal()", "ErasedValue", repr(SUBJECT), "erased")
    assert kernel.value(f"audit.code({built.ops['create']})") is None  # it was sealed
    assert kernel.value(f"audit.code({built.ops['hold']})") == CELLS["hold"]  # not sealed
    assert kernel.value("audit.subjects()") == []
    payload = event_payload(kernel, "customer.created")
    assert PLAINTEXT not in json.dumps(payload) and SUBJECT in json.dumps(payload)

    # An old snapshot that held the value still checks out, showing where it was.
    checkout = committed(kernel, f"%kernos checkout @{built.ops['hold']}")
    assert f"Checked out @{built.ops['hold']}" in checkout.stdout
    shown = committed(kernel, "secret\n")
    assert shown.results == [ERASED], shown.results
    assert kernel.value("repr(holder)") == f"{{'name': {ERASED}, 'n': 1}}"
    assert kernel.value("('canary' in globals(), 'n' in globals())") == (False, False)
    fails(kernel, "holder['name'].reveal()", "ErasedValue", repr(SUBJECT))


# -- erasure, through a cell and from the command line -------------------------------------

@pytest.mark.slow
def test_erase_in_a_cell_leaves_no_byte_of_the_subject(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    built = build(kernel_factory, tmp_path)
    kernel = kernel_factory(built.workspace, built.env)
    key_hex, refs = check_before_erasure(kernel, built)

    erased = committed(kernel, f"%kernos erase {SUBJECT}")
    assert re.fullmatch(
        rf"Erased the data subject '{SUBJECT}': key destroyed, {len(refs)} audit payload\(s\) "
        r"deleted, "
        r"[1-9]\d* live value\(s\) now erased; audit record \d+\. This cannot be undone\.\n",
        erased.stdout), erased.stdout
    check_erased_on_disk(built, key_hex, refs)
    check_erased_in_kernel(kernel, built)

    # A restore after kill -9 shows the erased value too, and nothing came back on disk.
    kernel.kill9()
    kernel = kernel_factory(built.workspace, built.env)
    assert kernel.value("repr(holder)") == f"{{'name': {ERASED}, 'n': 1}}"
    shut_down(kernel)
    check_erased_on_disk(built, key_hex, refs)


@pytest.mark.slow
def test_erase_from_the_command_line_with_the_kernel_stopped(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    built = build(kernel_factory, tmp_path)
    kernel = kernel_factory(built.workspace, built.env)
    key_hex, refs = check_before_erasure(kernel, built)

    running = cli("erase", "-w", str(built.workspace), SUBJECT)
    assert running.returncode == 2, "the running kernel holds the workspace"
    assert "is in use by" in running.stderr and "Traceback" not in running.stderr
    assert key_of(built.workspace, SUBJECT) is not None
    shut_down(kernel)

    done = cli("erase", "-w", str(built.workspace), SUBJECT)
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(
        rf"Erased the data subject '{SUBJECT}': key destroyed, {len(refs)} audit payload\(s\) "
        r"deleted; "
        r"audit record \d+\.\n", done.stdout), done.stdout
    check_erased_on_disk(built, key_hex, refs)

    kernel = kernel_factory(built.workspace, built.env)
    check_erased_in_kernel(kernel, built)
    shut_down(kernel)
    check_erased_on_disk(built, key_hex, refs)


def test_an_erased_event_payload_keeps_its_other_fields(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    kernel = kernel_factory(tmp_path / "workspace", own_ipython(tmp_path))
    committed(kernel, CELLS["create"])
    committed(kernel, CELLS["emit"])
    assert event_payload(kernel, "customer.created") == {
        "who": {"$personal": {"subject": SUBJECT, "value": PLAINTEXT}}, "id": 77}
    committed(kernel, f"audit.erase({SUBJECT!r})")
    assert event_payload(kernel, "customer.created") == {
        "who": {"$personal": {"subject": SUBJECT, "erased": True}}, "id": 77}


def test_erasure_leaves_no_plaintext_in_the_kernels_ipython_history(
        kernel_factory: Callable[..., Kernel], tmp_path: Path) -> None:
    built = Built(tmp_path / "workspace", own_ipython(tmp_path), {})
    kernel = kernel_factory(built.workspace, built.env)
    committed(kernel, CELLS["create"])
    committed(kernel, f"%kernos erase {SUBJECT}")
    shut_down(kernel)
    assert built.ipython.is_dir()
    assert scan(built.workspace, SECRET) == []
    assert scan(built.ipython, SECRET) == []


# -- bad input changes nothing -------------------------------------------------------------

@pytest.fixture
def small(kernel_factory: Callable[..., Kernel], tmp_path: Path) -> Built:
    """A workspace with one personal value (op 1) and an event holding it (op 2), stopped."""
    built = Built(tmp_path / "workspace", own_ipython(tmp_path), {})
    kernel = kernel_factory(built.workspace, built.env)
    built.ops = {name: committed(kernel, CELLS[name]).kernos["op"] for name in ("create", "emit")}
    shut_down(kernel)
    return built


def test_erasing_an_unknown_subject_from_the_command_line_changes_nothing(small: Built) -> None:
    before = files_of(small.workspace)
    done = cli("erase", "-w", str(small.workspace), "c-404")
    assert done.returncode == 2 and done.stdout == ""
    message = done.stderr.strip()
    assert len(message.splitlines()) == 1 and "Traceback" not in message
    assert "'c-404'" in message and "nothing to erase" in message, message
    assert f"'{SUBJECT}'" in message, "it names the subjects there are"
    assert "Nothing was changed" in message
    after = files_of(small.workspace)
    assert sorted(after) == sorted(before)
    assert [name for name in before if before[name] != after[name]] == []


def test_erasing_an_unknown_subject_in_a_cell(kernel_factory: Callable[..., Kernel],
                                              small: Built) -> None:
    kernel = kernel_factory(small.workspace, small.env)
    keys_and_payloads = {name: data for name, data in files_of(small.workspace).items()
                         if name.startswith(("keys/", "audit/payloads/"))}
    result = fails(kernel, "%kernos erase c-404", "UnknownSubject", "'c-404'",
                   "nothing to erase", f"'{SUBJECT}'")
    assert "Traceback" not in result.errors[-1]["evalue"]
    assert {name: data for name, data in files_of(small.workspace).items()
            if name.startswith(("keys/", "audit/payloads/"))} == keys_and_payloads
    assert kernel.value("audit.records(type='erasure')") == []
    assert kernel.value("audit.subjects()") == [SUBJECT]
    assert kernel.value("__import__('hashlib').sha256(secret.reveal().encode()).hexdigest()") \
        == DIGEST


def test_erasing_twice_is_a_clear_error(kernel_factory: Callable[..., Kernel],
                                        small: Built) -> None:
    kernel = kernel_factory(small.workspace, small.env)
    committed(kernel, f"%kernos erase {SUBJECT}")
    result = fails(kernel, f"%kernos erase {SUBJECT}", "UsageError", f"{SUBJECT!r}",
                   "already erased")
    assert "nothing left to erase" in error_text(result)
    assert kernel.value("[r['subject'] for r in audit.records(type='erasure')]") == [SUBJECT]
    # The failed cell has its own record, and no second erasure record was written.
    last_failure = kernel.value("audit.records(status='failed', limit=1)[0]['error']")
    assert last_failure["kind"] == "UsageError" and "already erased" in last_failure["message"]
    shut_down(kernel)

    before = files_of(small.workspace)
    done = cli("erase", "-w", str(small.workspace), SUBJECT)
    assert done.returncode == 2 and "already erased" in done.stderr, done.stderr
    assert files_of(small.workspace) == before


@pytest.mark.parametrize("subject", ["", "has space", "-leading-dash", "x" * 129, "ü-1"])
def test_an_invalid_subject_is_a_clear_error(small: Built, subject: str) -> None:
    before = files_of(small.workspace)
    done = cli("erase", "-w", str(small.workspace), "--", subject)
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    assert "a data subject is an id of 1-128 characters" in done.stderr, done.stderr
    assert files_of(small.workspace) == before


def test_invalid_subjects_and_unsealable_values_in_cells(kernel_factory: Callable[..., Kernel],
                                                         tmp_path: Path) -> None:
    kernel = kernel_factory(tmp_path / "workspace", own_ipython(tmp_path))
    fails(kernel, "audit.erase('not a subject!')", "UsageError",
          "a data subject is an id of 1-128 characters")
    fails(kernel, "audit.erase(42)", "UsageError", "a data subject is an id")
    fails(kernel, "p = personal('x', subject='has space')", "UsageError",
          "a data subject is an id")
    result = fails(kernel, "import threading\np = personal(threading.Lock(), subject='c-1')",
                   "UsageError", "personal() holds plain data", "cannot be sealed")
    assert "lock" in result.errors[-1]["evalue"].lower()
    assert kernel.value("('p' in globals(), 'threading' in globals())") == (False, False)
    keys = tmp_path / "workspace" / "keys"
    assert not keys.exists() or not list(keys.glob("*.key")), "nothing was sealed"
    assert kernel.value("audit.subjects()") == []

    # The inner value is made before the outer call fails: the failed op's code is sealed.
    fails(kernel, "p = personal(personal(1, subject='c-1'), subject='c-1')", "UsageError",
          "wrap the plain value once")
    code = kernel.value("audit.records(status='failed', limit=1)[0]['code']")
    assert code["sealed"] == ["c-1"] and "text" not in code
    assert kernel.value("'p' in globals()") is False
