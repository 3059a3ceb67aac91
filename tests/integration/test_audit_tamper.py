"""I6 tamper evidence: every kind of tampering is caught by ``kernos audit verify``.

One workspace is written by a real kernel (commits, failures, a denied agent op,
events, a personal value) and shut down cleanly.  Each test tampers with a copy
of it the way someone with write access to the directory could, then runs
``kernos audit verify --json`` in a separate process: exit status 1, and the
first bad record named is the one tampered with.  The untouched workspace is
the control: it verifies (exit 0), and so does its own head as an anchor.
"""

from __future__ import annotations

import json
import shutil
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from audit_support import (
    Verdict,
    chain_lines,
    cli,
    files_of,
    git,
    git_succeeds,
    kernel_class,
    loose_objects,
    objects_reached,
    resealed,
    shut_down,
    verify,
    write_chain_lines,
    writer_key,
)
from kernos.audit import record_hash
from kernos.store.maintenance import loosen

if TYPE_CHECKING:
    from conftest import Kernel

pytestmark = pytest.mark.kernel

# Each cell writes the record whose index is its position + 1 (record 0 is genesis).
CELLS = [
    ("x = 1", "committed"),                                                         # 1
    ("y = [1, 2]", "committed"),                                                    # 2
    ("1/0", "failed"),                                                              # 3
    ("events.emit('orders.created', {'id': 1})\nz = 'zed'", "committed"),           # 4
    ("%kernos agent add bob", "committed"),                                         # 5
    ("%%agent bob\nread('x')", "denied"),                                           # 6
    ("me = personal('Ada Example', subject='c-1')", "committed"),                   # 7
    ("x = 2\nevents.emit('orders.paid', {'id': 1, 'amount': 5})", "committed"),     # 8
    ("w = 5", "committed"),                                                         # 9
    ("1/0", "failed"),                                                              # 10
    ("%%agent bob\nread('w')", "denied"),                                           # 11
]
Y, FAILED, AGENT_ADD, DENIED, PERSONAL, PAID, LAST_COMMIT = 2, 3, 5, 6, 7, 8, 9
RECORDS = len(CELLS) + 1
COMMITTED = [number for number, (_, status) in enumerate(CELLS, start=1)
             if status == "committed"]


@dataclass(frozen=True)
class Pristine:
    workspace: Path
    records: list[dict[str, Any]]
    control: Verdict

    @property
    def head(self) -> str:
        return str(self.control.report["head"])

    def copy(self, into: Path) -> Path:
        target = into / "copy"
        shutil.copytree(self.workspace, target)
        return target


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Pristine:
    workspace = tmp_path_factory.mktemp("audit") / "workspace"
    kernel = kernel_class()(workspace)
    try:
        for number, (cell, status) in enumerate(CELLS, start=1):
            result = kernel.run(cell)
            assert result.kernos["audit"]["index"] == number, (cell, result.kernos)
            assert (result.status == "ok") is (status == "committed"), (cell, result.errors)
    finally:
        shut_down(kernel)
    records = [json.loads(line) for line in chain_lines(workspace)]
    assert [record["index"] for record in records] == list(range(RECORDS))
    assert [record.get("status") for record in records[1:]] == [s for _, s in CELLS]
    assert records[DENIED]["principal"] == "bob" and records[DENIED]["grants"]["denied"]
    assert records[PERSONAL]["code"]["sealed"] == ["c-1"]
    assert records[4]["events"] and records[PAID]["events"]
    # The trailing records after the last commit are what only an anchor protects.
    assert all(records[i]["status"] != "committed" for i in range(LAST_COMMIT + 1, RECORDS))
    control = verify(workspace)
    assert control.returncode == 0 and control.ok, control.problems()
    return Pristine(workspace, records, control)


def tampered(verdict: Verdict, first_bad: int, *fragments: str) -> None:
    """verify exited 1 and named ``first_bad`` first, in words containing ``fragments``."""
    assert verdict.returncode == 1, verdict.report
    assert verdict.ok is False
    assert verdict.first_bad == first_bad, verdict.problems()
    first = verdict.report["problems"][0]
    assert first["index"] == first_bad
    for fragment in fragments:
        assert fragment in first["what"], verdict.problems()


def flip_bit(line: bytes, offset: int, bit: int = 0) -> bytes:
    return line[:offset] + bytes([line[offset] ^ (1 << bit)]) + line[offset + 1:]


