"""A value that grows stores its new tail, not itself again (content-defined chunks).

The measure is the op's own report of what it wrote (``bytes_written``, the
compressed size of its new objects), for a list of records an agent appends
to at every op, the case that made a workspace's size grow quadratically.
The list here is just too short to be stored in segments (lists that long
or longer are: ``tests/unit/store/test_segments.py``), so its one stream is
what is cut by content.
"""

from __future__ import annotations

import types
from pathlib import Path

from kernos import Image, Workspace
from kernos.store.snapshots import STREAM_CDC_FROM, read_group, read_snapshot

RECORDS = 20_000


def open_image(path: Path) -> tuple[Workspace, Image, dict[str, object]]:
    workspace = Workspace.open(path, purpose="test")
    module = types.ModuleType("__main__")
    image = Image(workspace, module.__dict__, module=module)
    image.restore()
    return workspace, image, module.__dict__


def run(image: Image, namespace: dict[str, object], code: str) -> int:
    op = image.begin(source=code)
    exec(code, namespace)
    return op.commit().bytes_written


def test_appending_a_record_writes_a_few_chunks_not_the_list(tmp_path: Path) -> None:
    workspace, image, namespace = open_image(tmp_path / "ws")
    first = run(image, namespace, f"store = {{'memory': [{{'op': i, 'note': f'record {{i}}', "
                                  f"'v': i / 2}} for i in range({RECORDS})]}}")
    assert first > 100_000  # the whole list, once
    sizes = [run(image, namespace,
                 f"store['memory'].append({{'op': {n}, 'note': 'new', 'v': 0.5}})")
             for n in range(20)]
    assert max(sizes) < first / 10, (first, sizes)
    edited = run(image, namespace, "store['memory'][7000]['v'] = 99.0")
    # One chunk changes (up to 128 KiB: FastCDC's maximum), plus the trees above it.
    assert edited < first / 6, (first, edited)
    head = read_snapshot(workspace, image.head)
    group = read_group(workspace, "store", head.group_trees["store"])
    assert group.stream.by_content and len(group.stream.chunks) > 5
    assert group.stream.size >= STREAM_CDC_FROM
    expected = dict(namespace["store"])  # type: ignore[call-overload]
    workspace.close()

    workspace, image, namespace = open_image(tmp_path / "ws")
    assert namespace["store"] == expected
    # A rollback compares the live value with the stored chunks, cut the same way.
    op = image.begin(source="store['memory'].append('x'); 1 / 0")
    namespace["store"]["memory"].append("x")  # type: ignore[index]
    op.abort()
    assert namespace["store"] == expected
    workspace.close()


def test_short_streams_stay_one_chunk(tmp_path: Path) -> None:
    workspace, image, namespace = open_image(tmp_path / "ws")
    run(image, namespace, "small = list(range(1000))")
    head = read_snapshot(workspace, image.head)
    group = read_group(workspace, "small", head.group_trees["small"])
    assert len(group.stream.chunks) == 1 and not group.stream.by_content
    workspace.close()
