"""Files for principals (kernos.agents.files): globs, grants, refusals, limits and the audit."""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path
from typing import Any

import pytest

from kernos.agents import FileAccess, FileLimitExceeded
from kernos.agents.capabilities import FILE_KINDS, Grant, parse_capability
from kernos.agents.globs import check_glob, glob_matches
from kernos.errors import (
    AgentCodeRejected,
    CapabilityDenied,
    InvalidGrant,
    OpVetoed,
    PathRefused,
    UsageError,
)

# -- globs ------------------------------------------------------------------------


@pytest.mark.parametrize(("glob", "path", "matches"), [
    ("reports/r.md", "reports/r.md", True),
    ("reports/r.md", "reports/r.mdx", False),
    ("reports/*", "reports/r.md", True),
    ("reports/*", "reports/a/r.md", False),       # '*' stays within a component
    ("reports/*", "reports", False),
    ("reports/*.md", "reports/.md", True),
    ("reports/*.md", "reports/r.txt", False),
    ("*", "a", True),
    ("*", "a/b", False),
    ("r?.md", "r1.md", True),
    ("r?.md", "r12.md", False),
    ("r?.md", "r/.md", False),
    ("reports/**", "reports/r.md", True),
    ("reports/**", "reports/a/b/c.md", True),
    ("reports/**", "reports", False),            # a trailing '**' needs a component
    ("reports/**", "reportsx/r.md", False),
    ("a/**/b.md", "a/b.md", True),                # inside, '**' may be no component
    ("a/**/b.md", "a/x/y/b.md", True),
    ("a/**/b.md", "a/x/y/c.md", False),
    ("**/*.md", "x.md", True),
    ("**/*.md", "a/b/x.md", True),
    ("**/*.md", "a/b/x.mdx", False),
    ("**", "anything/at/all", True),
    ("Reports/*", "reports/r.md", False),        # case matters
    ("a.b", "aXb", False),                        # '.' is itself, not a regex dot
    ("a-*", "a-[x]", True),
])
def test_glob_matching(glob: str, path: str, matches: bool) -> None:
    assert check_glob(glob) == glob
    assert glob_matches(glob, path) is matches


def test_a_deep_path_matches_without_recursion() -> None:
    path = "/".join(["d"] * 600) + "/x.md"
    assert glob_matches("**/*.md", path)
    assert glob_matches("d/**/d/**/x.md", path)
    assert not glob_matches("**/y.md", path)


@pytest.mark.parametrize(("glob", "words"), [
    ("", "1 to 256"),
    ("a" * 257, "1 to 256"),
    ("/reports/*", "absolute"),
    ("reports/../secret", "'..' component"),
    ("..", "'..' component"),
    ("./a", "'.' component"),
    ("a//b", "empty component"),
    ("reports/", "empty component"),
    ("a**", "whole component"),
    ("**.md", "whole component"),
    ("a b", "only letters"),
    ("a\\b", "only letters"),
    ("a[b]", "only letters"),
    ("a\0b", "only letters"),
    ("é", "only letters"),
    ("/".join(["a"] * 33), "over 32 components"),
    (5, "not int"),
])
def test_malformed_globs_are_refused(glob: object, words: str) -> None:
    with pytest.raises(InvalidGrant, match=re.escape(words)):
        check_glob(glob)


# -- capabilities ------------------------------------------------------------------


@pytest.mark.parametrize(("capability", "parsed"), [
    ("file:read:reports/*", ("file:read", "reports/*")),
    ("file:write:reports/**", ("file:write", "reports/**")),
    ("file:write:**", ("file:write", "**")),
    ("file:read:data/x_1.csv", ("file:read", "data/x_1.csv")),
])
def test_file_capabilities_parse(capability: str, parsed: tuple[str, str]) -> None:
    assert parse_capability(capability) == parsed
    assert parsed[0] in FILE_KINDS