# -- the control ----------------------------------------------------------------------------

def test_untouched_workspace_verifies_in_a_separate_process(pristine: Pristine) -> None:
    report = pristine.control.report
    last_hash = pristine.records[-1]["hash"]
    assert report["head"] == f"{RECORDS - 1}:{last_hash}"
    assert report["records"] == RECORDS and report["commits"] == len(COMMITTED)
    assert report["first_bad"] is None and report["problems"] == []
    assert report["objects"] > 2 * len(COMMITTED)  # a commit, a tree and blobs per snapshot

    text = cli("audit", "verify", "-w", str(pristine.workspace))
    assert text.returncode == 0, text.stdout + text.stderr
    first, second = text.stdout.splitlines()[:2]
    assert first.startswith(f"ok: {RECORDS} records, {len(COMMITTED)} snapshots")
    assert second == f"head {pristine.head}"

    anchored = verify(pristine.workspace, anchor=pristine.head)
    assert anchored.returncode == 0 and anchored.ok, anchored.problems()
    older = f"{AGENT_ADD}:{pristine.records[AGENT_ADD]['hash']}"
    assert verify(pristine.workspace, anchor=older).ok


@pytest.mark.parametrize("path", ["missing", "plain-directory"])
def test_verify_on_a_path_that_is_not_a_workspace_exits_2(tmp_path: Path, path: str) -> None:
    target = tmp_path / path
    if path == "plain-directory":
        target.mkdir()
        (target / "notes.txt").write_text("not a workspace")
    for extra in ([], ["--json"]):
        done = cli("audit", "verify", "-w", str(target), *extra)
        assert done.returncode == 2, (done.stdout, done.stderr)
        if extra:  # machines get the error as a JSON document too
            error = json.loads(done.stdout)["error"]
            assert error["exit"] == 2 and error["kind"] == "workspace"
        else:
            assert done.stdout == ""
        message = done.stderr.strip()
        assert len(message.splitlines()) == 1 and "Traceback" not in message
        assert str(target) in message
        assert ("does not exist" if path == "missing" else "is not a Kernos workspace") in message
    if path == "plain-directory":
        assert sorted(p.name for p in target.iterdir()) == ["notes.txt"]  # nothing created


def test_a_malformed_anchor_is_a_usage_error_not_tampering(pristine: Pristine) -> None:
    done = cli("audit", "verify", "-w", str(pristine.workspace), "--anchor", "5:abc")
    assert done.returncode == 2, done.stdout
    assert "INDEX:HASH" in done.stderr


def test_since_verifies_after_an_anchor_and_only_there(pristine: Pristine,
                                                      tmp_path: Path) -> None:
    """``--since INDEX:HASH``: the records after the anchor, their snapshots and the branch;
    what lies before the anchor is not read, and the output says so."""
    since = f"{AGENT_ADD}:{pristine.records[AGENT_ADD]['hash']}"
    anchored = verify(pristine.workspace, since=since)
    assert anchored.returncode == 0, anchored.problems()
    report = anchored.report
    assert report["since"] == AGENT_ADD and report["head"] == pristine.head
    assert report["verified"] == {"first": AGENT_ADD + 1, "last": RECORDS - 1}
    assert report["range"] == f"records {AGENT_ADD + 1}..{RECORDS - 1}, after the anchor at " \
                              f"{AGENT_ADD}"
    assert report["commits"] == len([n for n in COMMITTED if n > AGENT_ADD])
    text = cli("audit", "verify", "-w", str(pristine.workspace), "--since", since)
    assert text.returncode == 0 and text.stdout.startswith(
        f"ok: records {AGENT_ADD + 1}..{RECORDS - 1}, after the anchor at {AGENT_ADD}")
    assert f"records 0..{AGENT_ADD} were not read" in text.stdout

    before = pristine.copy(tmp_path / "before")
    lines = chain_lines(before)
    lines[Y] = flip_bit(lines[Y], lines[Y].index(b'"principal"') + 13)  # human -> iuman
    write_chain_lines(before, lines)
    outside = verify(before, since=since)
    assert outside.returncode == 0 and "outside the range" in outside.report["not_read"]
    tampered(verify(before), Y, "hash does not match")

    after = pristine.copy(tmp_path / "after")
    lines = chain_lines(after)
    lines[PAID] = flip_bit(lines[PAID], lines[PAID].index(b'"principal"') + 13)
    write_chain_lines(after, lines)
    tampered(verify(after, since=since), PAID, "hash does not match")

    wrong = f"{AGENT_ADD}:{pristine.records[AGENT_ADD - 1]['hash']}"
    tampered(verify(pristine.workspace, since=wrong), AGENT_ADD, "differs from the anchor")
    beyond = verify(pristine.workspace, since=f"{RECORDS + 5}:{'0' * 64}")
    tampered(beyond, RECORDS, "is gone")
    malformed = cli("audit", "verify", "-w", str(pristine.workspace), "--since", "5:abc")
    assert malformed.returncode == 2 and "INDEX:HASH" in malformed.stderr


