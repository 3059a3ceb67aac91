"""verify() on small workspaces built in-process: each kind of tampering names its record."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import types
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from audit_support import reseal
from kernos import Image, Workspace
from kernos.audit import verify
from kernos.audit.canonical import canonical
from kernos.errors import UsageError
from kernos.op import CommitReport
from kernos.store.maintenance import loosen


class Env:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.workspace: Workspace | None = Workspace.open(path)
        self.module = types.ModuleType("__main__")
        self.ns: dict[str, Any] = self.module.__dict__
        self.image = Image(self.workspace, self.ns, module=self.module)
        self.image.restore()

    @property
    def chain(self) -> Path:
        return self.path / "audit" / "chain.jsonl"

    def run(self, source: str, *, principal: str = "human") -> CommitReport:
        op = self.image.begin(source=source, principal=principal)
        exec(compile(source, f"<op {op.id}>", "exec"), self.ns)
        return op.commit()

    def fail(self, source: str) -> int:
        op = self.image.begin(source=source)
        exec(compile(source, f"<op {op.id}>", "exec"), self.ns)
        op.abort(error=("ValueError", "no"))
        return op.id

    def close(self) -> None:
        if self.workspace is not None:
            self.workspace.close()
            self.workspace = None

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.chain.read_bytes().splitlines()]

    def write_records(self, chain: list[dict[str, Any]]) -> None:
        self.chain.write_bytes(b"".join(canonical(record) + b"\n" for record in chain))


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    opened = Env(tmp_path / "ws")
    yield opened
    opened.close()


@pytest.fixture
def built(env: Env) -> Env:
    """Records: genesis 0; committed 1 (x); aborted 2; committed 3 (y, large code);
    aborted 4; committed 5 (by alice)."""
    env.run("x = 'MARKER-of-op-one'\nitems = [1, 2]")
    env.fail("z = 1")
    env.run("y = 2\n# " + "padding " * 700)
    env.fail("w = 1")
    env.run("items.append(3)", principal="alice")
    return env


def test_an_untouched_workspace_verifies_and_prints_its_head(built: Env) -> None:
    report = verify(built.path)  # read-only, while the image holds the lock
    index, digest = built.image.audit.head()
    assert report.ok and report.problems == () and report.first_bad is None
    assert report.head == f"{index}:{digest}" == f"5:{built.records()[-1]['hash']}"
    assert report.records == len(built.image.audit) == 6
    assert report.commits == 3
    assert report.objects > 10
    assert report.summary().splitlines()[-1] == f"head {report.head}"
    assert report.to_json()["ok"] is True
    built.close()
    assert verify(built.path).head == report.head


def test_a_fresh_workspace_verifies(env: Env) -> None:
    report = verify(env.path)
    assert report.ok and report.records == 1 and report.commits == 0


# -- anchors --------------------------------------------------------------------------------


def test_the_anchor_verifies_and_keeps_verifying_as_the_log_grows(built: Env) -> None:
    anchor = verify(built.path).head
    assert verify(built.path, anchor=anchor).ok
    built.run("later = 1")
    built.fail("later_failed = 1")
    assert verify(built.path, anchor=anchor).ok


def test_a_wrong_anchor_names_the_anchored_record(built: Env) -> None:
    index, _ = built.image.audit.head()
    wrong = f"{index}:{'0' * 64}"
    report = verify(built.path, anchor=wrong)
    assert not report.ok and report.first_bad == index
    assert "anchor" in report.problems[0].what
    earlier = f"2:{built.records()[3]['hash']}"  # a real hash, at the wrong index
    assert verify(built.path, anchor=earlier).first_bad == 2


@pytest.mark.parametrize("anchor", ["garbage", "5:abc", "x:" + "0" * 64, ""])
def test_a_malformed_anchor_is_a_usage_error(built: Env, anchor: str) -> None:
    with pytest.raises(UsageError, match="INDEX:HASH"):
        verify(built.path, anchor=anchor)


def test_a_log_truncated_below_the_anchor_fails(built: Env) -> None:
    anchor = verify(built.path).head
    built.close()
    lines = built.chain.read_bytes().splitlines(keepends=True)
    built.chain.write_bytes(b"".join(lines[:3]))
    report = verify(built.path, anchor=anchor)
    assert not report.ok
    assert any("truncated" in problem.what for problem in report.problems)
    assert any(problem.index == 3 and "anchored record 5 is gone" in problem.what
               for problem in report.problems)


def test_a_log_truncated_after_a_commit_fails_even_without_an_anchor(built: Env) -> None:
    built.close()
    lines = built.chain.read_bytes().splitlines(keepends=True)
    built.chain.write_bytes(b"".join(lines[:4]))  # the last commit's record is gone
    report = verify(built.path)
    assert not report.ok
    assert "have no audit record" in report.summary()


# -- rewritten records ----------------------------------------------------------------------


def test_an_edited_record_is_named(built: Env) -> None:
    built.close()
    chain = built.records()
    assert chain[3]["principal"] == "human"
    chain[3]["principal"] = "mallory"  # recompute nothing
    built.write_records(chain)
    report = verify(built.path)
    assert not report.ok and report.first_bad == 3
    assert "hash does not match" in report.problems[0].what
    assert "FAILED: first bad record is 3" in report.summary()


def test_an_edit_that_breaks_canonical_form_is_named(built: Env) -> None:
    built.close()
    lines = built.chain.read_bytes().splitlines(keepends=True)
    record = json.loads(lines[2])
    lines[2] = json.dumps(record, indent=1).replace("\n", " ").encode() + b"\n"
    built.chain.write_bytes(b"".join(lines))
    report = verify(built.path)
    assert report.first_bad == 2
    assert "canonical" in report.problems[0].what


def forge(chain: list[dict[str, Any]], start: int) -> None:
    """Recompute prev and hash from record ``start`` on, as a forger would."""
    for index in range(start, len(chain)):
        if index:
            chain[index]["prev"] = chain[index - 1]["hash"]
        chain[index] = reseal(chain[index])


def test_a_rewritten_suffix_is_caught_by_a_later_snapshot(built: Env) -> None:
    built.close()
    chain = built.records()
    assert chain[2]["status"] == "failed" and chain[5]["status"] == "committed"
    chain[2]["principal"] = "mallory"
    chain[2]["error"] = None
    chain[2]["status"] = "rolled back"
    forge(chain, 2)
    built.write_records(chain)
    report = verify(built.path)
    assert not report.ok
    assert report.first_bad == 2  # the rewritten record, not the snapshot that caught it
    assert "bound when it committed" in report.problems[0].what


def test_a_rewritten_committed_record_is_caught_by_its_own_snapshot(built: Env) -> None:
    built.close()
    chain = built.records()
    chain[5]["principal"] = "human"  # was alice
    forge(chain, 5)
    built.write_records(chain)
    report = verify(built.path)
    assert report.first_bad == 5
    assert "differs from its snapshot" in report.problems[0].what


def test_a_rewritten_suffix_after_the_last_commit_needs_the_anchor(built: Env) -> None:
    anchor = verify(built.path).head
    built.fail("v = 1")  # record 6, after the last commit
    anchor_after = verify(built.path).head
    built.close()
    chain = built.records()
    chain[6]["principal"] = "mallory"
    forge(chain, 6)
    built.write_records(chain)
    # What verify documents it cannot see without an anchor ...
    assert verify(built.path).ok
    assert verify(built.path, anchor=anchor).ok
    # ... and the anchor that closes the gap.
    report = verify(built.path, anchor=anchor_after)
    assert report.first_bad == 6


def test_a_removed_record_is_named(built: Env) -> None:
    built.close()
    lines = built.chain.read_bytes().splitlines(keepends=True)
    del lines[2]
    built.chain.write_bytes(b"".join(lines))
    report = verify(built.path)
    assert report.first_bad == 2
    assert "deleted, inserted or reordered" in report.problems[0].what


def test_a_torn_last_line_is_reported(built: Env) -> None:
    built.close()
    with open(built.chain, "ab") as log:
        log.write(b'{"partial":')
    report = verify(built.path)
    assert report.first_bad == 6 and "incomplete" in report.problems[0].what


# -- payloads and objects -------------------------------------------------------------------


def test_a_payload_deleted_without_an_erasure_is_reported(built: Env) -> None:
    code = built.records()[3]["code"]
    assert "ref" in code
    payload = built.path / "audit" / "payloads" / code["ref"]
    payload.unlink()
    report = verify(built.path)
    assert report.first_bad == 3
    assert "missing (deleted without a recorded erasure)" in report.problems[0].what


def test_a_modified_payload_is_reported(built: Env) -> None:
    code = built.records()[3]["code"]
    payload = built.path / "audit" / "payloads" / code["ref"]
    payload.write_bytes(payload.read_bytes().replace(b"padding", b"PADDING", 1))
    report = verify(built.path)
    assert report.first_bad == 3 and "modified" in report.problems[0].what


def git(path: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(path / "history.git"), *args],
                          capture_output=True, text=True, check=True).stdout


def blob_of(path: Path, commit: str, name: str) -> str:
    for line in git(path, "ls-tree", "-r", commit).splitlines():
        meta, entry = line.split("\t")
        if entry == name:
            return meta.split()[2]
    raise AssertionError(f"{name} not in {commit}")


def rewrite_loose_object(path: Path, sha: str, old: bytes, new: bytes) -> None:
    """Rewrite a loose object so that it decompresses to different content (same length)."""
    assert len(old) == len(new)
    loosen(path / "history.git")
    file = path / "history.git" / "objects" / sha[:2] / sha[2:]
    raw = zlib.decompress(file.read_bytes())
    assert old in raw
    os.chmod(file, stat.S_IRUSR | stat.S_IWUSR)
    file.write_bytes(zlib.compress(raw.replace(old, new)))


def test_a_modified_git_object_names_the_first_snapshot_that_reaches_it(built: Env) -> None:
    built.close()  # git itself reads the history once the tail is folded
    first = built.records()[1]
    sha = blob_of(built.path, first["commit"], "ns/x/s.000000")
    last = built.records()[5]["commit"]
    assert blob_of(built.path, last, "ns/x/s.000000") == sha  # later snapshots share it
    rewrite_loose_object(built.path, sha, b"MARKER-of-op-one", b"MARKER-of-op-ONE")
    report = verify(built.path)
    assert report.first_bad == 1
    assert f"object {sha[:12]}" in report.problems[0].what
    assert "modified" in report.problems[0].what
    assert len(report.problems) == 1  # reported once, at the first snapshot


def test_a_modified_object_only_the_last_snapshot_reaches_names_its_record(built: Env) -> None:
    built.close()  # git itself reads the history once the tail is folded
    last = built.records()[5]["commit"]
    sha = blob_of(built.path, last, "ns/items/s.000000")
    assert blob_of(built.path, built.records()[3]["commit"], "ns/items/s.000000") != sha
    loosen(built.path / "history.git")
    file = built.path / "history.git" / "objects" / sha[:2] / sha[2:]
    raw = zlib.decompress(file.read_bytes())
    os.chmod(file, stat.S_IRUSR | stat.S_IWUSR)
    file.write_bytes(zlib.compress(raw[:-1] + bytes([raw[-1] ^ 1])))
    report = verify(built.path)
    assert report.first_bad == 5
    assert f"object {sha[:12]}" in report.problems[0].what


def test_verify_skips_objects_when_asked(built: Env) -> None:
    built.close()  # git itself reads the history once the tail is folded
    sha = blob_of(built.path, built.records()[1]["commit"], "ns/x/s.000000")
    rewrite_loose_object(built.path, sha, b"MARKER-of-op-one", b"MARKER-of-op-ONE")
    quick = verify(built.path, objects=False)
    assert quick.ok and quick.objects == 0
    assert not verify(built.path).ok


def append_forged_void(env: Env, target: dict[str, Any]) -> None:
    chain = env.records()
    forged = {"v": 1, "at": chain[-1]["at"], "type": "void", "voids": target["index"],
              "op": target["op"], "reason": "forged", "index": len(chain),
              "prev": chain[-1]["hash"], "signer": ""}
    forged = reseal(forged)
    env.write_records([*chain, forged])


def test_a_forged_void_that_hides_a_committed_op_is_detected(built: Env) -> None:
    built.close()
    append_forged_void(built, built.records()[5])  # a chain anyone can extend
    report = verify(built.path)
    assert not report.ok


def test_a_forged_void_is_named(built: Env) -> None:
    built.close()
    append_forged_void(built, built.records()[5])
    assert verify(built.path).first_bad == 6


def test_a_snapshot_binds_at_most_the_newest_hashes(tmp_path: Path) -> None:
    """Many failed ops between two commits do not bloat the manifest, and verify still passes."""
    from kernos.audit.log import MAX_BOUND_HASHES

    workspace = Workspace.open(tmp_path / "ws", durable=False)
    image = Image(workspace, {})
    image.restore()
    for number in range(MAX_BOUND_HASHES + 20):
        op = image.begin(source=f"fail {number}")
        op.abort(error=("ValueError", "no"))
    op = image.begin(source="x = 1")
    image.namespace["x"] = 1
    report = op.commit()
    binding = image.audit.binding()
    assert len(binding["hashes"]) == 1  # after a commit, it starts again from the commit
    workspace.close()
    from kernos.store.snapshots import read_snapshot

    with Workspace.open(tmp_path / "ws", writable=False) as reader:
        facts = read_snapshot(reader, bytes.fromhex(report.commit)).manifest["facts"]
    bound = facts["audit"]
    assert len(bound["hashes"]) == MAX_BOUND_HASHES
    assert bound["from"] + MAX_BOUND_HASHES == bound["index"] == report.audit["index"]
    assert verify(tmp_path / "ws").ok


# -- since: only what came after an anchor ---------------------------------------------------


def anchor_of(env: Env, index: int) -> str:
    return f"{index}:{env.records()[index]['hash']}"


def test_since_verifies_the_records_after_the_anchor_and_says_so(built: Env) -> None:
    report = verify(built.path, since=anchor_of(built, 3))
    assert report.ok, report.summary()
    assert report.since == 3 and report.verified == (4, 5) and report.records == 6
    assert report.commits == 1  # record 5's snapshot; record 3's is the anchor's
    assert report.head == verify(built.path).head
    assert report.range() == "records 4..5, after the anchor at 3"
    text = report.summary()
    assert text.startswith("ok: records 4..5, after the anchor at 3: 1 snapshots")
    assert "records 0..3 were not read" in text and text.splitlines()[-1] == f"head {report.head}"
    document = report.to_json()
    assert document["since"] == 3 and document["verified"] == {"first": 4, "last": 5}
    assert document["range"] == report.range() and "outside the range" in document["not_read"]
    built.run("later = 1")
    built.fail("later_failed = 1")
    assert verify(built.path, since=anchor_of(built, 3)).verified == (4, 7)
    head = verify(built.path).head
    at_head = verify(built.path, since=head)
    assert at_head.ok and at_head.range() == "no records after the anchor at 7"


def test_since_reads_backwards_across_chunk_boundaries(built: Env,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from kernos.audit import suffix

    expected = verify(built.path, since=anchor_of(built, 1)).to_json()
    monkeypatch.setattr(suffix, "CHUNK", 7)  # every line spans several reads
    assert verify(built.path, since=anchor_of(built, 1)).to_json() == expected


def test_since_fails_on_a_tampered_record_after_the_anchor(built: Env) -> None:
    anchor = anchor_of(built, 3)
    built.close()
    chain = built.records()
    chain[4]["principal"] = "mallory"  # recompute nothing
    built.write_records(chain)
    report = verify(built.path, since=anchor)
    assert not report.ok and report.first_bad == 4
    assert "hash does not match" in report.problems[0].what
    assert "verified: records 4..5, after the anchor at 3" in report.summary()


def test_since_catches_a_resealed_suffix_through_a_later_snapshot(built: Env) -> None:
    anchor = anchor_of(built, 3)
    built.close()
    chain = built.records()
    chain[4]["principal"] = "mallory"
    forge(chain, 4)  # every hash and prev after the anchor recomputed
    built.write_records(chain)
    report = verify(built.path, since=anchor)
    assert report.first_bad == 4
    assert "bound when it committed" in report.problems[0].what


def test_a_tampered_record_before_the_anchor_is_outside_the_range(built: Env) -> None:
    anchor = anchor_of(built, 3)
    built.close()
    chain = built.records()
    chain[1]["principal"] = "mallory"
    built.write_records(chain)
    suffix_only = verify(built.path, since=anchor)
    assert suffix_only.ok  # record 1 is not read ...
    assert "records 0..3 were not read: they are outside the range" in suffix_only.summary()
    assert "outside the range" in suffix_only.to_json()["not_read"]
    full = verify(built.path)  # ... and the whole log names it
    assert not full.ok and full.first_bad == 1


def test_since_with_a_wrong_anchor_hash_fails(built: Env) -> None:
    report = verify(built.path, since=f"3:{'0' * 64}")
    assert not report.ok and report.first_bad == 3
    assert "differs from the anchor" in report.problems[0].what
    misplaced = verify(built.path, since=f"2:{built.records()[3]['hash']}")
    assert misplaced.first_bad == 2 and "differs from the anchor" in misplaced.summary()


def test_since_an_anchor_whose_record_was_rewritten_fails(built: Env) -> None:
    anchor = anchor_of(built, 3)
    built.close()
    chain = built.records()
    chain[3]["principal"] = "mallory"
    forge(chain, 3)  # the anchor's own record, resealed with everything after it
    built.write_records(chain)
    report = verify(built.path, since=anchor)
    assert report.first_bad == 3 and "differs from the anchor" in report.problems[0].what


def test_since_an_anchor_beyond_the_end_fails_clearly(built: Env) -> None:
    report = verify(built.path, since=f"50:{'a' * 64}")
    assert not report.ok and report.first_bad == 6 and report.records == 0
    assert "the anchored record 50 is gone (the log ends at record 5)" in report.summary()
    assert report.range() == "nothing: the anchored record 50 was not found"


def test_since_an_anchor_no_line_claims_fails(built: Env) -> None:
    anchor = anchor_of(built, 3)
    built.close()
    lines = built.chain.read_bytes().splitlines(keepends=True)
    del lines[3]
    built.chain.write_bytes(b"".join(lines))
    report = verify(built.path, since=anchor)
    assert report.first_bad == 3 and "no line of the log claims" in report.problems[0].what


@pytest.mark.parametrize("since", ["garbage", "5:abc", "x:" + "0" * 64, ""])
def test_a_malformed_since_is_a_usage_error(built: Env, since: str) -> None:
    with pytest.raises(UsageError, match="INDEX:HASH"):
        verify(built.path, since=since)


def test_an_anchor_before_since_is_a_usage_error_and_one_after_is_checked(built: Env) -> None:
    with pytest.raises(UsageError, match="outside the range"):
        verify(built.path, since=anchor_of(built, 3), anchor=anchor_of(built, 2))
    assert verify(built.path, since=anchor_of(built, 3), anchor=anchor_of(built, 5)).ok
    wrong = verify(built.path, since=anchor_of(built, 3), anchor=f"5:{'0' * 64}")
    assert wrong.first_bad == 5


@pytest.mark.parametrize("anchored", [3, 4], ids=["anchor-committed", "anchor-failed"])
def test_since_catches_records_truncated_after_the_anchor(built: Env, anchored: int) -> None:
    """With the last commit's record cut off, its snapshot has no record (whether the anchor
    itself names a commit, or the records before it would have to be read to know one)."""
    anchor = anchor_of(built, anchored)
    built.close()
    lines = built.chain.read_bytes().splitlines(keepends=True)
    built.chain.write_bytes(b"".join(lines[:5]))
    report = verify(built.path, since=anchor)
    assert not report.ok
    assert "have no audit record" in report.summary()


def test_since_reports_a_torn_last_line(built: Env) -> None:
    anchor = anchor_of(built, 3)
    built.close()
    with open(built.chain, "ab") as log:
        log.write(b'{"partial":')
    report = verify(built.path, since=anchor)
    assert report.first_bad == 6 and "incomplete" in report.problems[0].what


def test_since_reads_a_void_target_before_the_anchor(built: Env) -> None:
    anchor = anchor_of(built, 4)
    built.close()
    append_forged_void(built, built.records()[3])  # voids a commit before the anchor
    report = verify(built.path, since=anchor)
    assert report.first_bad == 6 and "forged void" in report.problems[0].what


def test_since_checks_the_parent_of_the_first_snapshot_after_a_committed_anchor(
        built: Env) -> None:
    anchor = anchor_of(built, 1)  # op 1 committed; record 3's snapshot must descend from it
    built.close()
    chain = built.records()
    chain[1]["commit"] = chain[5]["commit"]  # a different commit, resealed into the anchor
    forge(chain, 1)
    built.write_records(chain)
    report = verify(built.path, since=f"1:{chain[1]['hash']}")  # the forger's own anchor
    assert not report.ok
    assert any("the history was rewritten" in problem.what for problem in report.problems)
    assert verify(built.path, since=anchor).first_bad == 1


def test_since_checks_the_payloads_of_the_records_in_the_range(built: Env) -> None:
    code = built.records()[3]["code"]
    (built.path / "audit" / "payloads" / code["ref"]).unlink()
    report = verify(built.path, since=anchor_of(built, 2))
    assert report.first_bad == 3
    assert "missing (deleted without a recorded erasure)" in report.problems[0].what
    assert verify(built.path, since=anchor_of(built, 3)).ok  # record 3 is the anchor: not read
