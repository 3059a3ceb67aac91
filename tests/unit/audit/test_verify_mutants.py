"""verify(): the chain, payload and anchor checks pinned exactly (kernos.audit.verify).

These close gaps mutation testing (``scripts/mutation audit.verify``) found in
``test_verify_unit.py``: which record each problem names and its exact words
(what ``kernos audit verify`` prints), lines that are not JSON, not an object
or not canonical JSON in the middle of the chain, a record relinked to a wrong
``prev`` with its own hash resealed, a record with no hash, a log with its
front deleted, emptied or missing (with and without ``--since``), every branch
of an anchor that ``--since`` cannot find, an ``--anchor`` one past the end,
payloads named by events (and erased for their subjects) and by sealed code,
the prune summary of a range after the pruned records, and the unfinished op.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from audit_support import reseal
from core_support import CoreEnv, abort
from kernos.audit import verify
from kernos.audit.canonical import canonical
from kernos.audit.report import Problem
from kernos.errors import UsageError
from kernos.prune import Policy, prune

PREV = ("its prev does not match the hash of the record before it (records were deleted, "
        "inserted or reordered)")
HASH = "its hash does not match its content (it was altered)"
TORN = "the last record is incomplete (cut short)"
NOT_CANONICAL_JSON = "it holds values the canonical form does not allow"


def problem(index: int, what: str) -> Problem:
    return Problem(index=index, what=what)


def chain_file(path: Path) -> Path:
    return path / "audit" / "chain.jsonl"


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in chain_file(path).read_bytes().splitlines()]


def lines(path: Path) -> list[bytes]:
    return chain_file(path).read_bytes().splitlines()


def write_lines(path: Path, chain: list[bytes]) -> None:
    chain_file(path).write_bytes(b"".join(line + b"\n" for line in chain))


def write_records(path: Path, chain: list[dict[str, Any]]) -> None:
    """Write ``chain`` as it is: nothing resealed."""
    write_lines(path, [canonical(record) for record in chain])


def sealed(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` signed again with the writer's key and its hash recomputed (and nothing
    else: its prev stays as it is)."""
    return reseal(record)


def append(path: Path, *bodies: dict[str, Any]) -> list[dict[str, Any]]:
    """Append records linked and sealed as the log would; the whole chain after."""
    chain = records(path)
    for body in bodies:
        chain.append(sealed({"v": 1, "at": chain[-1]["at"], **body, "index": len(chain),
                             "prev": chain[-1]["hash"], "signer": ""}))
    write_records(path, chain)
    return chain


def anchor_of(path: Path, index: int) -> str:
    return f"{index}:{records(path)[index]['hash']}"


@pytest.fixture
def failed(tmp_path: Path) -> Path:
    """Records 0 (genesis) to 3, three failed ops: a chain with no snapshot to check."""
    env = CoreEnv(tmp_path / "ws")
    for n in range(1, 4):
        abort(env, f"z{n} = 1 / 0")
    env.close()
    return env.path


@pytest.fixture
def committed(tmp_path: Path) -> Path:
    """Records 0 (genesis) and 1, an op that committed a snapshot."""
    env = CoreEnv(tmp_path / "ws")
    env.run("x = 1")
    env.close()
    return env.path


# -- the chain: each bad line named, in words -------------------------------------------------


@pytest.mark.parametrize(("line", "what"), [
    (b"not json", "it is not valid JSON (JSONDecodeError)"),
    (b"[2]", "it is not a JSON object"),
    (b'{"index":2,"hash":NaN}', NOT_CANONICAL_JSON),
], ids=["not-json", "not-an-object", "nan"])
def test_an_unreadable_line_is_named_and_the_next_record_cannot_link_to_it(
        failed: Path, line: bytes, what: str) -> None:
    head = anchor_of(failed, 3)
    chain = lines(failed)
    chain[2] = line
    write_lines(failed, chain)
    report = verify(failed)
    assert report.problems == (problem(2, what), problem(3, PREV))
    assert report.records == 4 and report.head == head