# -- the chain itself -------------------------------------------------------------------------

@pytest.mark.parametrize("index", [0, 1, FAILED, DENIED, LAST_COMMIT, RECORDS - 1])
@pytest.mark.parametrize("keeps_json", [True, False], ids=["valid-json", "broken-json"])
def test_one_flipped_bit_in_a_record(pristine: Pristine, tmp_path: Path, index: int,
                                     keeps_json: bool) -> None:
    copy = pristine.copy(tmp_path)
    lines = chain_lines(copy)
    at = lines[index].index(b'"at":"')
    # A digit of the year inside the "at" string ('2' -> '3'), or the ':' after "at" (-> ';').
    offset = at + 6 if keeps_json else at + 4
    lines[index] = flip_bit(lines[index], offset)
    write_chain_lines(copy, lines)
    if keeps_json:
        assert json.loads(lines[index])["index"] == index
    else:
        with pytest.raises(ValueError):
            json.loads(lines[index])
    tampered(verify(copy), index, "hash" if keeps_json else "not valid JSON")


@pytest.mark.parametrize("index", [1, FAILED, AGENT_ADD, DENIED, LAST_COMMIT])
def test_a_deleted_record(pristine: Pristine, tmp_path: Path, index: int) -> None:
    copy = pristine.copy(tmp_path)
    lines = chain_lines(copy)
    del lines[index]
    write_chain_lines(copy, lines)
    tampered(verify(copy), index, "deleted")


@pytest.mark.parametrize("index", [1, FAILED, DENIED, LAST_COMMIT, RECORDS - 2])
def test_two_adjacent_records_swapped(pristine: Pristine, tmp_path: Path, index: int) -> None:
    copy = pristine.copy(tmp_path)
    lines = chain_lines(copy)
    lines[index], lines[index + 1] = lines[index + 1], lines[index]
    write_chain_lines(copy, lines)
    tampered(verify(copy), index, "reordered")


EMPTIED = pytest.param(RECORDS, id="all")


@pytest.mark.parametrize("dropped", [RECORDS - LAST_COMMIT, RECORDS - PAID, RECORDS - 1, EMPTIED])
def test_truncation_that_removes_a_committed_op(pristine: Pristine, tmp_path: Path,
                                                dropped: int) -> None:
    """The branch still has the snapshots of the removed committed ops: verify names the
    first missing record, whose index is the number of records left."""
    copy = pristine.copy(tmp_path)
    write_chain_lines(copy, chain_lines(copy)[:-dropped])
    tampered(verify(copy), RECORDS - dropped, "no audit record", "truncated")


@pytest.mark.parametrize("dropped", [1, RECORDS - 1 - LAST_COMMIT])
def test_truncation_after_the_last_commit_needs_an_anchor(pristine: Pristine, tmp_path: Path,
                                                          dropped: int) -> None:
    """Records after the last commit (here a failure and a denial) are bound by no
    snapshot: the chain that remains is a valid chain, so WITHOUT an anchor the
    truncation cannot be detected (verify passes; that is the documented limit).
    With the head digest taken before truncating, ``--anchor INDEX:HASH`` catches it
    and names the first missing record."""
    copy = pristine.copy(tmp_path)
    write_chain_lines(copy, chain_lines(copy)[:-dropped])
    unanchored = verify(copy)
    assert unanchored.returncode == 0, unanchored.problems()
    tampered(verify(copy, anchor=pristine.head), RECORDS - dropped, "truncated")


