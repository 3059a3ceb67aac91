"""Personal data: the wrapper, the keyring, no plaintext on disk, and erasure (I8).

Subjects are unique per test: live wrappers are tracked per subject for the
whole process, and erasing a subject erases every live wrapper of it.
"""

from __future__ import annotations

import contextlib
import copy
import json
import pickle
import threading
import types
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core_support import CoreEnv
from kernos.audit import erase, verify
from kernos.errors import ErasedValue, EventError, UnknownSubject, UsageError
from kernos.personal import Keyring, Personal, personal


def new_subject() -> str:
    return f"c-{uuid.uuid4().hex[:10]}"


# -- the wrapper ----------------------------------------------------------------------------


def test_repr_and_str_hide_the_value() -> None:
    subject = new_subject()
    value = personal("Ada Lovelace", subject=subject)
    assert repr(value) == f"personal(<hidden>, subject={subject!r})"
    assert str(value) == repr(value) and f"{value}" == repr(value)
    assert "Ada" not in repr([value, {"k": value}])
    assert isinstance(value, Personal) and value.subject == subject and not value.erased


def test_reveal_and_value_return_the_value_itself() -> None:
    inner = {"name": "Ada", "born": 1815}
    value = personal(inner, subject=new_subject())
    assert value.reveal() is inner and value.value is inner


def test_equality_compares_subject_and_value() -> None:
    subject = new_subject()
    assert personal([1, 2], subject=subject) == personal([1, 2], subject=subject)
    assert personal([1, 2], subject=subject) != personal([1, 3], subject=subject)
    assert personal([1, 2], subject=subject) != personal([1, 2], subject=new_subject())
    assert personal("x", subject=subject) != "x"


def test_a_personal_value_is_not_hashable() -> None:
    value = personal("x", subject=new_subject())
    with pytest.raises(TypeError):
        hash(value)
    with pytest.raises(TypeError):
        {value}  # noqa: B018


def test_copy_shares_and_deepcopy_copies_the_value() -> None:
    value = personal({"list": [1]}, subject=new_subject())
    assert copy.copy(value) is value
    copied = copy.deepcopy(value)
    assert copied is not value and copied == value
    assert copied.subject == value.subject
    assert copied.reveal() is not value.reveal()
    assert copied.reveal()["list"] is not value.reveal()["list"]
    holder = copy.deepcopy({"a": value, "b": value})
    assert holder["a"] is holder["b"]  # sharing kept inside one deepcopy


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_plain_pickling_is_refused(protocol: int) -> None:
    value = personal("secret", subject=new_subject())
    with pytest.raises(TypeError, match="reveal"):
        pickle.dumps(value, protocol=protocol)
    with pytest.raises(TypeError, match="reveal"):
        pickle.dumps({"nested": [value]}, protocol=protocol)


@pytest.mark.parametrize("make", [
    lambda: (lambda: 1),
    threading.Lock,
    lambda: (x for x in range(3)),
    lambda: types.ModuleType("m"),
], ids=["lambda", "lock", "generator", "module"])
def test_a_value_pickle_cannot_store_is_refused_at_construction(make: Any) -> None:
    value = make()
    with pytest.raises(UsageError, match="cannot be sealed") as caught:
        personal(value, subject=new_subject())
    assert type(value).__name__ in str(caught.value)


def test_a_personal_value_cannot_be_wrapped_twice() -> None:
    subject = new_subject()
    with pytest.raises(UsageError, match="wrap the plain value once"):
        personal(personal(1, subject=subject), subject=subject)


@pytest.mark.parametrize("subject", [
    "", " c-1", "-c", ".c", "c 1", "a" * 129, "c/1", "\u00e9t\u00e9", "c\n", 42, None, b"c-1",
])
def test_invalid_subjects_are_refused(subject: object) -> None:
    with pytest.raises(UsageError, match="data subject"):
        personal("x", subject=subject)  # type: ignore[arg-type]


@pytest.mark.parametrize("subject", ["c-1042", "a" * 128, "user@example.org", "X:1+2_3.4"])
def test_valid_subjects_are_accepted(subject: str) -> None:
    assert personal(1, subject=subject).subject == subject


