"""The image in-process: commits, rollbacks, restores and checkouts (no kernel)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from kernos import CommitFailed, RestoreError, Unpersisted, UnpersistedValueError, history
from kernos.audit.offline import checkout_offline


def git(workspace_path: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(workspace_path / "history.git"), *args],
                          capture_output=True, text=True, check=True).stdout


def commits(session) -> int:  # type: ignore[no-untyped-def]
    session.image.workspace.fold()  # git itself sees the commits of the tail once folded
    return int(git(session.image.workspace.path, "rev-list", "--count", "main").strip() or 0)


def spy_dumps(session, monkeypatch) -> list[list[str]]:  # type: ignore[no-untyped-def]
    """Record the root names of every pickle the image makes."""
    calls: list[list[str]] = []
    original = session.image.serializer.dump

    def dump(roots, **kwargs):  # type: ignore[no-untyped-def]
        calls.append([name for name, _ in roots])
        return original(roots, **kwargs)

    monkeypatch.setattr(session.image.serializer, "dump", dump)
    return calls


def test_committed_state_comes_back_in_a_new_session(session, reopen) -> None:  # type: ignore[no-untyped-def]
    report = session.run("x = 41\nitems = ['a', 'b']\ndef f(): return x + 1")
    assert report.added == ["f", "items", "x"]
    restored = reopen(session.image.workspace)
    assert restored.namespace["x"] == 41
    assert restored.namespace["items"] == ["a", "b"]
    assert restored.namespace["f"]() == 42


def test_untouched_values_are_neither_pickled_nor_written(session, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    session.run("import numpy as np\nbig = np.random.rand(2_000_000)\ncounter = 0")
    dumps = spy_dumps(session, monkeypatch)
    report = session.run("counter += 1")
    assert report.changed == ["counter"]
    assert dumps == [["counter"]]
    assert report.bytes_written < 10_000  # the int, its tree, the manifest, the commit


def test_in_place_change_through_a_function_from_an_earlier_op_is_committed(
    session, reopen, monkeypatch,
) -> None:  # type: ignore[no-untyped-def]
    session.run("log = []\ndef record(event):\n    log.append(event)")
    report = session.run("record('started')")  # the cell never names `log`
    assert report.changed == ["log"]
    assert reopen(session.image.workspace).namespace["log"] == ["started"]


def test_in_place_change_through_a_method_is_committed(session, reopen) -> None:  # type: ignore[no-untyped-def]
    session.run("registry = {}\nclass Counter:\n    def bump(self):\n"
                "        registry['n'] = registry.get('n', 0) + 1\nc = Counter()")
    session.run("c.bump()")
    assert reopen(session.image.workspace).namespace["registry"] == {"n": 1}


def test_rebinding_through_global_is_seen_by_identity(session, reopen) -> None:  # type: ignore[no-untyped-def]
    session.run("x = 1\ndef set_x(value):\n    global x\n    x = value")
    session.run("set_x(5)")
    assert reopen(session.image.workspace).namespace["x"] == 5


def test_dynamic_namespace_access_checks_everything(session, reopen) -> None:  # type: ignore[no-untyped-def]
    session.run("data = [1]")
    report = session.run("globals()['da' + 'ta'].append(2)")
    assert report.reach.startswith("everything")
    assert report.changed == ["data"]
    assert reopen(session.image.workspace).namespace["data"] == [1, 2]


def test_names_that_share_objects_are_stored_together(session, reopen) -> None:  # type: ignore[no-untyped-def]
    session.run("a = [1, 2]\nb = {'ref': a}\nc = [a, a]\nd = 'alone'")
    groups = {tuple(state.stored.names) for state in session.image.groups.values()}
    assert ("a", "b", "c") in groups and ("d",) in groups
    restored = reopen(session.image.workspace).namespace
    assert restored["b"]["ref"] is restored["a"] and restored["c"][1] is restored["a"]


def test_sharing_created_in_a_later_op_is_preserved(session, reopen) -> None:  # type: ignore[no-untyped-def]
    session.run("a = [1]")
    session.run("b = {'ref': a}")
    session.run("a.append(2)")
    restored = reopen(session.image.workspace).namespace
    assert restored["b"]["ref"] is restored["a"] and restored["a"] == [1, 2]


def test_values_sharing_only_immutable_objects_are_stored_apart(session, reopen) -> None:  # type: ignore[no-untyped-def]
    session.run("import datetime, re\nimport numpy as np\nx = np.zeros(3)\ny = np.ones(3)\n"
                "when = datetime.date(2026, 1, 1)\nflag = re.IGNORECASE\n"
                "a = {'when': when, 'flag': flag, 'one': 1}\nb = [when, flag, 'one']")
    groups = {tuple(state.stored.names) for state in session.image.groups.values()}
    assert {("x",), ("y",), ("a",), ("b",)} <= groups  # a dtype, a date or an enum is no bond
    restored = reopen(session.image.workspace).namespace
    assert restored["a"]["flag"] is restored["b"][1] is re.IGNORECASE


def test_groups_split_when_sharing_ends(session) -> None:  # type: ignore[no-untyped-def]
    session.run("a = [1]\nb = {'ref': a}")
    session.run("b = {}")
    groups = {tuple(state.stored.names) for state in session.image.groups.values()}
    assert groups == {("a",), ("b",)}


def test_deleting_a_name_removes_it_from_the_next_snapshot(session, reopen) -> None:  # type: ignore[no-untyped-def]
    session.run("a = 1\nb = 2")
    report = session.run("del a")
    assert report.deleted == ["a"]
    restored = reopen(session.image.workspace).namespace
    assert "a" not in restored and restored["b"] == 2


def test_abort_restores_rebinds_removes_and_reloads_only_what_changed(session) -> None:  # type: ignore[no-untyped-def]
    session.run("keep = {'x': 1}\nother = [1, 2]\nnumber = 7\nuntouched = ['same']")
    originals = {name: session.namespace[name] for name in ("keep", "other", "untouched")}
    with pytest.raises(ZeroDivisionError):
        session.run("number = 8\nnew_name = 1\nother.append(3)\nprint(keep)\ndel untouched\n1/0")
    ns = session.namespace
    assert ns["number"] == 7 and "new_name" not in ns
    assert ns["other"] == [1, 2]
    assert ns["untouched"] is originals["untouched"]  # put back by identity
    assert ns["keep"] is originals["keep"]  # read, unchanged: not reloaded
    assert ns["other"] is not originals["other"]  # mutated: reloaded from the snapshot


def test_abort_gives_back_live_resources_of_a_reloaded_group(session, tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "f.txt").write_text("line one\nline two\n")
    session.run(f"handle = open({str(tmp_path / 'f.txt')!r})\nstate = {{'h': handle, 'n': 0}}")
    with pytest.raises(RuntimeError):
        session.run("state['n'] += 1\nraise RuntimeError")
    ns = session.namespace
    assert ns["state"]["n"] == 0
    assert ns["state"]["h"] is ns["handle"]
    assert ns["handle"].readline() == "line one\n"  # still the live, open file


def test_failed_commit_rolls_back_and_leaves_no_trace(session, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    session.run("data = [1]")
    before = commits(session)
    objects = session.image.workspace.objects
    real_write = objects.write
    calls = {"n": 0}

    def failing_write(kind, data, sha, **options):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(28, "No space left on device")
        return real_write(kind, data, sha, **options)

    monkeypatch.setattr(objects, "write", failing_write)
    with pytest.raises(CommitFailed, match="No space left on device") as raised:
        session.run("data.append(2)\nbig = list(range(100_000))")
    assert raised.value.op is not None
    assert session.namespace["data"] == [1] and "big" not in session.namespace
    assert commits(session) == before
    # The audit record of the op that failed says why, as the user was told.
    last = session.image.audit.read(len(session.image.audit.entries) - 1)
    assert (last["op"], last["status"]) == (raised.value.op, "rolled back"), last
    assert last["error"]["kind"] == "OSError", last
    assert "No space left on device" in last["error"]["message"], last
    monkeypatch.setattr(objects, "write", real_write)
    fsck = subprocess.run(["git", "-C", str(session.image.workspace.git_dir), "fsck", "--full",
                           "--strict", "--dangling"], capture_output=True, text=True)
    assert fsck.returncode == 0 and "dangling" not in fsck.stdout + fsck.stderr
    assert session.run("data.append(3)").changed == ["data"]


def test_unpersistable_values_are_reported_and_come_back_as_placeholders(
    session, reopen, tmp_path,
) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "f.txt").write_text("x")
    report = session.run(f"import threading\nres = {{'file': open({str(tmp_path / 'f.txt')!r}), "
                         "'n': 3}\nworker = threading.Thread(target=print)")
    paths = sorted(info["path"] for info in report.unpersisted)
    assert paths == ["res['file']", "worker"]
    restored = reopen(session.image.workspace).namespace
    assert restored["res"]["n"] == 3
    placeholder = restored["res"]["file"]
    assert isinstance(placeholder, Unpersisted) and "open files" in repr(placeholder)
    with pytest.raises(UnpersistedValueError, match=r"res\['file'\]"):
        placeholder.read()


def test_restored_values_are_not_reported_as_changed(session, reopen) -> None:  # type: ignore[no-untyped-def]
    session.run("import enum, dataclasses\nclass Base:\n    def hi(self): return 'hi'\n"
                "class Child(Base):\n    def hi(self): return super().hi() + '!'\n"
                "@dataclasses.dataclass\nclass P:\n    x: int\n"
                "class Color(enum.Enum):\n    RED = 1\n"
                "objs = [Child(), P(1), Color.RED]\nf = lambda v: v + 1\n"
                "fh = open('/dev/null')")
    restored = reopen(session.image.workspace)
    report = restored.run("x = (objs, f, fh, Base, Child, P, Color)")
    assert report.added == ["x"]
    assert report.changed == [], "a restore must round-trip to the same pickled bytes"


def test_a_group_that_cannot_be_restored_keeps_its_data(
    session, reopen, tmp_path, monkeypatch,
) -> None:  # type: ignore[no-untyped-def]
    module_dir = tmp_path / "mods"
    module_dir.mkdir()
    (module_dir / "vanishing.py").write_text("class Thing:\n    def __init__(self): self.v = 1\n")
    monkeypatch.syspath_prepend(str(module_dir))
    session.run("import vanishing\nthing = vanishing.Thing()\nother = 2")
    import sys

    del sys.modules["vanishing"]
    (module_dir / "vanishing.py").unlink()
    restored = reopen(session.image.workspace)
    assert restored.namespace["other"] == 2
    assert isinstance(restored.namespace["thing"], Unpersisted)
    assert "vanishing" in restored.namespace["thing"].reason
    assert set(restored.restore_report.failed) == {"thing", "vanishing"}
    restored.run("other = 3\nprint(thing)")  # the placeholders must not overwrite the data
    (module_dir / "vanishing.py").write_text("class Thing:\n    def __init__(self): self.v = 1\n")
    fixed = reopen(restored.image.workspace)
    assert fixed.namespace["thing"].v == 1 and fixed.namespace["other"] == 3


def test_checkout_is_a_new_op_that_restores_an_old_image(session, reopen) -> None:  # type: ignore[no-untyped-def]
    first = session.run("a = [1]\nb = {'ref': a}")
    session.run("a.append(2)\nc = 'later'")
    count = commits(session)
    op = session.image.begin(source="%kernos checkout")
    op.checkout(f"@{first.op}")
    report = op.commit()
    assert report.kind == "checkout" and report.deleted == ["c"]
    assert commits(session) == count + 1
    ns = session.namespace
    assert ns["a"] == [1] and ns["b"]["ref"] is ns["a"] and "c" not in ns
    restored = reopen(session.image.workspace).namespace
    assert restored["a"] == [1] and "c" not in restored


def test_a_checkout_in_a_failed_op_is_rolled_back(session) -> None:  # type: ignore[no-untyped-def]
    session.run("x = 1")
    session.run("x = 2")
    op = session.image.begin(source="checkout then fail")
    op.checkout("HEAD~1")
    assert session.namespace["x"] == 1
    op.abort()
    assert session.namespace["x"] == 2


def test_checkout_of_an_unknown_ref_changes_nothing(session) -> None:  # type: ignore[no-untyped-def]
    session.run("x = 1")
    op = session.image.begin(source="bad checkout")
    with pytest.raises(Exception, match="names no snapshot"):
        op.checkout("@42")
    op.abort()
    assert session.namespace["x"] == 1


def test_offline_checkout_and_history_views(session, reopen) -> None:  # type: ignore[no-untyped-def]
    first = session.run("x = 1\ny = [1]")
    session.run("x = 2\ndel y\nz = 'new'")
    workspace = session.image.workspace
    entries = history.log(workspace)
    assert [entry.op for entry in entries] == [2, 1]
    assert entries[0].changes == {"added": ["z"], "changed": ["x"], "deleted": ["y"]}
    difference = history.diff(workspace, f"@{first.op}", "HEAD")
    assert list(difference.added) == ["z"] and list(difference.deleted) == ["y"]
    assert list(difference.changed) == ["x"]
    text = history.format_diff(difference)
    assert "+  z" in text and "-  y" in text and "1  ->  2" in text
    shown = history.show(workspace, f"@{first.op}")
    assert shown["source"] == "x = 1\ny = [1]"
    commit = checkout_offline(workspace, f"@{first.op}")
    assert workspace.head().hex() == commit
    restored = reopen(workspace).namespace
    assert restored["x"] == 1 and restored["y"] == [1] and "z" not in restored


def test_restore_refuses_nothing_but_checkout_refuses_a_broken_snapshot(session) -> None:  # type: ignore[no-untyped-def]
    session.run("x = 1")
    op = session.image.begin(source="checkout")
    monkey_load = session.image.load_groups

    def broken(groups, progress=None, **kwargs):  # type: ignore[no-untyped-def]
        values, _ = monkey_load(groups, progress, **kwargs)
        return values, {"x"}

    session.image.load_groups = broken  # type: ignore[method-assign]
    with pytest.raises(RestoreError, match="cannot be checked out"):
        op.checkout("HEAD")
    op.abort()
    assert session.namespace["x"] == 1


MAKE_PAIR = "def make(n):\n    shared = {'n': n}\n    return [shared], [shared]\n"


def test_names_rebound_together_that_still_share_are_pickled_once(
    session, reopen, monkeypatch,
) -> None:  # type: ignore[no-untyped-def]
    session.run(MAKE_PAIR + "a, b = make(1)")
    dumps = spy_dumps(session, monkeypatch)
    report = session.run("a, b = make(2)")
    assert [names for names in dumps if "a" in names or "b" in names] == [["a", "b"]]
    assert report.changed == ["a", "b"]
    again = session.run("a, b = make(2)")  # new objects, the same content
    assert "a" not in again.changed and "b" not in again.changed
    restored = reopen(session.image.workspace).namespace
    assert restored["a"][0] is restored["b"][0] and restored["a"][0] == {"n": 2}


def test_names_rebound_together_that_no_longer_share_are_stored_apart(
    session, reopen, monkeypatch,
) -> None:  # type: ignore[no-untyped-def]
    session.run(MAKE_PAIR + "a, b = make(1)")
    assert session.image.group_of["a"] == session.image.group_of["b"]
    session.run("a, b = [{'n': 2}], [{'n': 2}]")
    assert session.image.group_of["a"] != session.image.group_of["b"]
    restored = reopen(session.image.workspace).namespace
    assert restored["a"] == restored["b"] and restored["a"][0] is not restored["b"][0]


def test_a_new_name_sharing_with_a_group_rebound_whole_joins_it(
    session, reopen, monkeypatch,
) -> None:  # type: ignore[no-untyped-def]
    session.run(MAKE_PAIR + "a, b = make(1)")
    session.run("a, b = make(3)\nc = [a[0]]")
    assert session.image.group_of["c"] == session.image.group_of["a"]
    restored = reopen(session.image.workspace).namespace
    assert restored["c"][0] is restored["a"][0] is restored["b"][0]


def test_a_group_stored_without_markers_still_loads_and_keeps_its_sharing(
    session, reopen, monkeypatch,
) -> None:  # type: ignore[no-untyped-def]
    from kernos.serialize import pickler

    with monkeypatch.context() as patched:  # how groups were stored before the markers
        patched.setattr(pickler, "marked", lambda values: values)
        session.run(MAKE_PAIR + "a, b = make(1)")
        session.run("a, b = make(2)")
    restored = reopen(session.image.workspace)
    assert restored.namespace["a"][0] is restored.namespace["b"][0]
    restored.run("a, b = make(3)")  # the old group rebound whole: stored the new way
    again = reopen(restored.image.workspace).namespace
    assert again["a"][0] is again["b"][0] and again["a"][0] == {"n": 3}


def test_a_rebound_groups_other_names_keep_their_own_content_hash(
    session, reopen, monkeypatch,
) -> None:  # type: ignore[no-untyped-def]
    session.run("data = [1, 2]\ndef pair(n):\n    shared = {'d': data, 'n': n}\n"
                "    return [shared], [shared]\na, b = pair(1)")
    group = session.image.group_of
    assert group["a"] == group["b"] == group["data"]
    dumps = spy_dumps(session, monkeypatch)
    report = session.run("a, b = pair(2)")
    assert ["a", "b", "data"] in dumps and ["data"] in dumps  # the group once; data's own hash
    assert ["a"] not in dumps and ["b"] not in dumps
    assert report.changed == ["a", "b"]
    restored = reopen(session.image.workspace).namespace
    assert restored["a"][0] is restored["b"][0] and restored["a"][0]["d"] is restored["data"]