@pytest.mark.parametrize("index", [Y, AGENT_ADD, PAID])
def test_a_forged_record_inserted(pristine: Pristine, tmp_path: Path, index: int) -> None:
    """A self-consistent record (right index, prev and hash) slipped in between two
    commits: the next snapshot bound the hash that was there, so verify names it."""
    copy = pristine.copy(tmp_path)
    lines = chain_lines(copy)
    before = pristine.records[index - 1]
    forged = {**pristine.records[FAILED], "index": index, "prev": before["hash"],
              "op": 99, "principal": "mallory", "at": before["at"]}
    line = resealed(forged, writer_key(copy))
    assert record_hash(json.loads(line)) == json.loads(line)["hash"]  # it looks genuine
    lines.insert(index, line)
    write_chain_lines(copy, lines)
    tampered(verify(copy), index, "bound")


def test_a_forged_record_inserted_after_the_last_commit(pristine: Pristine,
                                                        tmp_path: Path) -> None:
    """No snapshot bound the records after the last commit, and the forged record and the
    genuine one it pushed down claim the same index and prev: the chain cannot tell which
    is the intruder, so verify names the displaced genuine record (one further on)."""
    copy = pristine.copy(tmp_path)
    lines = chain_lines(copy)
    index = RECORDS - 1
    forged = {**pristine.records[FAILED], "index": index,
              "prev": pristine.records[index - 1]["hash"], "op": 99, "principal": "mallory"}
    lines.insert(index, resealed(forged, writer_key(copy)))
    write_chain_lines(copy, lines)
    tampered(verify(copy), index + 1, "inserted")


@pytest.mark.parametrize("index", [FAILED, DENIED, PERSONAL])
def test_a_consistently_rewritten_suffix(pristine: Pristine, tmp_path: Path,
                                         index: int) -> None:
    """Record ``index`` gets another principal and every record from it on is re-hashed
    and re-linked, so the chain alone is flawless; the snapshot of the next committed op
    bound the original hashes, so verify still names ``index``."""
    copy = pristine.copy(tmp_path)
    records = [dict(record) for record in pristine.records]
    records[index]["principal"] = "human" if records[index]["principal"] == "bob" else "bob"
    lines = chain_lines(copy)
    for position in range(index, RECORDS):
        records[position]["prev"] = records[position - 1]["hash"]
        lines[position] = resealed(records[position], writer_key(copy))
        records[position] = json.loads(lines[position])
    write_chain_lines(copy, lines)
    assert all(record_hash(record) == record["hash"] and record["prev"] == previous["hash"]
               for previous, record in pairwise(records))
    tampered(verify(copy), index)


def test_a_rewritten_suffix_after_the_last_commit_needs_an_anchor(pristine: Pristine,
                                                                  tmp_path: Path) -> None:
    """The denial after the last commit is rewritten as the human's and the chain re-hashed:
    no snapshot bound it, so only the anchor (the old head) shows the log was rewritten."""
    copy = pristine.copy(tmp_path)
    records = [dict(record) for record in pristine.records]
    last = RECORDS - 1
    records[last]["principal"] = "human"
    lines = chain_lines(copy)
    lines[last] = resealed(records[last], writer_key(copy))
    write_chain_lines(copy, lines)
    assert verify(copy).returncode == 0
    tampered(verify(copy, anchor=pristine.head), last, "anchor")


# -- the snapshots and the history -------------------------------------------------------------

def first_reaching(pristine: Pristine, copy: Path, sha: str) -> int:
    """The first committed record whose snapshot reaches object ``sha``."""
    for number in COMMITTED:
        if sha in objects_reached(copy, pristine.records[number]["commit"]):
            return number
    raise AssertionError(f"no snapshot reaches {sha}")


def rewrite_loose(copy: Path, sha: str, change: Callable[[bytes], bytes]) -> None:
    loosen(copy / "history.git")
    path = loose_objects(copy / "history.git")[sha]
    raw = zlib.decompress(path.read_bytes())
    header, _, body = raw.partition(b"\0")
    kind = header.split(b" ")[0]
    new = change(body)
    assert new != body
    path.chmod(0o644)
    path.write_bytes(zlib.compress(b"%s %d\0" % (kind, len(new)) + new))


def flip_second_last_byte(body: bytes) -> bytes:
    return body[:-2] + bytes([body[-2] ^ 1]) + body[-1:]


def rename_principal(body: bytes) -> bytes:
    return body.replace(b'"principal":"human"', b'"principal":"humam"')


def rename_entry_x(body: bytes) -> bytes:
    assert body.count(b" x\0") == 1  # a tree entry is "MODE NAME\0SHA"
    return body.replace(b" x\0", b" q\0")