# -- the keyring ----------------------------------------------------------------------------


def test_sealing_is_deterministic_per_subject(tmp_path: Path) -> None:
    keyring = Keyring(tmp_path / "keys", durable=False)
    first = keyring.seal(["c-1"], b"plaintext")
    assert keyring.seal(["c-1"], b"plaintext") == first
    assert keyring.seal(["c-2"], b"plaintext") != first
    assert keyring.seal(["c-1"], b"plaintext!") != first
    assert b"plaintext" not in first
    assert keyring.open(["c-1"], first) == b"plaintext"
    assert keyring.open(["c-2"], first) is None  # another subject's key
    assert Keyring(tmp_path / "keys").open(["c-1"], first) == b"plaintext"  # keys persist
    assert keyring.subjects() == ["c-1", "c-2"]


def test_tampered_or_foreign_ciphertext_does_not_open(tmp_path: Path) -> None:
    keyring = Keyring(tmp_path / "keys", durable=False)
    sealed = keyring.seal(["c-1"], b"plaintext")
    flipped = sealed[:-1] + bytes([sealed[-1] ^ 1])
    assert keyring.open(["c-1"], flipped) is None
    assert keyring.open(["c-1"], b"not sealed at all") is None
    assert keyring.open(["unknown"], sealed) is None
    assert keyring.key("unknown") is None  # opening never creates a key


def test_open_fails_after_destroy(tmp_path: Path) -> None:
    keyring = Keyring(tmp_path / "keys", durable=False)
    sealed = keyring.seal(["c-1"], b"plaintext")
    key_files = list((tmp_path / "keys").glob("*.key"))
    assert len(key_files) == 1
    assert keyring.destroy("c-1") is True
    assert keyring.open(["c-1"], sealed) is None
    assert Keyring(tmp_path / "keys").open(["c-1"], sealed) is None
    assert not key_files[0].exists()
    assert keyring.destroy("c-1") is False
    assert keyring.subjects() == []


def test_combined_keys_need_every_subject(tmp_path: Path) -> None:
    keyring = Keyring(tmp_path / "keys", durable=False)
    both = keyring.seal(["c-a", "c-b", "c-c"], b"shared secret")
    only_b = keyring.seal(["c-b"], b"b's own")
    assert keyring.open(["c-c", "c-a", "c-b"], both) == b"shared secret"  # any order
    assert keyring.open(["c-a", "c-b"], both) is None
    assert keyring.open(["c-a"], both) is None
    keyring.destroy("c-a")
    assert keyring.open(["c-a", "c-b", "c-c"], both) is None
    assert keyring.open(["c-b"], only_b) == b"b's own"


@pytest.mark.parametrize("destroyed", ["c-a", "c-b"])
def test_destroying_any_one_subject_shreds_a_combined_value(tmp_path: Path,
                                                            destroyed: str) -> None:
    keyring = Keyring(tmp_path / "keys", durable=False)
    sealed = keyring.seal(["c-a", "c-b"], b"joint record")
    keyring.destroy(destroyed)
    assert Keyring(tmp_path / "keys").open(["c-a", "c-b"], sealed) is None


# -- in a workspace -------------------------------------------------------------------------


class Env(CoreEnv):
    def __init__(self, path: Path) -> None:
        super().__init__(path, hidden={"personal": personal})


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    opened = Env(tmp_path / "ws")
    yield opened
    opened.close()


def files_holding(root: Path, needles: list[bytes]) -> list[str]:
    """Every file under ``root`` whose bytes, or whose zlib-inflated bytes, hold a needle."""
    found = []
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        data = path.read_bytes()
        views = [data]
        with contextlib.suppress(zlib.error):
            views.append(zlib.decompress(data))  # loose git objects, and anything else zlib
        if any(needle in view for needle in needles for view in views):
            found.append(str(path.relative_to(root)))
    return found


PLAINTEXTS = [b"PLAINTEXT-ada-lovelace-1815", b"PLAINTEXT-profile-mail-77",
              b"PLAINTEXT-aborted-op-42", b"PLAINTEXT-big-code-99"]


