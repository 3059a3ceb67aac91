"""The op: what its reports say, how vetoes and kept failures are recorded.

Mutation testing (``scripts/mutation op``) found these unpinned: the keys of
a rollback's JSON, the summary's wording once names could not be reset, the
cut-off of long name lists, which veto status wins, keeping a failed op, an op
run as another principal, and a requested full scan.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from core_support import CoreEnv, abort
from kernos.errors import OpVetoed, UsageError
from kernos.image.changes import _sealed_source
from kernos.op import AbortReport, outcome


@pytest.fixture()
def env(tmp_path: Path) -> Iterator[CoreEnv]:
    opened = CoreEnv(tmp_path / "ws")
    yield opened
    opened.close()


def last_record(env: CoreEnv) -> dict[str, object]:
    return env.image.audit.records(type="op")[-1]  # type: ignore[no-any-return]


# -- the rollback report -----------------------------------------------------------------


def test_a_rollback_as_json_names_every_kind_of_undoing() -> None:
    report = AbortReport(op=3, removed=["a"], rebound=["b"], reloaded=["c"], deleted=["d"],
                         not_reset=["e"], left_live={"f": "why"}, random_reset=True)
    assert report.undone() == {"added": ["a"], "rebound": ["b"], "deleted": ["d"],
                               "reloaded": ["c"], "not_reset": ["e"], "left_live": {"f": "why"},
                               "random": True}
    assert not report.nothing_undone


@pytest.mark.parametrize("field", ["removed", "rebound", "reloaded", "deleted", "not_reset"])
def test_any_one_undoing_is_something_undone(field: str) -> None:
    lists = {"removed": [], "rebound": [], "reloaded": [], "deleted": [], "not_reset": []}
    assert AbortReport(op=1, **lists).nothing_undone  # type: ignore[arg-type]
    lists[field] = ["x"]
    assert not AbortReport(op=1, **lists).nothing_undone  # type: ignore[arg-type]


def test_the_summary_adds_what_could_not_be_reset_to_what_was_undone() -> None:
    report = AbortReport(op=3, removed=["a"], rebound=[], reloaded=[], not_reset=["conn"])
    assert report.summary() == (
        "rolled back — not kept: a (added); could not be reset: conn (they hold live "
        "resources, so they stay as the cell left them)")


def test_a_value_left_live_is_something_undone_and_says_why() -> None:
    report = AbortReport(op=3, removed=[], rebound=[], reloaded=[],
                         left_live={"fig": "it pickles differently each time",
                                    "ax": "it pickles differently each time",
                                    "m": "its stored value could not be loaded: boom"})
    assert not report.nothing_undone
    assert report.summary() == (
        "rolled back — nothing had changed; left as the cell left them: ax, fig (it pickles "
        "differently each time); left as the cell left them: m (its stored value could not "
        "be loaded: boom)")


def test_long_name_lists_are_cut_after_eight() -> None:
    eight = [f"n{i}" for i in range(8)]
    report = AbortReport(op=1, removed=eight, rebound=[], reloaded=[])
    assert report.summary() == "rolled back — not kept: " + ", ".join(eight) + " (added)"
    ten = [*eight, "n8", "n9"]
    report = AbortReport(op=1, removed=ten, rebound=[], reloaded=[])
    assert report.summary() == ("rolled back — not kept: " + ", ".join(eight)
                                + " and 2 more (added)")


# -- vetoes ------------------------------------------------------------------------------------


def test_a_denial_wins_over_other_veto_statuses(env: CoreEnv) -> None:
    op = env.image.begin(source="x = 1")
    op.veto("first", status="failed")
    assert op.veto_status == "failed"
    op.veto("second", status="denied")
    op.veto("third", status="failed")
    assert op.vetoes == ["first", "second", "third"] and op.veto_status == "denied"
    with pytest.raises(OpVetoed, match="first; second; third"):
        op.commit()
    assert last_record(env)["status"] == "denied"


def test_a_later_veto_status_replaces_an_earlier_one_short_of_a_denial(env: CoreEnv) -> None:
    op = env.image.begin(source="x = 1")
    assert op.veto_status == "vetoed"
    op.veto("breached", status="failed")
    op.veto("timed out", status="timeout")
    with pytest.raises(OpVetoed):
        op.commit()
    assert last_record(env)["status"] == "timeout"


def test_a_plain_veto_is_recorded_as_vetoed(env: CoreEnv) -> None:
    op = env.image.begin(source="x = 1")
    op.veto("no")
    with pytest.raises(OpVetoed):
        op.commit()
    assert last_record(env)["status"] == "vetoed"


# -- kept failures, other principals, full scans ------------------------------------------------


def test_a_human_op_kept_after_an_error_records_the_cut_error(env: CoreEnv) -> None:
    op = env.image.begin(source="x = 1")
    env.ns["x"] = 1
    op.keep_failed("K" * 200, "m" * 900)
    report = op.commit()
    assert op.failure == {"kind": "K" * 120, "message": "m" * 500}
    assert report.failed == op.failure
    assert env.ns["x"] == 1 and "x" in report.added


def test_an_agents_op_cannot_be_kept_after_an_error(env: CoreEnv) -> None:
    op = env.image.begin(source="x = 1", principal="alice")
    try:
        with pytest.raises(UsageError) as raised:
            op.keep_failed("ValueError", "bad")
        assert str(raised.value) == ("an op of 'alice' cannot be kept after an error: agents' "
                                     "ops always roll back")
        assert op.failure is None
    finally:
        op.abort()


def test_an_op_acting_as_an_agent_is_recorded_as_the_agent(env: CoreEnv) -> None:
    op = env.image.begin(source="x = 1")
    op.act_as("alice", "agent-cell")
    assert (op.principal, op.transaction.principal, op.kind) == ("alice", "alice", "agent-cell")
    env.ns["x"] = 1
    report = op.commit()
    assert (report.principal, report.kind) == ("alice", "agent-cell")
    record = last_record(env)
    assert (record["principal"], record["kind"]) == ("alice", "agent-cell")


def test_a_full_scan_is_reported_with_its_reason(env: CoreEnv) -> None:
    env.run("items = [1]")
    op = env.image.begin(source="pass")
    env.ns["items"].append(2)  # a change the source's reach cannot see
    op.scan_everything("the test asked")
    report = op.commit()
    assert report.reach == "everything: the test asked"
    assert report.changed == ["items"]
    env.reopen()
    assert env.ns["items"] == [1, 2]


# -- rolling back values that hold live resources -------------------------------------------


def test_containers_sharing_a_live_resource_are_reset_and_keep_holding_each_other(
        env: CoreEnv) -> None:
    env.run("import socket\nsock = socket.socket()\nrows = [1]\n"
            "db = {'conn': sock, 'rows': rows}\nlinks = [sock, rows]")
    db, rows, links, sock = (env.ns[name] for name in ("db", "rows", "links", "sock"))
    report = abort(env, "rows.append(2)\ndb['n'] = 1\nlinks.append(3)\n1/0")
    assert sorted(report.reloaded) == ["db", "links", "rows"]
    assert report.not_reset == []  # sock is a live resource, but the op did not reach it
    assert env.ns["db"] is db and env.ns["rows"] is rows and env.ns["links"] is links
    assert db == {"conn": sock, "rows": [1]} and links == [sock, [1]] and rows == [1]
    # What the containers hold of each other is the live object, not a reloaded copy.
    assert db["rows"] is rows and links[1] is rows and db["conn"] is sock
    sock.close()


@pytest.mark.parametrize("holder", [
    "{'conn': sock, 'deep': {'rows': rows}}",
    "{'conn': sock, 'read': (lambda r=rows: r)}",
    "{'conn': sock, 'read': (lambda held: lambda: held)(rows)}",
    "[sock, (rows,)]",
])
def test_a_container_that_holds_another_deeper_down_is_not_reset(
        env: CoreEnv, holder: str) -> None:
    # The copy's deeper reference could not be pointed at the live ``rows``: resetting
    # in place would leave it holding a copy, so the group stays as the op left it.
    env.run(f"import socket\nsock = socket.socket()\nrows = [1]\ndb = {holder}")
    db, rows = env.ns["db"], env.ns["rows"]
    report = abort(env, "rows.append(2)\n1/0")
    assert set(report.not_reset) >= {"db", "rows"}
    assert env.ns["db"] is db and env.ns["rows"] is rows and rows == [1, 2]
    env.ns["sock"].close()


def test_a_library_instance_holding_a_live_resource_is_not_reset_in_place(
        env: CoreEnv) -> None:
    env.run("import socket, types\nsock = socket.socket()\n"
            "ns = types.SimpleNamespace(conn=sock, n=0)")
    live = env.ns["ns"]
    report = abort(env, "ns.n = 1\n1/0")
    assert env.ns["ns"] is live and live.n == 1 and "ns" in report.not_reset
    env.ns["sock"].close()


def test_a_cell_class_with_slots_holding_a_live_resource_is_not_reset_in_place(
        env: CoreEnv) -> None:
    env.run("import socket\nclass Slotted:\n    __slots__ = ('conn', 'n', '__dict__')\n"
            "    def __init__(self):\n        self.conn = socket.socket()\n"
            "        self.n = 0\ns = Slotted()")
    live = env.ns["s"]
    report = abort(env, "s.n = 1\n1/0")
    assert env.ns["s"] is live and live.n == 1 and "s" in report.not_reset
    live.conn.close()


# -- deciding what a rollback reloads ------------------------------------------------------


def test_a_value_that_no_longer_pickles_is_reloaded(env: CoreEnv) -> None:
    env.run("class Bad:\n    def __reduce__(self):\n        raise RuntimeError('no')\n"
            "items = [1]")
    report = abort(env, "items.append(Bad())\n1/0")
    assert report.reloaded == ["items"] and env.ns["items"] == [1]


def test_a_value_that_gained_a_buffer_is_reloaded(env: CoreEnv) -> None:
    np = pytest.importorskip("numpy")
    env.ns["np"] = np
    env.run("items = [1]")
    report = abort(env, "items.append(np.arange(100_000))\n1/0")
    assert report.reloaded == ["items"] and env.ns["items"] == [1]


def test_a_changed_buffer_of_the_same_size_is_reloaded(env: CoreEnv) -> None:
    np = pytest.importorskip("numpy")
    env.ns["np"] = np
    env.run("data = np.zeros(100_000)\nother = np.ones(10)")
    report = abort(env, "data[5] = 1.0\n1/0")
    assert report.reloaded == ["data"]
    assert env.ns["data"][5] == 0.0 and env.ns["other"][0] == 1.0


class FakeOp:
    """What ``outcome`` reads of an op."""

    def __init__(self, *, vetoes: tuple[str, ...] = (), denied: tuple[object, ...] = (),
                 veto_status: str = "vetoed") -> None:
        self.vetoes = list(vetoes)
        self.denied = list(denied)
        self.veto_status = veto_status


class CapabilityDenied(Exception):
    """Named as the runtime's error: ``outcome`` goes by the error's class name."""


@pytest.mark.parametrize(("op", "status", "error", "expected"), [
    (FakeOp(), None, None, ("rolled back", None)),
    (FakeOp(), None, ValueError("bad"), ("failed", {"kind": "ValueError", "message": "bad"})),
    (FakeOp(), None, KeyboardInterrupt(), (
        "interrupted", {"kind": "KeyboardInterrupt", "message": ""})),
    (FakeOp(denied=({"capability": "call:x"},)), None, CapabilityDenied("no"),
     ("denied", {"kind": "CapabilityDenied", "message": "no"})),
    (FakeOp(), None, CapabilityDenied("no"), (
        "failed", {"kind": "CapabilityDenied", "message": "no"})),
    (FakeOp(denied=({"capability": "call:x"},)), None, ("OpVetoed", "rolled back: no"),
     ("denied", {"kind": "OpVetoed", "message": "rolled back: no"})),
    (FakeOp(denied=({"capability": "call:x"},)), None, ValueError("bad"),
     ("failed", {"kind": "ValueError", "message": "bad"})),
    (FakeOp(vetoes=("breach",), veto_status="timeout"), None, ValueError("late"),
     ("timeout", {"kind": "ValueError", "message": "late"})),
    (FakeOp(), "conflict", ValueError("stale"),
     ("conflict", {"kind": "ValueError", "message": "stale"})),
    (FakeOp(), None, ("E" * 200, "m" * 900), ("failed", {"kind": "E" * 120, "message": "m" * 500})),
])
def test_the_audit_status_of_an_op_that_did_not_commit(
        op: FakeOp, status: str | None, error: object, expected: object) -> None:
    assert outcome(op, status, error) == expected  # type: ignore[arg-type]


def test_an_aborted_op_records_why(env: CoreEnv) -> None:
    op = env.image.begin(source="x = 1")
    op.abort(error=KeyboardInterrupt())
    record = last_record(env)
    assert record["status"] == "interrupted"
    assert record["error"] == {"kind": "KeyboardInterrupt", "message": ""}


def test_the_sealed_source_names_the_subjects_in_order() -> None:
    assert _sealed_source(frozenset({"bob", "alice"})) == (
        "# The code of this op tagged personal data of alice, bob, so it is kept\n"
        "# only in the audit log, sealed under those subjects' keys (see "
        "kernos.personal).\n")


# -- the snapshot's commit message ------------------------------------------------------------


def headline(env: CoreEnv, report: object) -> str:
    workspace = env.workspace
    assert workspace is not None
    commit = workspace.read_commit(bytes.fromhex(report.commit))  # type: ignore[attr-defined]
    first = commit.message.split("\n", 1)[0]
    prefix = f"op {report.op} by {report.principal}: "  # type: ignore[attr-defined]
    assert first.startswith(prefix)
    return first[len(prefix):]


def test_the_headline_is_the_first_line_with_a_count_of_the_others(env: CoreEnv) -> None:
    assert headline(env, env.run("x = 1")) == "x = 1"
    assert headline(env, env.run("\ny = 2  \n\nz = 3\nif z:\n    w = 4\n")) == (
        "y = 2 (+3 lines)")


def test_a_long_first_line_is_cut_to_sixty_characters(env: CoreEnv) -> None:
    exactly = "x = '" + "a" * 54 + "'"
    assert len(exactly) == 60
    assert headline(env, env.run(exactly)) == exactly
    longer = "x = '" + "a" * 55 + "'"
    assert headline(env, env.run(longer)) == longer[:57] + "..."


def test_an_op_without_code_is_named_by_its_kind(env: CoreEnv) -> None:
    op = env.image.begin(source=None, kind="restore-test")
    env.ns["x"] = 1
    assert headline(env, op.commit()) == "(restore-test)"
    op = env.image.begin(source="   \n")
    env.ns["x"] = 2
    assert headline(env, op.commit()) == "(cell)"


def test_a_note_is_the_headline_and_a_kept_failure_is_appended(env: CoreEnv) -> None:
    op = env.image.begin(source="x = 1")
    env.ns["x"] = 1
    op.note = "the note"
    op.keep_failed("ValueError", "bad")
    assert headline(env, op.commit()) == "the note [failed: ValueError, kept]"


def test_the_message_carries_the_op_trailers(env: CoreEnv) -> None:
    report = env.run("x = 1")
    workspace = env.workspace
    assert workspace is not None
    message = workspace.read_commit(bytes.fromhex(report.commit)).message
    assert message.endswith(f"\n\nKernos-Op: {report.op}\nKernos-Principal: human\n"
                            "Kernos-Kind: cell\n")


# -- what the history knows of each name ----------------------------------------------------


def manifest(env: CoreEnv, report: object) -> dict[str, object]:
    from kernos.store.snapshots import read_snapshot

    workspace = env.workspace
    assert workspace is not None
    commit = bytes.fromhex(report.commit)  # type: ignore[attr-defined]
    return read_snapshot(workspace, commit).manifest  # type: ignore[no-any-return]


def test_a_name_gets_a_new_version_only_when_its_content_changes(env: CoreEnv) -> None:
    first = env.run("x = [1]")
    meta = env.image.meta["x"]
    assert (meta.version, meta.op, meta.principal, meta.type) == (1, first.op, "human", "list")
    assert meta.size > 0 and meta.changed_at == first.committed_at
    same = env.run("x = [1]")  # rebound to an equal value: the same content
    assert same.changed == [] and env.image.meta["x"] == meta
    second = env.run("x.append(2)")
    assert second.changed == ["x"]
    assert (env.image.meta["x"].version, env.image.meta["x"].op) == (2, second.op)
    assert env.image.meta["x"].hash != meta.hash


def test_names_that_start_sharing_move_to_one_group_with_their_versions(env: CoreEnv) -> None:
    env.run("a = [1]\nb = [2]")
    versions = {name: env.image.meta[name].version for name in "ab"}
    assert env.image.meta["a"].group != env.image.meta["b"].group
    report = env.run("holder = {'a': a}\nc = a")
    group = env.image.group_of["a"]
    assert env.image.group_of["c"] == env.image.group_of["holder"] == group
    assert env.image.meta["a"].group == group == env.image.meta["c"].group
    assert env.image.meta["a"].version == versions["a"]
    assert "a" not in report.changed and sorted(report.added) == ["c", "holder"]
    env.reopen()
    assert env.ns["holder"]["a"] is env.ns["a"] is env.ns["c"]


def test_the_manifest_says_what_the_op_was(env: CoreEnv) -> None:
    op = env.image.begin(source="x = 1", principal="human")
    env.ns["x"] = 1
    op.facts["tools"] = {"pay": 1}
    op.note = "noted"
    op.keep_failed("ValueError", "bad")
    report = op.commit()
    found = manifest(env, report)
    assert {key: found[key] for key in ("format", "op", "principal", "kind", "note",
                                        "committed_at", "changes", "failed")} == {
        "format": 1, "op": report.op, "principal": "human", "kind": "cell", "note": "noted",
        "committed_at": report.committed_at,
        "changes": {"added": ["x"], "changed": [], "deleted": []},
        "failed": {"kind": "ValueError", "message": "bad"}}
    assert found["facts"]["tools"] == {"pay": 1}  # type: ignore[index]
    assert set(found["names"]) == {"x"}  # type: ignore[arg-type]
    assert "sealed_for" not in found


def test_the_manifest_lists_changes_and_deletions(env: CoreEnv) -> None:
    env.run("x = 1\ny = [1]")
    report = env.run("del x\ny.append(2)\nz = 3")
    assert manifest(env, report)["changes"] == {
        "added": ["z"], "changed": ["y"], "deleted": ["x"]}
    assert report.reach == "2 names"  # what it touched and still has: y and z


# -- an op that changes nothing ---------------------------------------------------------------


def test_an_op_that_changes_nothing_writes_no_snapshot(env: CoreEnv) -> None:
    first = env.run("x = [1]")
    report = env.run("y = x[0]\ndel y")
    assert report.unchanged and report.commit == first.commit
    assert env.workspace is not None and env.workspace.head() == bytes.fromhex(first.commit)


@pytest.mark.parametrize("extra", ["facts", "failure", "note-only"])
def test_an_op_with_something_to_say_writes_a_snapshot(env: CoreEnv, extra: str) -> None:
    first = env.run("x = [1]")
    op = env.image.begin(source="x[0]")
    if extra == "facts":
        op.facts["tools"] = {"t": 1}
    elif extra == "failure":
        op.keep_failed("ValueError", "bad")
    else:
        op.note = "a note alone changes nothing"
    report = op.commit()
    assert report.unchanged is (extra == "note-only")
    assert (report.commit == first.commit) is (extra == "note-only")


def test_a_new_live_resource_is_reported_once(env: CoreEnv) -> None:
    first = env.run("import socket\nsock = socket.socket()")
    assert [(entry["name"], entry["op"]) for entry in first.unpersisted] == [
        ("sock", first.op)]
    assert not first.unchanged
    again = env.run("items = [sock]")
    assert again.unpersisted == []
    env.ns["sock"].close()


# -- checkout, the commit's audit, the runtime's own state --------------------------------------


def test_a_checkout_reports_what_it_restored_and_names_it_in_the_history(env: CoreEnv) -> None:
    first = env.run("a = [1]\nb = 'x' * 10")
    first_hash = env.image.meta["a"].hash
    env.run("a.append(2)\nc = 3")
    op = env.image.begin(source="%kernos checkout")
    checkout = op.checkout(f"@{first.op}")
    assert (checkout.ref, checkout.commit, checkout.op, checkout.names) == (
        f"@{first.op}", first.commit, first.op, 2)
    assert checkout.bytes == first.image_bytes > 0
    assert op.kind == "checkout" and op.note == f"checkout {first.commit[:12]}"
    report = op.commit()
    assert headline(env, report) == f"checkout {first.commit[:12]}"
    assert not report.unchanged and report.deleted == ["c"] and report.changed == ["a"]
    # A restored name is a new version, with the content the snapshot had.
    restored = env.image.meta["a"]
    assert (restored.version, restored.op, restored.hash) == (3, report.op, first_hash)


def test_a_commit_reports_its_audit_record(env: CoreEnv) -> None:
    report = env.run("x = 1")
    audit = env.image.audit
    assert report.audit == {"index": audit.published,
                            "hash": audit.entries[audit.published].hash}
    assert audit.read(report.audit["index"])["op"] == report.op
    assert report.events == []


def test_the_commit_id_is_known_from_the_commit_phase_on(env: CoreEnv) -> None:
    op = env.image.begin(source="x = 1")
    assert op.commit_id() is None
    env.ns["x"] = 1
    report = op.commit()
    assert op.commit_id() == report.commit
    unchanged = env.image.begin(source="x")
    assert unchanged.commit().unchanged and unchanged.commit_id() == report.commit


def test_an_op_that_leaves_the_runtimes_own_state_unstorable_is_vetoed(env: CoreEnv) -> None:
    import socket

    sock = socket.socket()
    op = env.image.begin(source="pass")
    env.image.bind("kernos:test", {"conn": sock})
    op.touch("kernos:test")
    with pytest.raises(OpVetoed) as raised:
        op.commit()
    message = str(raised.value)
    assert "what 'human' did left the runtime's own state unstorable: " in message
    assert "socket" in message
    assert "kernos:* names must always persist (a restart would lose the principals, grants, " \
           "tools or subscribers)" in message
    assert "kernos:test" not in env.image.system
    assert op.vetoes == list(raised.value.reasons) and len(op.vetoes) == 1
    sock.close()


def test_the_image_is_the_last_participant_to_vote() -> None:
    from kernos.image.changes import ImageParticipant

    key = ImageParticipant.sort_key(None)  # type: ignore[arg-type]
    assert key == "~kernos.image"
    assert key > "kernos.audit" and key > "kernos.generators"


def test_union_find_groups_names_that_share() -> None:
    from kernos.image.changes import _UnionFind

    sharing = _UnionFind(["d", "c", "b", "a", "e"])
    sharing.union("d", "c")
    sharing.union("b", "d")
    sharing.union("a", "a")
    assert sorted(sharing.groups()) == [["a"], ["b", "c", "d"], ["e"]]
    assert sharing.find("d") == sharing.find("b") == "b"


# -- more of the op's surface --------------------------------------------------------------


def test_a_full_scan_has_a_default_reason(env: CoreEnv) -> None:
    op = env.image.begin(source="pass")
    op.scan_everything()
    env.ns["x"] = 1
    assert op.commit().reach == "everything: a full scan was requested"


def test_an_abort_records_the_status_it_is_given(env: CoreEnv) -> None:
    op = env.image.begin(source="x = 1")
    op.abort(status="conflict", error=("StaleRead", "budget changed"))
    record = last_record(env)
    assert record["status"] == "conflict"
    assert record["error"] == {"kind": "StaleRead", "message": "budget changed"}


def test_a_checkout_puts_the_random_generators_back(env: CoreEnv) -> None:
    first = env.run("import random\nrandom.seed(7)")
    env.run("drawn = random.random()")
    drawn = env.ns["drawn"]
    op = env.image.begin(source="%kernos checkout")
    op.checkout(f"@{first.op}")
    op.commit()
    env.run("again = random.random()")
    assert env.ns["again"] == drawn


# -- how deep a rollback looks for references to reset containers ----------------------------


def test_a_reference_two_levels_down_past_plain_values_is_found(env: CoreEnv) -> None:
    env.run("import socket\nsock = socket.socket()\nrows = [1]\n"
            "db = {'conn': sock, 'deep': {'a': 1, 'b': 'x', 'more': {'n': 2, 'rows': rows}}}")
    db, rows = env.ns["db"], env.ns["rows"]
    report = abort(env, "rows.append(2)\n1/0")
    assert set(report.not_reset) >= {"db", "rows"}
    assert env.ns["db"] is db and rows == [1, 2]
    env.ns["sock"].close()


def test_containers_held_directly_are_swapped_not_searched(env: CoreEnv) -> None:
    # db holds rows, which holds inner: each is held directly by a container of the
    # group, so each is swapped for its live object and everything is reset in place.
    env.run("import socket\nsock = socket.socket()\ninner = [1]\nrows = [inner]\n"
            "db = {'conn': sock, 'rows': rows}")
    db, rows, inner = env.ns["db"], env.ns["rows"], env.ns["inner"]
    report = abort(env, "inner.append(2)\nrows.append(3)\ndb['x'] = 4\n1/0")
    assert sorted(report.reloaded) == ["db", "inner", "rows"] and report.not_reset == []
    assert db == {"conn": env.ns["sock"], "rows": [[1]]}
    assert db["rows"] is rows and rows[0] is inner
    env.ns["sock"].close()


def test_a_function_with_an_empty_cell_does_not_stop_a_rollback(env: CoreEnv) -> None:
    env.run("import socket\nsock = socket.socket()\n"
            "def outer():\n    def inner():\n        return late\n    return inner\n"
            "    late = 1\n"
            "rows = [1]\ndb = {'conn': sock, 'read': outer(), 'rows': rows}")
    db, rows = env.ns["db"], env.ns["rows"]
    report = abort(env, "rows.append(2)\n1/0")
    assert "db" in report.reloaded and db["rows"] is rows and rows == [1]
    env.ns["sock"].close()


def test_the_search_gives_up_as_unsure_when_its_budget_runs_out() -> None:
    from kernos.image.rollback import _reaches

    nested = [[[[1]]]]  # two lists below the direct contents
    assert _reaches(nested, {}, budget=3) is False
    assert _reaches(nested, {}, budget=2) is True  # unsure means yes
    assert _reaches(nested, {}, budget=1) is True


def test_classes_are_not_searched() -> None:
    from kernos.image.rollback import _reaches

    root = [1]

    class Holder:
        held = root

    assert _reaches([[Holder]], {id(root): root}) is False
    assert _reaches([[root]], {id(root): root}) is True


# -- the commit's phases and the rollback's bookkeeping ---------------------------------------


def test_a_commit_passes_its_crash_points_in_order_and_times_itself(
        env: CoreEnv, points_passed: list[str]) -> None:
    passed = points_passed
    report = env.run("x = [1] * 1000")
    assert [name for name in passed if name in ("serialize", "objects", "sealed")] == [
        "serialize", "objects", "sealed"]
    timings = report.timings_ms
    assert {"analyze", "serialize", "write", "publish", "total"} <= set(timings)
    assert 0 <= timings["publish"] <= timings["total"] < 600_000
    assert timings["total"] >= timings["analyze"] + timings["serialize"]
    assert env.image.head_op == report.op
    unchanged = env.run("x[0]")
    assert unchanged.unchanged and env.image.head_op == report.op


def test_a_rollback_after_a_full_scan_reloads_what_the_code_did_not_name(env: CoreEnv) -> None:
    env.run("items = [1]")
    op = env.image.begin(source="pass")
    env.ns["items"].append(2)
    op.scan_everything()
    report = op.abort(error=ValueError("no"))
    assert report.op == op.id and report.reloaded == ["items"] and env.ns["items"] == [1]


def test_the_runtimes_own_names_are_not_in_the_rollback_report(env: CoreEnv) -> None:
    op = env.image.begin(source="x = 1")
    env.image.bind("kernos:test", {"a": 1})
    env.ns["x"] = 1
    report = op.abort(error=ValueError("no"))
    assert report.removed == ["x"] and "kernos:test" not in env.image.system


def test_several_groups_are_reloaded_and_stay_reloaded(env: CoreEnv) -> None:
    env.run("a = [1]\nb = {'k': 1}")
    a, b = env.ns["a"], env.ns["b"]
    report = abort(env, "a.append(2)\nb['k'] = 2\n1/0")
    assert report.reloaded == ["a", "b"]
    assert env.ns["a"] == [1] and env.ns["b"] == {"k": 1}
    assert env.ns["a"] is not a and env.ns["b"] is not b  # fresh copies of what was committed
    # A later rollback that does not reach them leaves the reloaded values alone.
    later = abort(env, "c = 3\n1/0")
    assert later.reloaded == [] and later.removed == ["c"]
    assert env.ns["a"] == [1] and env.ns["b"] == {"k": 1}
    assert env.run("d = a + [2]").added == ["d"] and env.ns["d"] == [1, 2]


def test_several_groups_holding_live_resources_are_all_reported(env: CoreEnv) -> None:
    env.run("import socket\ns1 = socket.socket()\ns2 = socket.socket()\n"
            "r1 = [1]\nr2 = [1]\n"
            "d1 = {'conn': s1, 'deep': {'rows': r1}}\nd2 = {'conn': s2, 'deep': {'rows': r2}}")
    report = abort(env, "r1.append(2)\nr2.append(2)\n1/0")
    assert set(report.not_reset) >= {"d1", "r1", "d2", "r2"}
    env.ns["s1"].close()
    env.ns["s2"].close()


def test_a_checkout_of_the_head_still_writes_a_snapshot(env: CoreEnv) -> None:
    first = env.run("x = [1]")
    op = env.image.begin(source="%kernos checkout")
    op.checkout("HEAD")
    report = op.commit()
    assert not report.unchanged and report.commit != first.commit
    assert report.kind == "checkout"


def test_the_first_op_of_a_workspace_writes_a_snapshot_even_if_empty(tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "fresh")
    try:
        report = env.run("pass")
        assert not report.unchanged and report.commit
        assert env.workspace is not None
        assert env.workspace.head() == bytes.fromhex(report.commit)
    finally:
        env.close()


def test_a_name_rebound_to_a_new_live_resource_is_a_new_version(env: CoreEnv) -> None:
    env.run("import socket\nsock = socket.socket()")
    old = env.ns["sock"]
    report = env.run("sock = socket.socket()")
    assert report.changed == ["sock"] and env.image.meta["sock"].version == 2
    old.close()
    env.ns["sock"].close()


def test_the_size_of_a_name_counts_its_buffers(env: CoreEnv) -> None:
    np = pytest.importorskip("numpy")
    env.ns["np"] = np
    env.run("data = np.zeros(100_000)")
    assert env.image.meta["data"].size >= 800_000


def test_a_registered_participant_moves_with_every_op(env: CoreEnv) -> None:
    """A floor above the image (the memory, say) takes part through kernos.op's registry."""
    import kernos.op
    from kernos.testing import RecordingParticipant

    made: list[RecordingParticipant] = []

    def factory(op: kernos.op.Op) -> RecordingParticipant | None:
        if op.kind != "cell":
            return None  # a factory may leave an op alone
        made.append(RecordingParticipant("memory"))
        return made[-1]

    kernos.op.register_participant(factory)
    kernos.op.register_participant(factory)  # once is enough
    try:
        env.run("x = 1")
        abort(env, "x = 2\nraise ValueError")
        env.image.begin(kind="other").abort()
    finally:
        kernos.op._factories.remove(factory)
    assert [participant.calls for participant in made] == [
        ["tpc_begin", "commit", "tpc_vote", "tpc_finish"], ["abort"]]
    assert env.ns["x"] == 1