def flip_first_byte(body: bytes) -> bytes:
    return bytes([body[0] ^ 1]) + body[1:]


# target -> (the record whose commit holds it, its path in that commit, how it is changed)
LOOSE_TARGETS: dict[str, tuple[int, str, Callable[[bytes], bytes]]] = {
    "value of y": (Y, "ns/y/s.000000", flip_second_last_byte),
    "manifest of op 4": (4, "kernos.json", rename_principal),
    "ns tree of op 8": (PAID, "ns", rename_entry_x),
    "sealed value of me": (PERSONAL, "ns/me/s.000000", flip_first_byte),
}


@pytest.mark.parametrize("target", sorted(LOOSE_TARGETS))
def test_a_modified_loose_object(pristine: Pristine, tmp_path: Path, target: str) -> None:
    """The object's file is rewritten with other (well-formed, zlib-compressed) content: the
    first record whose snapshot reaches it is named, with the object's id."""
    copy = pristine.copy(tmp_path)
    number, path, change = LOOSE_TARGETS[target]
    sha = git(copy, "rev-parse", f"{pristine.records[number]['commit']}:{path}").strip()
    expected = first_reaching(pristine, copy, sha)
    rewrite_loose(copy, sha, change)
    verdict = verify(copy)
    tampered(verdict, expected)
    assert any(sha[:12] in problem["what"] and problem["index"] == expected
               for problem in verdict.report["problems"]), verdict.problems()