@pytest.mark.parametrize(("capability", "words"), [
    ("file:exec:x", "'file:read:GLOB' and 'file:write:GLOB'"),
    ("file:read", "'file:read:GLOB' and 'file:write:GLOB'"),
    ("file:*", "'file:read:GLOB' and 'file:write:GLOB'"),
    ("file:read:/etc/*", "absolute"),
    ("file:write:../x", "'..' component"),
    ("file:write:a/../../x", "'..' component"),
    ("file:read:", "1 to 256"),
    ("file:read:a;rm", "only letters"),
])
def test_malformed_file_capabilities_are_refused(capability: str, words: str) -> None:
    with pytest.raises(InvalidGrant, match=re.escape(words)):
        parse_capability(capability)


def grant(kind: str, target: str) -> Grant:
    return Grant(id="g1", principal="alice", kind=kind, target=target, granted_by="human",
                 op=1)


def test_write_implies_read_of_the_same_glob_and_not_the_reverse() -> None:
    write = grant("file:write", "reports/*")
    read = grant("file:read", "reports/*")
    assert write.covers("file:write", "reports/r.md")
    assert write.covers("file:read", "reports/r.md")
    assert not write.covers("file:read", "data/d.csv")
    assert read.covers("file:read", "reports/r.md")
    assert not read.covers("file:write", "reports/r.md")
    assert not read.covers("read", "reports/r.md")  # a name grant is something else
    assert not grant("read", "*").covers("file:read", "x")
    read.revoked_op = 5
    assert not read.covers("file:read", "reports/r.md")


def test_a_file_glob_star_is_no_wildcard_for_delegation(env) -> None:  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.add("alice")
        env.runtime.add_agent("alice/kid", parent="alice")
        held = env.agents.grant("alice", "file:read:*")
        registry = env.runtime.mutable_registry(env.image.current)
        with pytest.raises(CapabilityDenied, match="covers only file:read:\\*"):
            registry.attenuate("alice", held["id"], "alice/kid", target="**", op=1)
        same = registry.attenuate("alice", held["id"], "alice/kid", op=1)
        assert same.capability == "file:read:*"


# -- FileAccess: the human and paths ---------------------------------------------------


def root_of(env: Any) -> Path:
    return Path(env.image.files.root())


def test_the_human_reads_writes_lists_and_deletes(env) -> None:  # type: ignore[no-untyped-def]
    with env.op():
        files = FileAccess(env.runtime, "human", env.image.current)
        assert files.write("notes/a.txt", "héllo") == len("héllo".encode())
        assert files.append("notes/a.txt", b"!") == 1
        assert files.read("notes/a.txt") == "héllo!"
        assert files.read("notes/a.txt", binary=True) == "héllo!".encode()
        assert files.write("b.bin", b"\x00\xff") == 2
        assert files.list() == ["b.bin", "notes/a.txt"]
        assert files.list("notes") == files.list("notes/") == ["notes/a.txt"]
        assert files.list("notes/a.txt") == ["notes/a.txt"]
        assert files.list("nothing") == []
        assert files.exists("b.bin") and not files.exists("c.bin")
        assert not files.exists("notes")  # a directory is not a file
        # Under a file nothing is there: asking is not an error (writing there is).
        assert not files.exists("b.bin/x") and files.list("b.bin/x") == []
        files.delete("b.bin")
        assert not files.exists("b.bin")
        with pytest.raises(FileNotFoundError, match=re.escape("no file 'b.bin'")):
            files.read("b.bin")
        with pytest.raises(FileNotFoundError):
            files.delete("b.bin")
        with pytest.raises(FileNotFoundError):
            files.read("no/such/dir/x")
    assert (root_of(env) / "notes" / "a.txt").read_text() == "héllo!"
    assert "notes/a.txt" in str(env.report.files)


def test_write_keeps_the_mode_and_leaves_no_temporary_file(env) -> None:  # type: ignore[no-untyped-def]
    with env.op():
        files = FileAccess(env.runtime, "human", env.image.current)
        files.write("run.sh", "echo 1")
        os.chmod(root_of(env) / "run.sh", 0o750)
        files.write("run.sh", "echo 2")
    assert (root_of(env) / "run.sh").stat().st_mode & 0o777 == 0o750
    assert os.listdir(root_of(env)) == ["run.sh"]