def test_an_unreadable_last_line_leaves_the_head_without_a_hash(failed: Path) -> None:
    chain = lines(failed)
    chain[3] = b"not json"
    write_lines(failed, chain)
    report = verify(failed)
    assert report.problems == (problem(3, "it is not valid JSON (JSONDecodeError)"),)
    assert report.head == "3:?"


def test_a_record_reformatted_out_of_canonical_form_is_named_once(failed: Path) -> None:
    chain = lines(failed)
    chain[2] = json.dumps(json.loads(chain[2]), indent=1).replace("\n", " ").encode()
    write_lines(failed, chain)
    report = verify(failed)  # same content, same hash: only the form is wrong
    assert report.problems == (problem(2, "it is not in canonical form (it was edited)"),)


def test_an_edited_record_is_named_once_with_its_hash(failed: Path) -> None:
    chain = records(failed)
    chain[2]["principal"] = "mallory"
    write_records(failed, chain)
    assert verify(failed).problems == (problem(2, HASH),)


def test_a_record_relinked_and_resealed_fails_its_own_link_and_the_next(failed: Path) -> None:
    chain = records(failed)
    chain[2] = sealed({**chain[2], "prev": "f" * 64})
    write_records(failed, chain)
    assert verify(failed).problems == (problem(2, PREV), problem(3, PREV))


def test_the_genesis_record_must_link_to_nothing(failed: Path) -> None:
    chain = records(failed)
    chain[0] = sealed({**chain[0], "prev": "1" * 64})
    write_records(failed, chain)
    assert verify(failed).problems == (problem(0, PREV), problem(1, PREV))


def test_records_out_of_order_say_which_record_each_claims_to_be(failed: Path) -> None:
    chain = lines(failed)
    chain[2], chain[3] = chain[3], chain[2]
    write_lines(failed, chain)
    assert verify(failed).problems == (
        problem(2, "it says it is record 3 (records were deleted, inserted or reordered)"),
        problem(3, "it says it is record 2 (records were deleted, inserted or reordered)"))


def test_a_record_without_a_hash_breaks_the_link_of_the_next(failed: Path) -> None:
    chain = records(failed)
    del chain[2]["hash"]
    write_records(failed, chain)
    assert verify(failed).problems == (problem(2, HASH), problem(3, PREV))
    del chain[3]["hash"]
    write_records(failed, chain)
    report = verify(failed)
    assert report.problems == (problem(2, HASH), problem(3, PREV), problem(3, HASH))
    assert report.head == "3:?"  # no hash claimed: nothing to anchor


def test_a_torn_last_line_is_named_after_the_last_record(failed: Path) -> None:
    head = anchor_of(failed, 3)
    with open(chain_file(failed), "ab") as log:
        log.write(b'{"partial":')
    report = verify(failed)
    assert report.problems == (problem(4, TORN),)
    assert report.head == head


def test_a_chain_whose_front_was_deleted_says_so_at_record_0(failed: Path) -> None:
    write_lines(failed, lines(failed)[1:])
    report = verify(failed)
    assert problem(0, "the chain does not start with its genesis record (records were "
                      "deleted from the front)") in report.problems
    assert report.first_bad == 0 and report.records == 3


def test_a_missing_log_is_named_once(failed: Path) -> None:
    chain = chain_file(failed)
    chain.unlink()
    report = verify(failed)
    assert report.problems == (problem(0, f"the audit log {chain} is missing"),)
    assert report.records == 0 and report.head == f"-1:{'0' * 64}"


def test_an_emptied_log_fails_when_the_history_holds_snapshots(committed: Path) -> None:
    chain_file(committed).write_bytes(b"")
    report = verify(committed)
    assert report.problems == (problem(0, "the audit log holds no records, but the history "
                                          "holds snapshots with no audit record: the log was "
                                          "truncated or emptied"),)
    assert report.records == 0 and report.commits == 0


# -- the anchor ------------------------------------------------------------------------------