def build_personal_workspace(env: Env, subject: str) -> dict[str, Any]:
    """Commit personal values in every way the image and the audit log hold data."""
    env.run(f"secret = personal('PLAINTEXT-ada-lovelace-1815', subject={subject!r})")
    events = env.run(
        f"profile = {{'email': personal('PLAINTEXT-profile-mail-77', subject={subject!r}), "
        "'tags': ['vip']}\n"
        "bus.emit('crm.updated', {'who': profile['email'], 'plain': 'visible'})").events
    op = env.image.begin(source=f"tmp = personal('PLAINTEXT-aborted-op-42', subject={subject!r})")
    exec(f"tmp = personal('PLAINTEXT-aborted-op-42', subject={subject!r})", env.ns)
    op.abort(error=("ValueError", "changed my mind"))
    big = env.run(f"big = personal('PLAINTEXT-big-code-99', subject={subject!r})\n"
                  + "# padding\n" * 600)
    return {"events": events, "big": big}


def test_no_personal_plaintext_reaches_any_file(env: Env) -> None:
    subject = new_subject()
    built = build_personal_workspace(env, subject)
    # in memory, and to in-process readers, the values are there
    assert env.ns["secret"].reveal() == "PLAINTEXT-ada-lovelace-1815"
    assert built["events"][0]["payload"]["who"] == {
        "$personal": {"subject": subject, "value": "PLAINTEXT-profile-mail-77"}}
    assert "PLAINTEXT-big-code-99" in (env.image.audit.code(built["big"].op) or "")
    env.close()
    assert files_holding(env.path, PLAINTEXTS) == []
    assert files_holding(env.path, [b"visible"]) != []  # the scan sees what is plain
    assert files_holding(env.path, [subject.encode()]) != []  # subject ids are kept, by design
    env.reopen()
    assert env.ns["secret"].reveal() == "PLAINTEXT-ada-lovelace-1815"
    assert env.ns["profile"]["email"].reveal() == "PLAINTEXT-profile-mail-77"
    assert "tmp" not in env.ns


def test_the_plaintext_scan_can_fail(env: Env) -> None:
    env.run("harmless = 1")
    env.close()
    assert files_holding(env.path, PLAINTEXTS[:1]) == []
    (env.path / "notes.txt").write_bytes(b"raw " + PLAINTEXTS[0])
    objects = env.path / "history.git" / "objects" / "ff"
    objects.mkdir(exist_ok=True)
    (objects / ("0" * 38)).write_bytes(zlib.compress(b"blob 32\0" + PLAINTEXTS[1]))
    assert files_holding(env.path, PLAINTEXTS) == ["history.git/objects/ff/" + "0" * 38,
                                                   "notes.txt"]


def test_the_commit_of_an_op_that_tagged_personal_data_hides_its_code(env: Env) -> None:
    import subprocess

    subject = new_subject()
    report = env.run(f"secret = personal('PLAINTEXT-ada-lovelace-1815', subject={subject!r})")
    git = ["git", "-C", str(env.path / "history.git")]
    assert env.workspace is not None
    env.workspace.fold()  # git itself sees the commits of the tail once folded
    message = subprocess.run([*git, "log", "-1", "--format=%B", report.commit],
                             capture_output=True, text=True, check=True).stdout
    assert "(code sealed: it tagged personal data)" in message
    source = subprocess.run([*git, "show", f"{report.commit}:source.py"],
                            capture_output=True, text=True, check=True).stdout
    assert "PLAINTEXT" not in source and subject in source
    code = env.image.audit.read(report.audit["index"])["code"]
    assert code["sealed"] == [subject] and "text" not in code and "sha256" not in code


def test_a_personal_value_inside_an_event_payload_must_be_json(env: Env) -> None:
    op = env.image.begin(source="...")
    with pytest.raises(EventError, match="a personal value"):
        env.bus.emit("t", {"p": personal((1, 2), subject=new_subject())})
    assert op.events == []
    op.abort()


# -- erasure --------------------------------------------------------------------------------


def key_of(env: Env, subject: str) -> tuple[Path, bytes]:
    for path in (env.path / "keys").glob("*.key"):
        data = json.loads(path.read_text())
        if data["subject"] == subject:
            return path, bytes.fromhex(data["key"])
    raise AssertionError(f"no key for {subject}")


