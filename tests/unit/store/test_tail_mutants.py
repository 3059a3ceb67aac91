"""The commit tail's format, counters and failures, pinned exactly.

These close gaps mutation testing (``scripts/mutation store.tail``) found: the
frame's byte layout (a file format other processes and later versions read),
each reason a frame is refused as not whole, which frames ``load`` keeps and
what it reports, when a reader re-reads the file, the durability counters of
group commit (``appended``, ``synced``, ``syncs``) and the calls behind them,
what a failed write or sync leaves in the file and in the tail, the sticky
error's wording (the user reads it to know what to do), and the tail's file
handle (append-only, created, closed, never pickled).
"""

from __future__ import annotations

import copy
import errno
import os
import struct
import zlib
from pathlib import Path

import pytest

from kernos import _faults
from kernos.errors import DiskFull
from kernos.store import tail as tail_module
from kernos.store.tail import Frame, Tail, continuing, decode_frames, encode_frame

A, B, C, X = b"\xaa" * 20, b"\xbb" * 20, b"\xcc" * 20, b"\x11" * 20

LOST = ("the disk did not confirm the commit tail's last frames (fdatasync: {reason}); "
        "commits since the last confirmed one may be lost, so this process commits nothing "
        "more. Restart the kernel: it restores the last commit that is on disk")


def framed(payload: bytes, magic: bytes = b"KTF1") -> bytes:
    """A frame around ``payload`` whose length and CRC are right."""
    return struct.pack(">4sII", magic, len(payload), zlib.crc32(payload)) + payload


def payload_of(commit: bytes, parent: bytes, entries: list[tuple[bytes, bytes]],
               record: bytes = b"", *, count: int | None = None) -> bytes:
    """A frame's payload, laid out by hand as the module's docstring says."""
    body = commit + parent + struct.pack(">I", len(entries) if count is None else count)
    for sha, raw in entries:
        body += sha + struct.pack(">I", len(raw)) + raw
    return body + struct.pack(">I", len(record)) + record


def small(commit: bytes, parent: bytes | None, record: bytes = b"") -> Frame:
    """A frame of one blob (its bytes name the commit) and the commit."""
    return Frame(commit, parent, {X: b"object " + commit[:1], commit: b"commit"}, record)


def test_a_frame_is_laid_out_as_the_format_says() -> None:
    entries = [(X, b"blob bytes"), (C, b"the commit")]
    data = encode_frame(C, B, entries, b'{"op": 3}\n')
    assert data == framed(payload_of(C, B, entries, b'{"op": 3}\n'))
    # No parent: twenty zero bytes; no record: a zero size.
    assert encode_frame(A, None, [(A, b"c")]) == framed(payload_of(A, b"\0" * 20, [(A, b"c")]))
    frames, end = decode_frames(data + encode_frame(A, None, [(A, b"c")]))
    assert frames == [Frame(C, B, {X: b"blob bytes", C: b"the commit"}, b'{"op": 3}\n'),
                      Frame(A, None, {A: b"c"}, b"")]
    assert list(frames[0].objects) == [X, C]  # in the order written
    assert end == len(data) + len(encode_frame(A, None, [(A, b"c")]))


@pytest.mark.parametrize("bad", [
    framed(payload_of(B, A, [(B, b"commit")]), magic=b"KTF2"),
    framed(b"\0" * 8),  # too short to hold a commit: refused, not a crash
    framed(b"\0" * 47),
    framed(payload_of(B, A, [(B, b"commit")]) + b"junk"),  # bytes after the record
    framed(payload_of(B, A, [(X, b"a blob")])),  # the commit is not among its objects
    framed(payload_of(B, A, [(B, b"commit")], count=2)),  # fewer entries than counted
    framed(payload_of(B, A, [(B, b"commit")])[:-4] + struct.pack(">I", 99)),  # record past it
    framed(B + A + struct.pack(">I", 1) + B + struct.pack(">I", 999) + b"commit"
           + struct.pack(">I", 0)),  # an entry past the frame
], ids=["magic", "tiny", "47", "trailing", "no-commit", "count", "record", "entry"])
def test_a_frame_that_is_not_whole_ends_the_tail_there(bad: bytes) -> None:
    good = encode_frame(A, None, [(A, b"commit")])
    after = encode_frame(C, B, [(C, b"commit")])
    frames, end = decode_frames(good + bad + after)
    assert [frame.commit for frame in frames] == [A] and end == len(good)