def test_an_anchor_one_past_the_end_is_gone(failed: Path) -> None:
    report = verify(failed, anchor=f"4:{'a' * 64}")
    assert report.problems == (problem(4, "the anchored record 4 is gone (the log holds 4): "
                                          "the log was truncated"),)


def test_an_anchor_with_another_hash_is_named_at_its_record(failed: Path) -> None:
    report = verify(failed, anchor=f"3:{'a' * 64}")
    assert report.problems == (problem(3, "it differs from the anchor (the log was "
                                          "rewritten)"),)


@pytest.mark.parametrize("digits", ["X" * 64, "A" * 64, "g" * 64])
def test_an_anchor_must_hold_lowercase_hex_digits(failed: Path, digits: str) -> None:
    with pytest.raises(UsageError, match="INDEX:HASH"):
        verify(failed, anchor=f"3:{digits}")
    with pytest.raises(UsageError, match="INDEX:HASH"):
        verify(failed, since=f"3:{digits}")


def test_a_malformed_anchor_is_quoted_in_full_words_and_cut_at_80_characters(
        failed: Path) -> None:
    anchor = "3:" + "x" * 100
    with pytest.raises(UsageError) as caught:
        verify(failed, anchor=anchor)
    assert str(caught.value) == (f"the anchor {anchor[:80]!r} is not INDEX:HASH as `kernos audit "
                                 "verify` prints it (a record number, a colon, 64 hex digits)")


def test_an_anchor_at_the_since_record_is_in_range_and_one_before_it_is_not(
        failed: Path) -> None:
    at = anchor_of(failed, 2)
    report = verify(failed, since=at, anchor=at)
    assert report.ok and report.verified == (3, 3)
    with pytest.raises(UsageError) as caught:
        verify(failed, since=at, anchor=anchor_of(failed, 1))
    assert str(caught.value) == ("the --anchor record 1 lies before the --since anchor 2, "
                                 "outside the range verified; give an --anchor at or after "
                                 "it, or verify without --since")


# -- since: the records after an anchor --------------------------------------------------------


def test_since_with_a_missing_log_names_it_and_checks_nothing_else(committed: Path) -> None:
    anchor = anchor_of(committed, 1)
    chain = chain_file(committed)
    chain.unlink()
    report = verify(committed, since=anchor)
    assert report.problems == (problem(0, f"the audit log {chain} is missing"),)
    assert report.records == 0 and report.commits == 0


def test_since_names_an_unreadable_line_after_the_anchor(failed: Path) -> None:
    anchor = anchor_of(failed, 1)
    chain = lines(failed)
    chain[2] = b"not json"
    write_lines(failed, chain)
    report = verify(failed, since=anchor)
    assert report.problems == (problem(2, "it is not valid JSON (JSONDecodeError)"),
                               problem(3, PREV))


def test_since_checks_the_links_after_the_anchor(failed: Path) -> None:
    anchor = anchor_of(failed, 1)
    chain = records(failed)
    chain[2] = sealed({**chain[2], "prev": "f" * 64})
    write_records(failed, chain)
    assert verify(failed, since=anchor).problems == (problem(2, PREV), problem(3, PREV))


def test_since_a_record_without_a_hash_breaks_the_next_link(failed: Path) -> None:
    anchor = anchor_of(failed, 1)
    chain = records(failed)
    del chain[2]["hash"]
    del chain[3]["hash"]
    write_records(failed, chain)
    report = verify(failed, since=anchor)
    assert report.problems == (problem(2, HASH), problem(3, PREV), problem(3, HASH))
    assert report.head == "3:?"


def test_since_an_anchor_line_without_a_hash_differs_and_breaks_the_next_link(
        failed: Path) -> None:
    anchor = anchor_of(failed, 1)
    expected = anchor.partition(":")[2]
    chain = records(failed)
    del chain[1]["hash"]
    write_records(failed, chain)
    assert verify(failed, since=anchor).problems == (
        problem(1, HASH),
        problem(1, f"it differs from the anchor 1:{expected[:12]}... (the log was rewritten)"),
        problem(2, PREV))
    last = anchor_of(failed, 3)  # an anchor with nothing after it
    del chain[3]["hash"]
    write_records(failed, chain)
    assert verify(failed, since=last).head == "3:?"  # no hash claimed: none to print