def corrupt_packed(pristine: Pristine, copy: Path, target: str) -> tuple[str, int]:
    """Pack everything, flip one byte inside one object's packed data; (its id, the record
    whose snapshot reaches it first)."""
    git(copy, "gc", "--quiet")
    git(copy, "repack", "-a", "-d", "-q")
    assert loose_objects(copy / "history.git") == {}, "everything should be packed"
    assert verify(copy).ok, "packing alone must not upset verify"
    if target == "value of y":
        sha = git(copy, "rev-parse", f"{pristine.records[Y]['commit']}:ns/y/s.000000").strip()
    else:
        sha = pristine.records[AGENT_ADD]["commit"]
    (index,) = (copy / "history.git" / "objects" / "pack").glob("*.idx")
    listing = git(copy, "verify-pack", "-v", str(index))
    (row,) = [line.split() for line in listing.splitlines() if line.startswith(sha)]
    assert len(row) == 5, f"{sha} is stored as a delta: {row}"  # whole, so the damage is its own
    expected = first_reaching(pristine, copy, sha)
    size_in_pack, offset = int(row[3]), int(row[4])
    pack = index.with_suffix(".pack")
    data = bytearray(pack.read_bytes())
    data[offset + size_in_pack // 2 + 1] ^= 0x10
    pack.chmod(0o644)
    pack.write_bytes(bytes(data))
    assert not git_succeeds(copy, "fsck", "--full"), "git itself must see the damage"
    return sha, expected


@pytest.mark.parametrize("target", ["value of y", "commit of op 5"])
def test_a_flipped_byte_in_a_packfile(pristine: Pristine, tmp_path: Path, target: str) -> None:
    """After ``git gc`` / ``git repack -a -d`` no object is loose; one byte flipped inside a
    packed object is found, at the first record whose snapshot reaches that object."""
    copy = pristine.copy(tmp_path)
    sha, expected = corrupt_packed(pristine, copy, target)
    verdict = verify(copy)
    assert verdict.returncode == 1 and not verdict.ok
    assert verdict.first_bad == expected, verdict.problems()
    assert any(sha[:12] in problem["what"] for problem in verdict.report["problems"]
               if problem["index"] == expected), verdict.problems()


def test_one_corrupt_packed_object_does_not_make_other_snapshots_missing(
        pristine: Pristine, tmp_path: Path) -> None:
    copy = pristine.copy(tmp_path)
    sha, expected = corrupt_packed(pristine, copy, "value of y")
    verdict = verify(copy)
    assert verdict.first_bad == expected
    for number in COMMITTED:
        commit = pristine.records[number]["commit"]
        assert git(copy, "cat-file", "-t", commit).strip() == "commit"  # git reads it
    wrong = [problem for problem in verdict.report["problems"]
             if problem["index"] != expected or sha[:12] not in problem["what"]]
    assert wrong == [], verdict.problems()


def test_history_rewritten_at_the_head(pristine: Pristine, tmp_path: Path) -> None:
    """A new commit with the head's tree and another message replaces the head."""
    copy = pristine.copy(tmp_path)
    head = git(copy, "rev-parse", "main").strip()
    assert head == pristine.records[LAST_COMMIT]["commit"]
    forged = git(copy, "commit-tree", f"{head}^{{tree}}", "-p", f"{head}^",
                 "-m", "op 9 by human: nothing to see").strip()
    git(copy, "update-ref", "refs/heads/main", forged, head)
    tampered(verify(copy), LAST_COMMIT, "rewritten")


def test_history_rewritten_from_the_middle_and_pruned(pristine: Pristine,
                                                      tmp_path: Path) -> None:
    """Commits from op 4's on are rebuilt with other messages and the originals pruned:
    the first record whose snapshot is gone is op 4's."""
    copy = pristine.copy(tmp_path)
    parent = pristine.records[Y]["commit"]
    for number in COMMITTED[COMMITTED.index(4):]:
        original = pristine.records[number]["commit"]
        parent = git(copy, "commit-tree", f"{original}^{{tree}}", "-p", parent,
                     "-m", f"rewritten {number}").strip()
    git(copy, "update-ref", "refs/heads/main", parent)
    git(copy, "reflog", "expire", "--expire=now", "--all")
    git(copy, "gc", "--prune=now", "--quiet")
    assert git(copy, "cat-file", "-t", pristine.records[4]["commit"], check=False) == ""
    tampered(verify(copy), 4, "missing")


def test_a_commit_appended_without_a_record(pristine: Pristine, tmp_path: Path) -> None:
    copy = pristine.copy(tmp_path)
    head = git(copy, "rev-parse", "main").strip()
    sneaky = git(copy, "commit-tree", f"{head}^{{tree}}", "-p", head,
                 "-m", "op 12 by human: unrecorded").strip()
    git(copy, "update-ref", "refs/heads/main", sneaky, head)
    tampered(verify(copy), RECORDS, "no audit record")


# -- a damaged log stops the next kernel, and loses nothing -----------------------------------

@pytest.mark.parametrize("damage", ["garbage line in the middle", "garbage line at the end",
                                    "last record altered"])
def test_a_damaged_log_makes_a_new_kernel_refuse_ops(
        pristine: Pristine, tmp_path: Path, kernel_factory: Callable[..., Kernel],
        damage: str) -> None:
    copy = pristine.copy(tmp_path)
    lines = chain_lines(copy)
    if damage == "garbage line in the middle":
        bad = AGENT_ADD
        lines[bad] = b"this is not a record"
    elif damage == "garbage line at the end":
        bad = RECORDS
        lines.append(b"{garbage")
    else:
        bad = RECORDS - 1
        at = lines[bad].index(b'"at":"')
        lines[bad] = flip_bit(lines[bad], at + 6)
    write_chain_lines(copy, lines)
    before = files_of(copy)

    kernel = kernel_factory(copy)
    for cell in ("x = 99", "print('hello')"):
        result = kernel.run(cell)
        assert result.status == "error" and not result.committed, (cell, result.kernos)
        assert result.kernos["status"] == "rejected", result.kernos
        message = result.errors[-1]["evalue"]
        assert result.errors[-1]["ename"] == "AuditError"
        assert f"the audit log {copy / 'audit' / 'chain.jsonl'}" in message, message
        assert f"record {bad}" in message, message
        assert "hello" not in result.stdout
    shut_down(kernel)

    after = files_of(copy)
    assert sorted(after) == sorted(before)
    changed = [name for name in before if after[name] != before[name]]
    assert changed == [], changed
    tampered(verify(copy), bad)


@pytest.mark.parametrize("how", ["emptied", "deleted"])
def test_a_new_kernel_does_not_whitewash_a_removed_log(
        pristine: Pristine, tmp_path: Path, kernel_factory: Callable[..., Kernel],
        how: str) -> None:
    copy = pristine.copy(tmp_path)
    if how == "emptied":
        write_chain_lines(copy, [])
    else:
        shutil.rmtree(copy / "audit")
    kernel = kernel_factory(copy)
    kernel.run("x = 42")
    shut_down(kernel)
    verdict = verify(copy)
    assert verdict.returncode == 1, verdict.report
    assert verdict.first_bad == 0, verdict.problems()