@pytest.mark.parametrize(("path", "words"), [
    ("../outside", "'..' component"),
    ("a/../../outside", "'..' component"),
    ("/etc/passwd", "absolute"),
    ("a\0b", "NUL byte"),
    ("", "empty"),
    ("x" * 1025, "longer than 1024"),
    ("\udcff", "not valid UTF-8"),
    (b"bytes", "takes a path"),
    (Path("a"), "takes a path"),
])
def test_bad_paths_are_refused_and_veto_the_op(env, path: object, words: str) -> None:  # type: ignore[no-untyped-def]
    op = env.image.begin(source="")
    files = FileAccess(env.runtime, "human", op)
    files.write("kept.txt", "x")
    with pytest.raises(UsageError, match=re.escape(words)):
        files.read(path)
    with pytest.raises(OpVetoed):
        op.commit()
    assert not (root_of(env) / "kept.txt").exists()  # the op's write rolled back
    assert op.file_access[-1]["outcome"] == "refused"


def test_an_absolute_path_inside_the_root_is_refused_too(env) -> None:  # type: ignore[no-untyped-def]
    op = env.image.begin(source="")
    with pytest.raises(PathRefused, match="absolute"):
        FileAccess(env.runtime, "human", op).write(str(root_of(env) / "x"), "x")
    op.abort()


def make_link_out(root: Path, tmp: Path) -> None:
    outside = tmp / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "secret.txt").write_text("SECRET")
    os.symlink(outside / "secret.txt", root / "link.txt")
    os.symlink(outside, root / "dir")


@pytest.mark.parametrize(("action", "path", "words"), [
    ("read", "link.txt", "symbolic link"),
    ("read", "dir/secret.txt", "goes through a symbolic link"),
    ("write", "link.txt", "symbolic link"),
    ("write", "dir/new.txt", "goes through a symbolic link"),
    ("append", "link.txt", "symbolic link"),
    ("append", "dir/secret.txt", "goes through a symbolic link"),
    ("delete", "link.txt", "symbolic link"),
    ("exists", "dir/secret.txt", "goes through a symbolic link"),
    ("list", "dir", "symbolic link"),
    ("read", "fifo", "a FIFO"),
    ("write", "fifo", "a FIFO"),
    ("append", "fifo", "a FIFO"),
    ("read", "sock", "a socket"),
    ("read", "sub", "a directory"),
    ("write", "sub", "a directory"),
    ("read", "plain.txt/x", "one of its directories is a file"),
    ("write", "plain.txt/x", "one of its directories is a file"),
])
def test_links_and_special_files_are_refused(env, tmp_path, action: str, path: str,  # type: ignore[no-untyped-def]
                                             words: str) -> None:
    root = root_of(env)
    make_link_out(root, tmp_path)
    os.mkfifo(root / "fifo")
    (root / "sub").mkdir()
    (root / "plain.txt").write_text("plain")
    server = socket.socket(socket.AF_UNIX)
    cwd = os.getcwd()
    os.chdir(root)  # a socket path is short; bind relative to the root
    try:
        server.bind("sock")
    finally:
        os.chdir(cwd)
    try:
        op = env.image.begin(source="")
        files = FileAccess(env.runtime, "human", op)
        arguments = (path, "data") if action in ("write", "append") else (path,)
        with pytest.raises(PathRefused, match=re.escape(words)):
            getattr(files, action)(*arguments)
        assert op.vetoes
        op.abort()
    finally:
        server.close()
    assert (tmp_path / "outside" / "secret.txt").read_text() == "SECRET"  # never followed
    assert not (tmp_path / "outside" / "new.txt").exists()
    assert os.path.islink(root / "link.txt")


