"""A workspace copy as a writer: its identity, made once, renewed for a copy made by hand,
and an operator's key for a deployment (``kernos.store.identity``)."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pytest

from kernos.audit.signing import key_id
from kernos.errors import WorkspaceCorrupt, WorkspaceError
from kernos.store.identity import load_identity, own_keys
from remote_support import operator_key


def test_an_identity_is_made_once_private_and_kept(tmp_path: Path) -> None:
    first = load_identity(tmp_path)
    assert first.key_id == key_id(first.key) and first.own == (first.key_id,)
    assert (tmp_path / "identity.json").stat().st_mode & 0o777 == 0o600
    again = load_identity(tmp_path)
    assert (again.id, again.key_id) == (first.id, first.key_id) and again.note is None
    assert own_keys(tmp_path) == (first.key_id,)


def test_racing_first_uses_make_one_identity(tmp_path: Path) -> None:
    found: list[str] = []
    threads = [threading.Thread(target=lambda: found.append(load_identity(tmp_path).key_id))
               for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(found)) == 1


def test_a_workspace_from_before_identities_keeps_the_id_its_remotes_know(
        tmp_path: Path) -> None:
    (tmp_path / "remotes.json").write_text(json.dumps({"id": "0123456789abcdef",
                                                       "remotes": {}}))
    assert load_identity(tmp_path).id == "0123456789abcdef"


def test_a_copy_made_by_hand_becomes_a_writer_of_its_own(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    original = load_identity(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "copy")
    secret = json.loads((tmp_path / "a" / "identity.json").read_text())["secret"]
    copy = load_identity(tmp_path / "copy")
    assert copy.id != original.id and copy.key_id != original.key_id
    assert copy.own == (copy.key_id, original.key_id)  # its records before the copy
    assert copy.note is not None and "is a copy of" in copy.note
    stored = json.loads((tmp_path / "copy" / "identity.json").read_text())
    assert secret not in json.dumps(stored) and stored["copied_from"]["id"] == original.id
    assert load_identity(tmp_path / "a").key_id == original.key_id  # the original is itself
    moved = tmp_path / "moved"
    os.rename(tmp_path / "a", moved)  # a move keeps the directory: the same writer
    assert load_identity(moved).key_id == original.key_id


def test_an_operator_key_signs_for_every_workspace_and_is_needed_to_write(
        tmp_path: Path) -> None:
    pem = operator_key(tmp_path / "operator")
    environ = {"KERNOS_SIGNING_KEY": str(pem)}
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    first = load_identity(tmp_path / "one", environ)
    second = load_identity(tmp_path / "two", environ)
    assert first.key_id == second.key_id and first.id != second.id
    stored = json.loads((tmp_path / "one" / "identity.json").read_text())
    assert stored["secret"] is None and stored["operator"] == str(pem)
    without = load_identity(tmp_path / "one", {})
    assert without.key_id == first.key_id and without.id == first.id
    with pytest.raises(WorkspaceError, match=r"KERNOS_SIGNING_KEY=.*signing\.pem"):
        _ = without.key
    (tmp_path / "bad.pem").write_text("not a key")
    with pytest.raises(WorkspaceError, match="does not name a readable Ed25519"):
        load_identity(tmp_path / "two", {"KERNOS_SIGNING_KEY": str(tmp_path / "bad.pem")})


def test_a_damaged_identity_is_named_and_not_replaced(tmp_path: Path) -> None:
    load_identity(tmp_path)
    (tmp_path / "identity.json").write_text("{")
    with pytest.raises(WorkspaceCorrupt, match=r"identity\.json is unreadable"):
        load_identity(tmp_path)
    assert (tmp_path / "identity.json").read_text() == "{"