def test_the_frames_after_the_last_fold_of_the_ref_continue_it() -> None:
    # The ref's commit appears twice (a branch moved back, then forward): the last one counts.
    frames = [Frame(A, None), Frame(B, A), Frame(A, None), Frame(C, A)]
    assert [frame.commit for frame in continuing(frames, A)] == [C]
    assert continuing(frames, B) == []  # after B comes a root, not B's child
    assert continuing([], A) == []


def test_load_keeps_the_continuing_frames_and_every_object(tmp_path: Path) -> None:
    path = tmp_path / "tail"
    first, second = small(A, None), small(B, A, b"record\n")
    data = (encode_frame(A, None, first.objects.items())
            + encode_frame(B, A, second.objects.items(), b"record\n"))
    path.write_bytes(data)
    ref: list[bytes | None] = [A]
    tail = Tail(path, ref=lambda: ref[0], writable=False, durable=True)
    assert tail.load() is True  # whole, but the first frame was folded already
    assert tail.frames == [second] and tail.head == B and tail.size == len(data)
    assert tail.objects == {X: b"object \xbb", A: b"commit", B: b"commit"}  # the later one
    ref[0] = B
    assert tail.load() is True and tail.frames == [] and tail.head is None
    ref[0] = None
    assert tail.load() is False and tail.frames == [first, second]
    path.unlink()
    assert tail.load() is False
    assert (tail.frames, tail.objects, tail.size) == ([], {}, 0)


def test_a_reader_re_reads_the_file_only_when_it_or_the_ref_changed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "tail"
    ref: list[bytes | None] = [None]
    reader = Tail(path, ref=lambda: ref[0], writable=False, durable=True)
    loads: list[int] = []
    real = Tail.load

    def counted(tail: Tail) -> bool:
        loads.append(1)
        return real(tail)

    monkeypatch.setattr(Tail, "load", counted)
    reader.refresh()
    reader.refresh()
    assert len(loads) == 1 and reader.frames == []
    path.write_bytes(encode_frame(A, None, [(A, b"c")]))
    reader.refresh()
    assert len(loads) == 2 and reader.head == A
    reader.refresh()
    assert len(loads) == 2
    ref[0] = A  # folded: the file is the same, the ref moved
    reader.refresh()
    assert len(loads) == 3 and reader.head is None
    path.write_bytes(encode_frame(A, None, [(A, b"c")]) + encode_frame(B, A, [(B, b"c")]))
    reader.refresh()
    assert len(loads) == 4 and reader.head == B
    path.unlink()
    reader.refresh()
    assert len(loads) == 5 and reader.frames == []
    reader.refresh()
    assert len(loads) == 5



def file_descriptor_of(tail: Tail) -> int:
    fd = tail._fd
    assert fd is not None
    return fd


def test_the_counters_say_how_far_durability_reached(tmp_path: Path, syncs: list[int]) -> None:
    path = tmp_path / "tail"
    tail = Tail(path, ref=lambda: None, writable=True, durable=True)
    tail.append(small(A, None))
    fd = os.fstat(file_descriptor_of(tail)).st_ino  # the tail file, as the fixture sees it
    assert syncs == [fd] and (tail.appended, tail.synced, tail.syncs) == (1, 1, 1)
    tail.append(small(B, A), sync=False)
    tail.append(small(C, B), sync=False)
    assert syncs == [fd] and (tail.appended, tail.synced, tail.syncs) == (3, 1, 1)
    tail.sync()
    assert syncs == [fd, fd] and (tail.appended, tail.synced, tail.syncs) == (3, 3, 2)
    tail.sync()  # nothing left to sync: no call
    assert syncs == [fd, fd] and tail.syncs == 2
    tail.append(small(X, C))
    assert syncs == [fd, fd, fd] and (tail.appended, tail.synced, tail.syncs) == (4, 4, 3)
    assert [frame.commit for frame in tail.frames] == [A, B, C, X] and tail.head == X
    assert set(tail.objects) == {X, A, B, C}
    assert tail.size == path.stat().st_size == sum(
        len(encode_frame(f.commit, f.parent, f.objects.items())) for f in tail.frames)
    assert decode_frames(path.read_bytes())[0] == tail.frames
    tail.close()