def test_list_skips_links_and_special_files(env, tmp_path) -> None:  # type: ignore[no-untyped-def]
    root = root_of(env)
    make_link_out(root, tmp_path)
    os.mkfifo(root / "fifo")
    (root / "a").mkdir()
    (root / "a" / "x.txt").write_text("x")
    (root / "hard.txt").write_text("h")
    os.link(root / "hard.txt", tmp_path / "hard-outside.txt")
    with env.op():
        env.agents.add("alice")
        env.agents.grant("alice", "file:read:**")
    with env.op():
        human = FileAccess(env.runtime, "human", env.image.current)
        assert human.list() == ["a/x.txt", "hard.txt"]
        alice = FileAccess(env.runtime, "alice", env.image.current)
        assert alice.list() == ["a/x.txt"]  # a hard-linked file is not an agent's to see


def test_an_agent_cannot_read_or_change_a_hard_linked_file(env, tmp_path) -> None:  # type: ignore[no-untyped-def]
    root = root_of(env)
    (root / "agents" / "alice").mkdir(parents=True)
    os.link(_outside(tmp_path), root / "agents" / "alice" / "h")
    with env.op():
        env.agents.add("alice")
    op = env.image.begin(source="")
    with pytest.raises(PathRefused, match="2 hard links"):
        FileAccess(env.runtime, "alice", op).append("agents/alice/h", "more")
    op.abort()
    assert _outside(tmp_path).read_text() == "outside"


def _outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside.txt"
    if not path.exists():
        path.write_text("outside")
    return path


# -- grants ----------------------------------------------------------------------------


@pytest.fixture
def agents(env):  # type: ignore[no-untyped-def]
    with env.op():
        env.agents.add("alice")
        env.agents.add("bob")
        env.runtime.add_agent("alice/kid", parent="alice")
        env.agents.grant("alice", "file:write:reports/*")
        env.agents.grant("bob", "file:read:reports/**")
        FileAccess(env.runtime, "human", env.image.current).write("data/d.csv", "1,2")
    return env


def test_a_write_grant_lets_an_agent_write_and_read_its_glob(agents) -> None:  # type: ignore[no-untyped-def]
    with agents.op() as op:
        alice = FileAccess(agents.runtime, "alice", op)
        assert alice.write("reports/r.md", "# r") == 3
        assert alice.read("reports/r.md") == "# r"
        assert alice.exists("reports/r.md")
        assert alice.list() == ["reports/r.md"]
        assert set(op.grants_used.values()) == {"file:write:reports/*"}
    assert (root_of(agents) / "reports" / "r.md").read_text() == "# r"
    with agents.op() as op:
        bob = FileAccess(agents.runtime, "bob", op)
        assert bob.read("reports/r.md") == "# r"
        assert bob.list("reports") == ["reports/r.md"]
        assert set(op.grants_used.values()) == {"file:read:reports/**"}


@pytest.mark.parametrize(("who", "action", "path", "capability"), [
    ("alice", "write", "reports/sub/r.md", "file:write:reports/sub/r.md"),  # '*' is one level
    ("alice", "write", "data/d.csv", "file:write:data/d.csv"),
    ("alice", "read", "data/d.csv", "file:read:data/d.csv"),
    ("alice", "exists", "data/d.csv", "file:read:data/d.csv"),
    ("alice", "delete", "data/d.csv", "file:write:data/d.csv"),
    ("bob", "write", "reports/r.md", "file:write:reports/r.md"),   # read does not imply write
    ("bob", "append", "reports/r.md", "file:write:reports/r.md"),
    ("bob", "read", "agents/alice/x", "file:read:agents/alice/x"),  # another agent's own
    ("alice/kid", "read", "agents/alice/x", "file:read:agents/alice/x"),  # its parent's
    ("alice/kid", "write", "reports/r.md", "file:write:reports/r.md"),  # no inheritance
])
def test_without_a_grant_access_is_denied_and_the_op_vetoed(agents, who: str, action: str,  # type: ignore[no-untyped-def]
                                                              path: str,
                                                              capability: str) -> None:
    op = agents.image.begin(source="")
    files = FileAccess(agents.runtime, who, op)
    files.write(f"agents/{who}/before.txt", "written before the denial")
    arguments = (path, "data") if action in ("write", "append") else (path,)
    with pytest.raises(CapabilityDenied, match="no file:"):
        getattr(files, action)(*arguments)
    assert op.denied[-1]["capability"] == capability
    assert op.file_access[-1] == {"principal": who, "action": action, "path": path,
                                  "outcome": "denied"}
    with pytest.raises(OpVetoed):
        op.commit()
    assert not (root_of(agents) / "agents" / who / "before.txt").exists()
    assert (root_of(agents) / "data" / "d.csv").read_text() == "1,2"


