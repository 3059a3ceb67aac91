"""Property tests of the core: random in-place mutations then a raise change nothing (I1),
and random committed mutations come back exactly after a restore (I2, I3).

The namespace is compared through a canonical form that records both values
and which objects are shared (``b['ref'] is a``), numbering mutable objects in
the order a walk first meets them.
"""

from __future__ import annotations

import contextlib
import tempfile
import types
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernos import Image, Workspace

SETUP = """
class Box:
    def __init__(self, **fields):
        self.__dict__.update(fields)
L = [1, 2, [3]]
D = {'a': 1, 'l': L}
S = {1, 2}
O = Box(x=1, items=L)
T = (L, 5)
n = 3
"""

values = st.one_of(st.integers(-5, 5), st.sampled_from(["'s'", "None", "[0]", "L", "D"]))
keys = st.sampled_from(["'a'", "'b'", "'l'", "'z'"])


@st.composite
def statements(draw: st.DrawFn) -> str:
    v = draw(values)
    k = draw(keys)
    return draw(st.sampled_from([
        f"L.append({v})", "L.pop() if L else None", f"L[0] = {v}",
        f"L.extend([{v}, {v}])", "L[2].append(7) if len(L) > 2 and type(L[2]) is list else None",
        f"D[{k}] = {v}", f"D.pop({k}, None)", f"D.update({{{k}: {v}}})",
        "D['l'].append(9) if type(D.get('l')) is list else None",
        f"S.add({draw(st.integers(0, 9))})", f"S.discard({draw(st.integers(0, 9))})",
        f"O.x = {v}", f"O.extra = {v}", "O.__dict__.pop('x', None)",
        f"n = {v}", f"L = [{v}]", "D = {}", "del n", "del S", f"z = [{v}, L]",
        "w = D", "O.items.append('via O')",
    ]))


def canonical(namespace: dict[str, Any]) -> Any:
    numbering: dict[int, int] = {}

    def walk(value: Any) -> Any:
        if isinstance(value, (int, str, float, type(None))):
            return value
        key = id(value)
        if key in numbering:
            return ("ref", numbering[key])
        numbering[key] = len(numbering)
        tag = numbering[key]
        if isinstance(value, list):
            return ("list", tag, [walk(item) for item in value])
        if isinstance(value, tuple):
            return ("tuple", tag, [walk(item) for item in value])
        if isinstance(value, dict):
            return ("dict", tag, [(walk(k), walk(v)) for k, v in value.items()])
        if isinstance(value, set):
            return ("set", tag, sorted(value, key=repr))
        if isinstance(value, type):
            return ("class", value.__qualname__)
        if hasattr(value, "__dict__"):
            return ("object", tag, type(value).__qualname__, walk(value.__dict__))
        return ("other", repr(value))

    return [(name, walk(namespace[name])) for name in sorted(namespace)
            if not name.startswith("__")]


def new_image(path: Path) -> tuple[Workspace, Image, dict[str, Any]]:
    module = types.ModuleType("__main__")
    workspace = Workspace.open(path)
    image = Image(workspace, module.__dict__, module=module)
    image.restore()
    return workspace, image, module.__dict__


def run(image: Image, namespace: dict[str, Any], source: str) -> None:
    op = image.begin(source=source)
    try:
        exec(source, namespace)
    except BaseException:
        op.abort()
        raise
    op.commit()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=st.lists(statements(), min_size=1, max_size=8))
def test_mutations_followed_by_a_raise_leave_the_image_unchanged(program: list[str]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        workspace, image, namespace = new_image(Path(directory) / "w")
        try:
            run(image, namespace, SETUP)
            before = canonical(namespace)
            source = "\n".join(program) + "\nraise RuntimeError('halfway')"
            # The planned raise, or an earlier statement that failed.
            with contextlib.suppress(Exception):
                run(image, namespace, source)
            assert canonical(namespace) == before, source
        finally:
            workspace.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=st.lists(statements(), min_size=1, max_size=8))
def test_committed_mutations_come_back_exactly_after_a_restore(program: list[str]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "w"
        workspace, image, namespace = new_image(path)
        try:
            run(image, namespace, SETUP)
            for statement in program:  # one op per statement: many small commits
                # A failing op (`del n` twice) rolls back; the next one goes on.
                with contextlib.suppress(Exception):
                    run(image, namespace, statement)
            expected = canonical(namespace)
        finally:
            workspace.close()
        workspace, image, restored = new_image(path)
        try:
            assert canonical(restored) == expected, "\n".join(program)
        finally:
            workspace.close()