def test_since_an_anchor_line_canonical_json_cannot_hold_differs(failed: Path) -> None:
    anchor = anchor_of(failed, 1)
    chain = lines(failed)
    chain[1] = b'{"index":1,"hash":NaN}'
    write_lines(failed, chain)
    assert verify(failed, since=anchor).problems == (
        problem(1, NOT_CANONICAL_JSON),
        problem(1, f"it differs from the anchor {anchor[:14]}... (the log was rewritten)"),
        problem(2, PREV))


def test_since_a_torn_last_line_is_named_after_the_last_record(failed: Path) -> None:
    anchor = anchor_of(failed, 1)
    with open(chain_file(failed), "ab") as log:
        log.write(b'{"partial":')
    assert verify(failed, since=anchor).problems == (problem(4, TORN),)


def test_since_an_anchor_no_line_claims_says_how_to_find_the_first_bad_record(
        failed: Path) -> None:
    anchor = anchor_of(failed, 2)
    chain = lines(failed)
    del chain[2]
    write_lines(failed, chain)
    report = verify(failed, since=anchor)
    assert report.problems == (problem(2, "no line of the log claims to be the anchored record "
                                          "2 (it was altered, or records around it were "
                                          "deleted or reordered); verify without --since to "
                                          "find the first bad record"),)
    assert report.records == 0


def test_since_an_anchor_past_the_end_says_where_the_log_ends(failed: Path) -> None:
    report = verify(failed, since=f"50:{'a' * 64}")
    assert report.problems == (problem(4, "the anchored record 50 is gone (the log ends at "
                                          "record 3): the log was truncated, or the anchor is "
                                          "from another workspace"),)


@pytest.mark.parametrize("content", [b"", b"overwritten\n", b"[1]\n{}\n"],
                         ids=["emptied", "text", "no-index"])
def test_since_a_log_where_no_line_claims_an_index_was_emptied_or_overwritten(
        failed: Path, content: bytes) -> None:
    anchor = anchor_of(failed, 2)
    chain_file(failed).write_bytes(content)
    report = verify(failed, since=anchor)
    assert report.problems == (problem(0, "the anchored record 2 is gone: no line of the log "
                                          "claims an index (the log was emptied or "
                                          "overwritten)"),)


# -- payloads ----------------------------------------------------------------------------------


def payload(path: Path, data: bytes, *, stored: bytes | None = None) -> str:
    """The ref of ``data``; stored as ``stored`` (its bytes, or others), unless None."""
    ref = hashlib.sha256(data).hexdigest()
    if stored is not None:
        directory = path / "audit" / "payloads"
        directory.mkdir(exist_ok=True)
        (directory / ref).write_bytes(stored)
    return ref


def op_record(op: int, **fields: Any) -> dict[str, Any]:
    return {"type": "op", "op": op, "kind": "code", "principal": "human", "status": "failed",
            "error": ["ValueError", "no"], **fields}


def test_each_payload_of_an_op_is_checked_and_an_erasure_after_it_explains_a_missing_one(
        failed: Path) -> None:
    """Code sealed for alice and an event for bob, both erased later: missing on purpose.
    Every other payload the op's code and events name is checked, one problem each."""
    code = payload(failed, b"sealed code")  # missing: alice was erased
    for_bob = payload(failed, b"bob's event")  # missing: bob was erased
    intact = payload(failed, b"plain event", stored=b"plain event")
    modified = payload(failed, b"an event", stored=b"an EVENT")
    deleted = payload(failed, b"no subject")  # missing, and nobody's erasure explains it
    for_carol = payload(failed, b"carol's event")  # missing, and carol was never erased
    append(failed,
           op_record(4, code={"sha256": "0" * 64, "ref": code, "sealed": ["alice"]},
                     events=[{"seq": 1, "ref": for_bob, "subjects": ["bob"]},
                             {"seq": 2, "ref": intact, "subjects": []},
                             {"seq": 3, "ref": modified},
                             {"seq": 4, "payload": {"inline": True}},
                             {"seq": 5, "ref": deleted},
                             {"seq": 6, "ref": for_carol, "subjects": ["carol", "bob"]}]),
           {"type": "erasure", "subject": "alice", "refs": [code]},
           {"type": "erasure", "subject": "bob", "refs": []})
    report = verify(failed)
    assert report.problems == (
        problem(4, f"its payload {modified[:16]} was modified"),
        problem(4, f"its payload {deleted[:16]} is missing (deleted without a recorded "
                   "erasure)"))
    # One subject's erasure explains it; a subject never erased explains nothing.
    append(failed, op_record(5, events=[{"seq": 7, "ref": for_carol, "subjects": ["carol"]}]))
    assert verify(failed).problems[2:] == (
        problem(7, f"its payload {for_carol[:16]} is missing (deleted without a recorded "
                   "erasure)"),)