def test_an_agents_own_subtree_needs_no_grant(agents) -> None:  # type: ignore[no-untyped-def]
    with agents.op() as op:
        kid = FileAccess(agents.runtime, "alice/kid", op)
        kid.write("agents/alice/kid/notes.md", "kid")
        alice = FileAccess(agents.runtime, "alice", op)
        alice.write("agents/alice/plan.md", "plan")
        assert alice.read("agents/alice/kid/notes.md") == "kid"  # a parent's subtree holds
        assert kid.list() == ["agents/alice/kid/notes.md"]
        assert alice.list("agents") == ["agents/alice/kid/notes.md", "agents/alice/plan.md"]
        assert op.grants_used == {}
        assert {entry["grant"] for entry in op.file_access
                if entry["action"] != "list"} == {"own"}
    assert (root_of(agents) / "agents" / "alice" / "plan.md").read_text() == "plan"


def test_a_name_that_only_starts_like_an_agents_is_not_its_own(agents) -> None:  # type: ignore[no-untyped-def]
    op = agents.image.begin(source="")
    with pytest.raises(CapabilityDenied):
        FileAccess(agents.runtime, "alice", op).write("agents/alicex/p.md", "x")
    with pytest.raises(CapabilityDenied):
        FileAccess(agents.runtime, "alice", op).write("agents/alice", "x")
    op.abort()


def test_list_shows_only_what_the_principal_may_read(agents) -> None:  # type: ignore[no-untyped-def]
    with agents.op() as op:
        human = FileAccess(agents.runtime, "human", op)
        for path in ("reports/a.md", "reports/deep/b.md", "agents/bob/c.md", "top.md"):
            human.write(path, path)
    with agents.op() as op:
        assert FileAccess(agents.runtime, "alice", op).list() == ["reports/a.md"]
        assert FileAccess(agents.runtime, "bob", op).list() == [
            "agents/bob/c.md", "reports/a.md", "reports/deep/b.md"]
        assert FileAccess(agents.runtime, "alice/kid", op).list() == []


def test_a_revoked_grant_no_longer_allows(agents) -> None:  # type: ignore[no-untyped-def]
    with agents.op():
        agents.agents.revoke("alice", "file:write:reports/*")
    op = agents.image.begin(source="")
    with pytest.raises(CapabilityDenied):
        FileAccess(agents.runtime, "alice", op).write("reports/r.md", "x")
    op.abort()


def test_data_must_be_str_or_bytes(agents) -> None:  # type: ignore[no-untyped-def]
    op = agents.image.begin(source="")
    with pytest.raises(UsageError, match="takes str or bytes data, not bytearray"):
        FileAccess(agents.runtime, "alice", op).write("reports/r.md", bytearray(b"x"))
    assert op.vetoes and op.denied[-1]["capability"] == "files.write"
    op.abort()


def test_text_that_is_not_utf8_is_the_callers_to_handle(agents) -> None:  # type: ignore[no-untyped-def]
    with agents.op() as op:
        alice = FileAccess(agents.runtime, "alice", op)
        alice.write("reports/b.bin", b"\xff\xfe")
        with pytest.raises(ValueError, match="binary=True"):
            alice.read("reports/b.bin")
        assert alice.read("reports/b.bin", binary=True) == b"\xff\xfe"
        assert not op.vetoes


# -- limits ---------------------------------------------------------------------------


def limited(env: Any, **limits: int) -> None:
    with env.op():
        env.agents.add("alice", **limits)