def test_erasing_an_unknown_subject_is_refused_and_changes_nothing(env: Env) -> None:
    known = new_subject()
    env.run(f"secret = personal('x', subject={known!r})")
    length = len(env.image.audit)
    with pytest.raises(UnknownSubject) as caught:
        erase(env.image.audit, "c-never-seen")
    assert caught.value.subject == "c-never-seen"
    assert caught.value.known == [known]
    assert "Nothing was changed" in str(caught.value)
    assert len(env.image.audit) == length
    assert env.ns["secret"].reveal() == "x"
    with pytest.raises(UsageError, match="data subject"):
        erase(env.image.audit, "not a subject")


def test_erasure_removes_every_readable_copy_and_the_chain_still_verifies(env: Env) -> None:
    subject, other = new_subject(), new_subject()
    built = build_personal_workspace(env, subject)
    env.run(f"kept = personal('OTHER-SUBJECT-VALUE', subject={other!r})")
    key_path, key = key_of(env, subject)
    code_op = built["big"].op
    live = env.ns["secret"]

    report = erase(env.image.audit, subject)

    assert report.subject == subject and report.key_destroyed
    assert report.payloads  # the sealed code and event payloads
    assert report.live >= 3
    assert live.erased and repr(live) == f"personal(<erased>, subject={subject!r})"
    with pytest.raises(ErasedValue) as caught:
        live.reveal()
    assert caught.value.subject == subject
    assert live == live and copy.deepcopy(live) is live
    assert live != env.ns["big"]  # erased values are equal only to themselves
    with pytest.raises(TypeError):
        pickle.dumps(live)
    record = env.image.audit.read(report.record)
    assert (record["type"], record["subject"], record["key_destroyed"]) == (
        "erasure", subject, True)
    assert sorted(record["refs"]) == sorted(report.payloads)
    assert env.image.audit.code(code_op) is None
    assert env.ns["kept"].reveal() == "OTHER-SUBJECT-VALUE"

    with pytest.raises(UsageError, match="already erased"):
        erase(env.image.audit, subject)

    assert verify(env.path).ok  # while the image is open
    env.reopen()
    for name in ("secret", "big"):
        assert env.ns[name].erased
        assert repr(env.ns[name]) == f"personal(<erased>, subject={subject!r})"
        with pytest.raises(ErasedValue):
            env.ns[name].reveal()
    assert env.ns["profile"]["email"].erased and env.ns["profile"]["tags"] == ["vip"]
    assert env.ns["kept"].reveal() == "OTHER-SUBJECT-VALUE"
    payload = env.image.audit.events_since()[0]["payload"]
    assert payload == {"plain": "visible",
                       "who": {"$personal": {"subject": subject, "erased": True}}}
    assert env.image.audit.code(code_op) is None
    env.run("after = 1")  # the image goes on; erased values commit as erased
    env.close()

    report_after = verify(env.path)
    assert report_after.ok, report_after.summary()
    assert not key_path.exists()
    assert files_holding(env.path, [key, key.hex().encode()]) == []
    assert files_holding(env.path, PLAINTEXTS) == []
    with pytest.raises(UsageError, match="already erased"):
        erase(env.reopen().image.audit, subject)  # in a new process, too


@pytest.mark.parametrize("where", ["before", "among", "after"])
def test_an_anchor_taken_around_the_sealed_records_survives_their_erasure(env: Env,
                                                                          where: str) -> None:
    """Erasure only appends: an anchor taken before it still verifies with ``since``, whether
    the records whose payloads it deletes lie before the anchor or in the range."""
    subject = new_subject()
    if where == "before":
        env.run("start = 1")
        anchor = verify(env.path).head  # the sealed records all come after it
    build_personal_workspace(env, subject)
    if where == "among":
        anchor = f"2:{env.image.audit.read(2)['hash']}"  # between the sealed records
    elif where == "after":
        anchor = verify(env.path).head
    erase(env.image.audit, subject)
    env.run("after = 1")
    env.close()
    since = verify(env.path, since=anchor)
    assert since.ok, since.summary()
    assert since.verified[1] == since.records - 1 and since.verified[0] > 0
    assert verify(env.path).ok