def test_a_tail_that_is_not_durable_never_syncs_and_never_waits(
        tmp_path: Path, syncs: list[int]) -> None:
    tail = Tail(tmp_path / "tail", ref=lambda: None, writable=True, durable=False)
    tail.append(small(A, None))
    tail.append(small(B, A), sync=False)
    assert syncs == [] and (tail.appended, tail.synced, tail.syncs) == (2, 2, 0)
    tail.sync()
    assert syncs == [] and tail.syncs == 0
    tail.close()


def test_a_sync_covers_what_was_appended_before_it_even_if_more_came_since(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tail = Tail(tmp_path / "tail", ref=lambda: None, writable=True, durable=True)
    tail.append(small(A, None), sync=False)
    real = os.fdatasync

    def meanwhile(fd: int) -> None:  # another thread appends while the disk syncs
        real(fd)
        tail.append(small(B, A), sync=False)

    monkeypatch.setattr(tail_module.os, "fdatasync", meanwhile)
    tail.sync()
    assert (tail.appended, tail.synced, tail.syncs) == (2, 1, 1)
    tail.close()


def test_clear_empties_the_file_and_counts_every_frame_as_durable(
        tmp_path: Path, syncs: list[int]) -> None:
    path = tmp_path / "tail"
    tail = Tail(path, ref=lambda: None, writable=True, durable=True)
    tail.append(small(A, None), sync=False)
    tail.clear()
    assert path.read_bytes() == b"" and (tail.frames, tail.objects, tail.size) == ([], {}, 0)
    assert tail.synced == tail.appended == 1 and syncs == []
    # The file is opened to append: the next frame starts at 0, not where the last one ended.
    tail.append(small(B, None))
    assert path.read_bytes() == encode_frame(B, None, small(B, None).objects.items())
    tail.close()


def test_the_file_is_created_readable_by_others_and_closed_once(tmp_path: Path) -> None:
    path = tmp_path / "tail"
    tail = Tail(path, ref=lambda: None, writable=True, durable=False)
    old = os.umask(0o022)
    try:
        tail.append(small(A, None))
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644
    fd = file_descriptor_of(tail)
    tail.close()
    assert tail._fd is None
    with pytest.raises(OSError):
        os.fstat(fd)
    tail.close()  # twice is fine
    tail.append(small(B, A))  # and it opens again
    assert [frame.commit for frame in decode_frames(path.read_bytes())[0]] == [A, B]
    tail.close()


def test_a_reader_cannot_write(tmp_path: Path) -> None:
    reader = Tail(tmp_path / "tail", ref=lambda: None, writable=False, durable=True)
    with pytest.raises(RuntimeError, match=r"^the commit tail was opened read-only$"):
        reader.append(small(A, None))
    with pytest.raises(RuntimeError, match="read-only"):
        reader.clear()
    assert not (tmp_path / "tail").exists()


def test_a_copy_of_the_tail_has_no_file_handle_and_a_lock_of_its_own(tmp_path: Path) -> None:
    tail = Tail(tmp_path / "tail", ref=lambda: None, writable=True, durable=False)
    tail.append(small(A, None))
    for copied in (copy.copy(tail), copy.deepcopy(tail)):
        assert copied._fd is None and copied._lock is not tail._lock
        assert copied._lock.acquire(blocking=False)
        copied._lock.release()
        assert copied.head == A and copied.appended == 1
    assert tail._fd is not None  # the original keeps its file open
    os.fstat(tail._fd)
    tail.close()


def test_a_failed_write_is_cut_off_and_the_tail_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "tail"
    tail = Tail(path, ref=lambda: None, writable=True, durable=False)
    tail.append(small(A, None))
    before = path.read_bytes()

    def half_then_interrupted(fd: int, data: bytes) -> None:
        os.write(fd, data[: len(data) // 2])
        raise KeyboardInterrupt

    monkeypatch.setattr(tail_module, "write_all", half_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        tail.append(small(B, A))
    assert path.read_bytes() == before and tail.head == A and tail.appended == 1
    monkeypatch.undo()
    tail.append(small(B, A))
    assert [frame.commit for frame in decode_frames(path.read_bytes())[0]] == [A, B]
    tail.close()


def test_a_failed_sync_with_nothing_waiting_fails_only_its_own_frame(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "tail"
    tail = Tail(path, ref=lambda: None, writable=True, durable=True)
    tail.append(small(A, None))
    before = path.read_bytes()
    refusal = OSError(errno.EIO, "Input/output error")

    def refused(fd: int) -> None:
        raise refusal

    monkeypatch.setattr(tail_module.os, "fdatasync", refused)
    with pytest.raises(OSError) as raised:
        tail.append(small(B, A))
    assert raised.value is refusal  # as the disk said it: nothing else is at stake
    assert path.read_bytes() == before and tail.sync_error is None
    assert (tail.head, tail.appended, tail.synced, tail.size) == (A, 1, 1, len(before))
    monkeypatch.undo()
    tail.append(small(B, A))
    assert tail.head == B and tail.synced == 2
    tail.close()


def test_an_interrupted_sync_is_cut_off_and_does_not_stick(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "tail"
    tail = Tail(path, ref=lambda: None, writable=True, durable=True)
    tail.append(small(A, None), sync=False)
    before = path.read_bytes()

    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(tail_module.os, "fdatasync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tail.append(small(B, A))
    assert path.read_bytes() == before and tail.sync_error is None and tail.appended == 1
    tail.close()


def test_a_failed_sync_with_frames_waiting_sticks_and_says_what_to_do(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "tail"
    tail = Tail(path, ref=lambda: None, writable=True, durable=True)
    tail.append(small(A, None), sync=False)
    waiting = path.read_bytes()
    refusal = OSError(errno.EIO, "Input/output error")
    calls: list[int] = []

    def refused(fd: int) -> None:
        calls.append(fd)
        raise refusal

    monkeypatch.setattr(tail_module.os, "fdatasync", refused)
    with pytest.raises(OSError) as raised:
        tail.append(small(B, A))
    message = LOST.format(reason="Input/output error")
    assert type(raised.value) is OSError and raised.value.errno == errno.EIO
    assert raised.value.strerror == message and raised.value.__cause__ is refusal
    assert tail.sync_error is refusal and path.read_bytes() == waiting  # B cut off, A kept
    assert (tail.appended, tail.synced) == (1, 0)
    for attempt in (lambda: tail.sync(), lambda: tail.append(small(B, A))):
        with pytest.raises(OSError) as again:
            attempt()
        assert (again.value.errno, again.value.strerror) == (errno.EIO, message)
    assert len(calls) == 1  # sticky: the disk is not asked again
    assert tail.sync_error is refusal and path.read_bytes() == waiting
    tail.close()


def test_a_sync_the_disk_refuses_for_space_is_a_disk_full_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "tail"
    tail = Tail(path, ref=lambda: None, writable=True, durable=True)
    tail.append(small(A, None), sync=False)
    refusal = OSError(errno.ENOSPC, "No space left on device")

    def refused(fd: int) -> None:
        raise refusal

    monkeypatch.setattr(tail_module.os, "fdatasync", refused)
    with pytest.raises(DiskFull) as raised:
        tail.sync()
    lost = LOST.format(reason="No space left on device")
    assert raised.value.then == lost[0].upper() + lost[1:] + "."
    assert raised.value.what == "the commit tail" and raised.value.errno == errno.ENOSPC
    assert raised.value.__cause__ is refusal and tail.sync_error is refusal
    assert (tail.appended, tail.synced, tail.syncs) == (1, 0, 0)
    for attempt in (lambda: tail.sync(), lambda: tail.append(small(B, A))):
        with pytest.raises(DiskFull) as again:
            attempt()
        assert again.value.then == raised.value.then and again.value.errno == errno.ENOSPC
        assert str(path) in str(again.value)
    tail.close()


def test_an_error_without_a_reason_is_named_as_it_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tail = Tail(tmp_path / "tail", ref=lambda: None, writable=True, durable=True)
    tail.append(small(A, None), sync=False)

    def refused(fd: int) -> None:
        raise OSError("the controller went away")

    monkeypatch.setattr(tail_module.os, "fdatasync", refused)
    with pytest.raises(OSError) as raised:
        tail.sync()
    assert raised.value.errno is None
    assert raised.value.strerror == LOST.format(reason="the controller went away")
    tail.close()


def test_each_sync_passes_the_pause_point_for_a_slow_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    monkeypatch.setattr(_faults, "_paused", "tail.sync")
    monkeypatch.setattr(_faults, "_seconds", "0.001")
    monkeypatch.setattr(_faults.time, "sleep", lambda seconds: events.append(f"pause {seconds}"))
    real = os.fdatasync

    def counted(fd: int) -> None:
        events.append("fdatasync")
        real(fd)

    monkeypatch.setattr(tail_module.os, "fdatasync", counted)
    tail = Tail(tmp_path / "tail", ref=lambda: None, writable=True, durable=True)
    tail.append(small(A, None))
    tail.append(small(B, A), sync=False)
    tail.sync()
    assert events == ["pause 0.001", "fdatasync"] * 2
    tail.close()


def test_a_frame_the_disk_has_no_room_for_says_how_much_it_needed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "tail"
    tail = Tail(path, ref=lambda: None, writable=True, durable=True)
    tail.append(small(A, None))
    before = path.read_bytes()

    def full(fd: int, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tail_module, "write_all", full)
    frame = small(B, A, b"record\n")
    with pytest.raises(DiskFull) as raised:
        tail.append(frame)
    assert raised.value.needed == len(encode_frame(B, A, frame.objects.items(), b"record\n"))
    assert raised.value.what == "the commit tail" and str(path) in str(raised.value)
    assert raised.value.then == ("Nothing was committed: the image is as the last committed "
                                 "op left it.")
    assert path.read_bytes() == before and tail.sync_error is None
    assert (tail.head, tail.appended, tail.synced) == (A, 1, 1)
    tail.close()


def test_a_frame_whose_sync_finds_the_disk_full_with_frames_waiting_is_a_disk_full_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "tail"
    tail = Tail(path, ref=lambda: None, writable=True, durable=True)
    tail.append(small(A, None), sync=False)
    waiting = path.read_bytes()
    refusal = OSError(errno.ENOSPC, "No space left on device")

    def refused(fd: int) -> None:
        raise refusal

    monkeypatch.setattr(tail_module.os, "fdatasync", refused)
    with pytest.raises(DiskFull) as raised:
        tail.append(small(B, A))
    assert raised.value.what == "the commit tail" and str(path) in str(raised.value)
    assert "Restart the kernel" in raised.value.then and raised.value.__cause__ is refusal
    assert tail.sync_error is refusal and path.read_bytes() == waiting
    tail.close()


def test_frames_appended_before_a_close_are_synced_by_a_later_sync(
        tmp_path: Path, syncs: list[int]) -> None:
    tail = Tail(tmp_path / "tail", ref=lambda: None, writable=True, durable=True)
    tail.append(small(A, None), sync=False)
    tail.close()
    assert syncs == [] and tail.synced == 0
    tail.sync()
    assert len(syncs) == 1 and (tail.synced, tail.syncs) == (1, 1)
    tail.sync()  # nothing left: no call
    assert len(syncs) == 1