def test_bytes_written_per_op_are_limited(env) -> None:  # type: ignore[no-untyped-def]
    limited(env, file_write_bytes=10)
    with env.op() as op:
        alice = FileAccess(env.runtime, "alice", op)
        alice.write("agents/alice/a", b"x" * 6)
        alice.append("agents/alice/a", b"x" * 4)  # exactly the limit
    op = env.image.begin(source="")
    alice = FileAccess(env.runtime, "alice", op)
    alice.write("agents/alice/b", b"x" * 6)
    with pytest.raises(FileLimitExceeded, match="file_write_bytes=10") as error:
        FileAccess(env.runtime, "alice", op).write("agents/alice/c", b"x" * 5)
    assert "agents.limits('alice', file_write_bytes=N)" in str(error.value)
    with pytest.raises(OpVetoed):
        op.commit()
    assert not (root_of(env) / "agents" / "alice" / "c").exists()
    assert not (root_of(env) / "agents" / "alice" / "b").exists()


def test_files_written_per_op_are_limited(env) -> None:  # type: ignore[no-untyped-def]
    limited(env, file_writes=2)
    op = env.image.begin(source="")
    alice = FileAccess(env.runtime, "alice", op)
    alice.write("agents/alice/a", "1")
    alice.write("agents/alice/a", "2")  # the same file again
    alice.append("agents/alice/b", "1")
    with pytest.raises(FileLimitExceeded, match="file_writes=2"):
        alice.write("agents/alice/c", "1")
    op.abort()
    op = env.image.begin(source="")
    alice = FileAccess(env.runtime, "alice", op)
    alice.write("agents/alice/a", "1")
    alice.write("agents/alice/b", "1")
    with pytest.raises(FileLimitExceeded, match="file_writes=2"):
        alice.delete("agents/alice/c")
    op.abort()


def test_the_size_of_one_read_is_limited(env) -> None:  # type: ignore[no-untyped-def]
    limited(env, file_read_bytes=5)
    with env.op() as op:
        FileAccess(env.runtime, "human", op).write("agents/alice/big", b"x" * 6)
        FileAccess(env.runtime, "human", op).write("agents/alice/small", b"x" * 5)
    op = env.image.begin(source="")
    alice = FileAccess(env.runtime, "alice", op)
    assert alice.read("agents/alice/small") == "xxxxx"
    with pytest.raises(FileLimitExceeded, match="file_read_bytes=5"):
        alice.read("agents/alice/big")
    assert op.vetoes
    op.abort()


def test_limits_are_per_op(env) -> None:  # type: ignore[no-untyped-def]
    limited(env, file_write_bytes=4, file_writes=1)
    for _ in range(3):
        with env.op() as op:
            FileAccess(env.runtime, "alice", op).write("agents/alice/a", "1234")


def test_the_human_has_no_file_limits(env) -> None:  # type: ignore[no-untyped-def]
    limited(env, file_write_bytes=1)
    with env.op() as op:
        FileAccess(env.runtime, "human", op).write("big", b"x" * 100)


# -- the audit ----------------------------------------------------------------------------


def audit_records(env: Any) -> list[dict[str, Any]]:
    path = Path(env.path) / "audit" / "chain.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_every_access_is_in_the_ops_audit_record(agents) -> None:  # type: ignore[no-untyped-def]
    with agents.op() as op:
        alice = FileAccess(agents.runtime, "alice", op)
        alice.write("reports/r.md", "abc")
        alice.append("reports/r.md", "d")
        alice.read("reports/r.md")
        alice.exists("reports/x.md")
        alice.list()
        alice.delete("reports/r.md")
        number = op.id
    record = next(r for r in audit_records(agents) if r.get("op") == number)
    grant_id = next(iter(record["grants"]["used"]))["id"]
    assert record["file_access"] == [
        {"principal": "alice", "action": "write", "path": "reports/r.md", "outcome": "ok",
         "grant": grant_id, "bytes": 3},
        {"principal": "alice", "action": "append", "path": "reports/r.md", "outcome": "ok",
         "grant": grant_id, "bytes": 1},
        {"principal": "alice", "action": "read", "path": "reports/r.md", "outcome": "ok",
         "grant": grant_id, "bytes": 4},
        {"principal": "alice", "action": "exists", "path": "reports/x.md",
         "outcome": "missing", "grant": grant_id},
        {"principal": "alice", "action": "list", "path": "", "outcome": "ok", "files": 1},
        {"principal": "alice", "action": "delete", "path": "reports/r.md", "outcome": "ok",
         "grant": grant_id},
    ]