def test_checking_out_a_snapshot_from_before_the_erasure_shows_erased_values(env: Env) -> None:
    subject = new_subject()
    first = env.run(f"secret = personal({{'name': 'PLAINTEXT-x'}}, subject={subject!r})")
    env.run("del secret")
    erase(env.image.audit, subject)
    op = env.image.begin()
    checkout = op.checkout(first.commit)
    op.commit()
    assert checkout.op == first.op
    assert env.ns["secret"].erased
    with pytest.raises(ErasedValue):
        env.ns["secret"].reveal()
    assert verify(env.path).ok


def test_an_erasure_cut_short_by_a_crash_is_finished_on_reopen(env: Env) -> None:
    subject = new_subject()
    env.run(f"secret = personal('PLAINTEXT-y', subject={subject!r})")
    env.close()
    key_path, key = key_of(env, subject)
    # what erase() writes (and syncs) before it touches anything else
    key_path.with_suffix(".erasing").write_text(json.dumps({"subject": subject}))
    env.reopen()
    assert f"finished erasing the data subject {subject!r}" in (
        env.restore_report.recovery or "")
    assert env.ns["secret"].erased
    assert not key_path.exists() and not key_path.with_suffix(".erasing").exists()
    assert [r["subject"] for r in env.image.audit.records(type="erasure")] == [subject]
    env.close()
    assert files_holding(env.path, [key, key.hex().encode(), b"PLAINTEXT-y"]) == []
    assert verify(env.path).ok


def test_an_llm_exchange_that_touched_personal_data_is_sealed_and_erased_with_it(
        tmp_path: Path) -> None:
    """Prompts and answers recorded in ``<workspace>/llm/`` by an op that created or
    revealed a subject's values are sealed under its key: erasure shreds and deletes
    them, and a replay of that request says why it cannot be answered."""
    from kernos.agents import AgentRuntime, Agents
    from kernos.errors import LLMRecordingErased

    env = CoreEnv(tmp_path / "ws")
    agents = Agents(lambda: runtime)
    runtime = AgentRuntime(env.image)
    op = env.image.begin(source="who = personal('Ada Lovelace', subject='c-1042')")
    env.ns["who"] = personal("Ada Lovelace", subject="c-1042")
    op.commit()

    def ask(content: str, answer: str, *, reveal: bool = True, **options: Any) -> Any:
        op = env.image.begin(source="ask")
        try:
            if reveal and "Lovelace" in content:  # the name comes out of the wrapper here
                content = content.replace("Lovelace", env.ns["who"].reveal().split()[1])
            completion = agents.llm("gpt-4o-mini", [{"role": "user", "content": content}],
                                    mock_response=answer, max_tokens=20, **options)
        except BaseException:
            op.abort()
            raise
        op.commit()
        return completion

    ask("Write to Lovelace", "Dear Ada Lovelace,")  # revealed in this op: sealed
    ask("Name a sea.", "The Baltic.")  # touched no personal data: kept plain
    stored = b"".join(path.read_bytes() for path in (tmp_path / "ws" / "llm").rglob("*")
                      if path.is_file())
    assert b"Lovelace" not in stored and b"The Baltic." in stored
    assert stored.count(b"$kernos_sealed") == 2
    assert ask("Write to Lovelace", "Dear Ada Lovelace,").cached  # from its sealed recording

    report = erase(env.image.audit, "c-1042")
    assert report.recordings == 2  # the request and the answer
    stored = b"".join(path.read_bytes() for path in (tmp_path / "ws" / "llm").rglob("*")
                      if path.is_file())
    # The sealed bytes are gone (not only unreadable); a note names the subject.
    assert b"$kernos_sealed" not in stored and b"The Baltic." in stored
    assert env.image.audit.records()[-1]["recordings"] == 2
    with pytest.raises(LLMRecordingErased, match="c-1042"):
        ask("Write to Lovelace", "Dear Ada Lovelace,", reveal=False, mode="replay")
    assert verify(tmp_path / "ws").ok
    env.close()
