"""The retention policy of ``kernos prune`` (a pure function), the commit rewrite, and how
prune records resolve the commits older records name."""

from __future__ import annotations

import calendar
import subprocess
import time
from pathlib import Path

import pytest

from kernos.audit.pruning import Prunes
from kernos.errors import UsageError
from kernos.store.objects import object_id
from kernos.store.retention import Policy, Snapshot, select, with_parent


def at(day: str, clock: str = "12:00:00") -> int:
    """Seconds since the epoch of ``YYYY-MM-DD`` at ``HH:MM:SS`` UTC."""
    return calendar.timegm(time.strptime(f"{day} {clock}", "%Y-%m-%d %H:%M:%S"))


def chain(*times: int) -> list[Snapshot]:
    """Snapshots ``c1``, ``c2``, ... (op N), oldest first."""
    return [Snapshot(commit=f"c{n}", time=time, op=n) for n, time in enumerate(times, start=1)]


def kept(selection_chain: list[Snapshot], policy: Policy, **kwargs: object) -> list[str]:
    return list(select(selection_chain, policy, **kwargs).kept)  # type: ignore[arg-type]


# Four days of snapshots; 2026-03-03 has none, 2026-03-05 has three.
DAYS = chain(at("2026-03-01", "09:00:00"), at("2026-03-01", "18:00:00"),
             at("2026-03-02", "10:00:00"), at("2026-03-04", "00:00:00"),
             at("2026-03-04", "23:59:59"), at("2026-03-05", "00:00:00"),
             at("2026-03-05", "08:00:00"), at("2026-03-05", "20:00:00"))


def test_head_is_always_kept_and_nothing_else_without_a_reason() -> None:
    selection = select(DAYS, Policy(keep_tags=("nothing-matches",)))
    assert selection.kept == {"c8": ("HEAD",)}
    assert selection.pruned == tuple(f"c{n}" for n in range(1, 8))
    assert selection.unmatched == ("nothing-matches",)


def test_keep_last_keeps_the_newest_n() -> None:
    assert kept(DAYS, Policy(keep_last=3)) == ["c6", "c7", "c8"]
    assert kept(DAYS, Policy(keep_last=1)) == ["c8"]
    assert kept(DAYS, Policy(keep_last=100)) == [s.commit for s in DAYS]
    assert select(DAYS, Policy(keep_last=2)).kept["c8"] == ("HEAD", "last")


def test_keep_daily_keeps_the_newest_of_each_day_that_has_one() -> None:
    selection = select(DAYS, Policy(keep_daily=3))
    # The three most recent days *with snapshots*: 03-05, 03-04, 03-02 (03-03 had none).
    assert list(selection.kept) == ["c3", "c5", "c8"]
    assert selection.kept["c5"] == ("daily 2026-03-04",)  # 23:59:59 is still the 4th
    assert selection.kept["c8"] == ("HEAD", "daily 2026-03-05")
    assert kept(DAYS, Policy(keep_daily=10)) == ["c2", "c3", "c5", "c8"]


def test_days_are_utc_calendar_days() -> None:
    # 23:30 UTC and 00:30 UTC the next day are two days, whatever the local zone says.
    two = chain(at("2026-01-01", "23:30:00"), at("2026-01-02", "00:30:00"))
    assert kept(two, Policy(keep_daily=2)) == ["c1", "c2"]
    assert Snapshot(commit="x", time=at("2026-01-01", "23:30:00")).day == "2026-01-01"


def test_keep_tag_matches_tag_names_with_fnmatch() -> None:
    tags = {"v1.0": "c2", "v1.1": "c4", "nightly": "c5", "V2": "c6", "elsewhere": "not-on-chain"}
    selection = select(DAYS, Policy(keep_tags=("v1.*", "else*", "zzz")), tags=tags)
    assert list(selection.kept) == ["c2", "c4", "c8"]
    assert selection.kept["c2"] == ("tag v1.0",)
    # A tag off the branch keeps nothing on it; matching is case-sensitive.
    assert selection.unmatched == ("else*", "zzz")
    assert "c6" not in select(DAYS, Policy(keep_tags=("v*",)), tags=tags).kept