def test_a_denied_access_is_in_the_audit_record_of_the_rolled_back_op(agents) -> None:  # type: ignore[no-untyped-def]
    op = agents.image.begin(source="")
    number = op.id
    with pytest.raises(CapabilityDenied):
        FileAccess(agents.runtime, "alice", op).read("data/d.csv")
    with pytest.raises(OpVetoed):
        op.commit()
    record = next(r for r in audit_records(agents) if r.get("op") == number)
    assert record["status"] == "denied"
    assert record["grants"]["denied"][0]["capability"] == "file:read:data/d.csv"
    assert record["file_access"] == [{"principal": "alice", "action": "read",
                                      "path": "data/d.csv", "outcome": "denied"}]


def test_the_audit_keeps_a_bounded_number_of_accesses(agents) -> None:  # type: ignore[no-untyped-def]
    with agents.op() as op:
        alice = FileAccess(agents.runtime, "alice", op)
        for _ in range(205):
            alice.exists("reports/x.md")
        assert len(op.file_access) == 201
        assert op.file_access[-1] == {"more": 5}


def test_an_unknown_principal_is_refused(env) -> None:  # type: ignore[no-untyped-def]
    with env.op() as op, pytest.raises(UsageError, match="nobody"):
        FileAccess(env.runtime, "nobody", op)



# -- agent code's ``files`` ------------------------------------------------------------------


def test_agent_code_has_files(agents) -> None:  # type: ignore[no-untyped-def]
    output = agents.run("alice", (
        "n = files.write('reports/r.md', '# report')\n"
        "files.append('reports/r.md', b'\\n')\n"
        "print(n, files.exists('reports/r.md'), files.list('reports'))\n"
        "print(repr(files.read('reports/r.md')), files.read('reports/r.md', binary=True))\n"
        "try:\n"
        "    files.read('reports/missing.md')\n"
        "except FileNotFoundError as error:\n"
        "    print('missing', error.args)\n"
        "files.write('agents/alice/own.txt', 'mine')\n"))
    assert output.splitlines() == [
        "8 True ['reports/r.md']", "'# report\\n' b'# report\\n'",
        "missing (\"there is no file 'reports/missing.md' in the files root\",)"]
    assert (root_of(agents) / "reports" / "r.md").read_text() == "# report\n"
    assert (root_of(agents) / "agents" / "alice" / "own.txt").read_text() == "mine"
    record = [r for r in audit_records(agents) if r.get("type") == "op"][-1]
    assert [a["action"] for a in record["file_access"]] == [
        "write", "append", "exists", "list", "read", "read", "read", "write"]


def test_a_denial_in_agent_code_vetoes_the_op_even_if_caught(agents) -> None:  # type: ignore[no-untyped-def]
    op = agents.image.begin(source="")
    output = agents.runtime.run("bob", (
        "kept = 1\n"
        "files.write('agents/bob/x.txt', 'x')\n"
        "try:\n"
        "    files.write('reports/r.md', 'x')\n"
        "except CapabilityDenied as error:\n"
        "    print('denied', error.args)\n")).output
    assert "denied" in output and "file:write:reports/r.md" in output
    with pytest.raises(OpVetoed):
        op.commit()
    assert not (root_of(agents) / "agents" / "bob").exists()
    assert not (root_of(agents) / "reports").exists()
    assert "kept" not in agents.ns_of("bob")