def test_an_erasure_before_an_op_does_not_explain_its_missing_payload(failed: Path) -> None:
    before = payload(failed, b"sealed later")
    append(failed,
           {"type": "erasure", "subject": "alice", "refs": []},
           op_record(4, code={"sha256": "0" * 64, "ref": before, "sealed": ["alice"]},
                     events=[{"seq": 1, "ref": before, "subjects": ["alice"]}]))
    assert verify(failed).problems == (
        problem(5, f"its payload {before[:16]} is missing (deleted without a recorded "
                   "erasure)"),) * 2


def test_payloads_are_checked_past_an_unreadable_line(failed: Path) -> None:
    modified = payload(failed, b"code", stored=b"CODE")
    append(failed, op_record(4, code={"sha256": "0" * 64, "ref": modified}))
    chain = lines(failed)
    chain[2] = b"not json"
    write_lines(failed, chain)
    assert verify(failed).problems == (
        problem(2, "it is not valid JSON (JSONDecodeError)"), problem(3, PREV),
        problem(4, f"its payload {modified[:16]} was modified"))


# -- the report ----------------------------------------------------------------------------------


def test_since_after_the_pruned_records_reports_the_prune_with_none_of_them(
        tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "ws")
    for n in range(1, 5):
        env.run(f"x{n} = {n}")
    env.close()
    anchor = anchor_of(env.path, 4)
    prune(env.path, Policy(keep_last=1))  # record 5 deletes ops 1-3, keeps op 4 renamed
    at = records(env.path)[5]["at"]
    whole = verify(env.path)
    assert whole.ok, whole.summary()
    (pruned,) = whole.pruned
    assert (pruned.record, pruned.at, pruned.snapshots, pruned.rewritten, pruned.records) == (
        5, at, 3, 1, 3)
    since = verify(env.path, since=anchor)
    assert since.ok, since.summary()
    (pruned,) = since.pruned
    assert (pruned.record, pruned.at, pruned.snapshots, pruned.rewritten, pruned.records) == (
        5, at, 3, 1, 0)


def test_a_newest_record_whose_commit_was_never_published_is_an_unfinished_op(
        committed: Path) -> None:
    never = "ab" * 20
    append(committed, op_record(2, status="committed", commit=never, error=None))
    report = verify(committed)
    assert report.ok, report.summary()
    assert report.unfinished == (
        f"record 2 (op 2) names the commit {never[:12]}, which was never published: the "
        "process died before its commit point (or is committing it now); the next kernel or "
        "writable command to open the workspace voids it")
    assert verify(committed, since=anchor_of(committed, 1)).unfinished == report.unfinished


def test_an_emptied_log_fails_even_when_no_op_ever_committed(failed: Path) -> None:
    """Only refused or failed ops: no snapshot betrays the log, its genesis record does."""
    chain = chain_file(failed)
    chain.write_bytes(b"")
    report = verify(failed)
    assert report.problems == (problem(0, f"the audit log {chain} is empty, but every log "
                                          "starts with its genesis record: its records were "
                                          "deleted"),)
    assert report.records == 0