def test_what_other_refs_need_is_kept_and_the_reasons_add_up() -> None:
    selection = select(DAYS, Policy(keep_last=2, keep_daily=1, keep_tags=("v*",)),
                       tags={"v1": "c7"}, needed={"c1": "refs/heads/backup",
                                                  "c2": "refs/heads/backup"})
    assert selection.kept == {
        "c1": ("needed by refs/heads/backup",), "c2": ("needed by refs/heads/backup",),
        "c7": ("last", "tag v1"), "c8": ("HEAD", "last", "daily 2026-03-05")}
    assert selection.pruned == ("c3", "c4", "c5", "c6")


def test_an_empty_chain_and_bad_counts() -> None:
    assert select([], Policy(keep_last=1)).kept == {}
    with pytest.raises(UsageError):
        Policy(keep_last=-1)
    assert Policy().empty and not Policy(keep_tags=("x",)).empty


# -- the rewrite ------------------------------------------------------------------------------

RAW = (b"tree 4b825dc642cb6eb9a060e54bf8d69288fbee4904\n"
       b"parent 1111111111111111111111111111111111111111\n"
       b"author human <human@kernos.invalid> 1700000000 +0000\n"
       b"committer human <human@kernos.invalid> 1700000000 +0000\n\n"
       b"op 3 by human: x = 1\n\nKernos-Op: 3\nparent not a header\n")


def test_with_parent_changes_only_the_parent_line() -> None:
    other = "2" * 40
    moved = with_parent(RAW, other)
    assert moved == RAW.replace(b"1" * 40, other.encode())
    root = with_parent(RAW, None)
    assert b"\nparent " not in root.partition(b"\n\n")[0]
    assert root.partition(b"\n\n")[2] == RAW.partition(b"\n\n")[2]  # the message untouched
    # Putting the old parent back gives the old bytes, so the old id can be recomputed.
    assert with_parent(root, "1" * 40) == RAW
    assert object_id(b"commit", with_parent(moved, "1" * 40)) == object_id(b"commit", RAW)


def test_a_rewritten_commit_is_one_git_reads_with_the_same_id(tmp_path: Path) -> None:
    repo = tmp_path / "repo.git"
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True)
    data = with_parent(RAW, None)
    written = subprocess.run(["git", f"--git-dir={repo}", "hash-object", "-t", "commit",
                              "--literally", "--stdin"], input=data, capture_output=True,
                             check=True).stdout.decode().strip()
    assert written == object_id(b"commit", data).hex()


# -- prune records ----------------------------------------------------------------------------

A, B, C, D, E, F = (str(n) * 40 for n in range(1, 7))


def prune_record(source: str, target: str, pruned: list[str],
                 rewritten: list[list[str]]) -> dict[str, object]:
    return {"type": "prune", "from": source, "to": target, "pruned": pruned,
            "rewritten": rewritten, "at": "2026-03-05T00:00:00.000Z"}


def test_prunes_resolve_the_commits_older_records_name() -> None:
    # History A-B-C-D; the prune at record 10 drops B and renames C, D as E, F.
    prunes = Prunes([(10, prune_record(D, F, [A, B], [[C, E], [D, F]]))])
    assert prunes.resolve(A, 3) == (None, 10)
    assert prunes.resolve(C, 5) == (E, 10)
    assert prunes.resolve(D, 9) == (F, 10)
    # A record after the prune names the new ids: the prune does not apply to it.
    assert prunes.resolve(F, 11) == (F, None)
    assert prunes.resolve(C, 11) == (C, None)
    assert prunes.at(10) is not None and prunes.at(9) is None


def test_prunes_compose_in_chain_order() -> None:
    first = prune_record(D, F, [A, B], [[C, E], [D, F]])
    second = prune_record(F, "9" * 40, [E], [[F, "9" * 40]])
    prunes = Prunes([(20, second), (10, first)])  # given out of order
    assert prunes.resolve(D, 5) == ("9" * 40, 20)
    assert prunes.resolve(C, 5) == (None, 20)  # renamed by the first, deleted by the second
    assert prunes.resolve(F, 15) == ("9" * 40, 20)


def test_malformed_prune_records_are_set_aside() -> None:
    prunes = Prunes([(4, prune_record(D, F, ["nope"], [])),
                     (5, {"type": "prune", "from": D}),
                     (6, prune_record(D, F, [A], [[D, F]]))])
    assert prunes.malformed == [4, 5]
    assert [pruning.index for pruning in prunes.prunings] == [6]