def test_a_refused_path_in_agent_code_vetoes_the_op(agents) -> None:  # type: ignore[no-untyped-def]
    op = agents.image.begin(source="")
    with pytest.raises(PathRefused, match=re.escape("'..' component")):
        agents.runtime.run("alice", "files.read('../../etc/passwd')")
    assert op.vetoes
    op.abort()


@pytest.mark.parametrize(("source", "error", "words"), [
    ("files._members", AgentCodeRejected, "_members"),
    ("files.__class__", AgentCodeRejected, "__class__"),
    ("files.open", AttributeError, "cannot read ModuleView.open"),
    ("getattr(files, '_name')", AttributeError, "not starting with '_'"),
    ("files.read(files)", UsageError, "takes a path"),
])
def test_files_exposes_only_its_operations(agents, source: str, error: type,  # type: ignore[no-untyped-def]
                                           words: str) -> None:
    op = agents.image.begin(source="")
    with pytest.raises(error, match=re.escape(words)):
        agents.runtime.run("alice", source)
    op.abort()


def test_a_tool_another_agent_wrote_cannot_use_files_for_its_caller(agents) -> None:  # type: ignore[no-untyped-def]
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    agents.run("bob", (
        "define_tool('sneaky', 'def sneaky(x):\\n    return files.write(\"reports/r.md\", "
        f"\"x\")\\n', {schema!r}, 'writes for its caller')\n"))
    with agents.op():
        agents.agents.grant("alice", "call:sneaky")
        agents.agents.grant("bob", "file:write:reports/*")
    op = agents.image.begin(source="")
    with pytest.raises(UsageError, match="cannot use files on its caller's behalf"):
        agents.runtime.run("alice", "call('sneaky', x=1)")
    assert op.vetoes
    op.abort()
    assert not (root_of(agents) / "reports").exists()


def test_a_file_swapped_between_look_and_open_is_refused(env, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    root = root_of(env)
    with env.op() as op:
        FileAccess(env.runtime, "human", op).write("a.txt", "a")
        FileAccess(env.runtime, "human", op).write("b.txt", "b")
    other = os.stat(root / "b.txt")
    looked = FileAccess._existing

    def swapped(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        looked(self, *args, **kwargs)
        return other  # what was looked at is not what gets opened

    monkeypatch.setattr(FileAccess, "_existing", swapped)
    for action in ("read", "append"):
        op = env.image.begin(source="")
        files = FileAccess(env.runtime, "human", op)
        with pytest.raises(PathRefused, match="changed while it was being opened"):
            files.read("a.txt") if action == "read" else files.append("a.txt", "x")
        op.abort()
    assert (root / "a.txt").read_text() == "a"


def test_a_full_disk_leaves_the_old_file_whole_and_vetoes_the_op(agents, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import errno

    from kernos.agents import files as module

    with agents.op() as op:
        FileAccess(agents.runtime, "alice", op).write("reports/r.md", "old")

    def full(fd: int, data: bytes) -> None:
        os.write(fd, data[:1])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(module, "_write_all", full)
    op = agents.image.begin(source="")
    with pytest.raises(UsageError, match="No space left on device; nothing of it is kept"):
        FileAccess(agents.runtime, "alice", op).write("reports/r.md", "new contents")
    assert (root_of(agents) / "reports" / "r.md").read_text() == "old"
    assert os.listdir(root_of(agents) / "reports") == ["r.md"]  # no temporary file left
    with pytest.raises(OpVetoed):
        op.commit()


def test_files_is_installed_and_survives_in_a_namespace(agents) -> None:  # type: ignore[no-untyped-def]
    from kernos.agents import api, guards

    assert guards.AGENT_BUILTINS["files"] is api.FILES is guards.MODULES["files"]
    assert sorted(api.FILES._members) == ["append", "delete", "exists", "list", "read",
                                          "write"]
    agents.run("alice", "kept = files\nkept.write('agents/alice/a.txt', 'a')")
    agents.reopen()
    assert agents.run("alice", "print(kept.read('agents/alice/a.txt'))") == "a\n"
