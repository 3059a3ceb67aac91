"""A notebook in a module namespace, pickled by the serializer and restored into a fresh one.

A restore never happens in the namespace that was pickled: values are loaded
into a new ``__main__`` module, as after a kernel restart.  While a notebook
runs code, dumps or loads, ``sys.modules['__main__']`` is its module (as it is
in a real kernel); the fixtures put the original back afterwards.
"""

from __future__ import annotations

import sys
import textwrap
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kernos.serialize.pickler import Pickled, Serializer, SharingRecord


def stored_buffers(pickled: Pickled) -> list[Any]:
    """The out-of-band buffers as the image hands them back: copies, writable unless read-only."""
    return [memoryview(bytes(view)) if view.readonly else bytearray(view)
            for view in pickled.buffers]


class Notebook:
    """A cell namespace: ``run`` executes cells in it, ``restore`` reloads names elsewhere."""

    def __init__(self) -> None:
        self.module = types.ModuleType("__main__")
        self.namespace: dict[str, Any] = self.module.__dict__
        self.serializer = Serializer(self.namespace, module=self.module)

    def __getitem__(self, name: str) -> Any:
        return self.namespace[name]

    def __setitem__(self, name: str, value: object) -> None:
        self.namespace[name] = value

    def activate(self) -> None:
        sys.modules["__main__"] = self.module

    def run(self, source: str) -> None:
        self.activate()
        exec(compile(textwrap.dedent(source), "<cell>", "exec", dont_inherit=True),
             self.namespace)

    def dump(self, *names: str, record: SharingRecord | None = None,
             op: int = 1) -> Pickled:
        self.activate()
        return self.serializer.dump([(name, self.namespace[name]) for name in names], op=op,
                                    record=record)

    def load(self, pickled: Pickled, *, live: bool = False) -> tuple[object, ...]:
        """Load ``pickled`` into this namespace (values are returned, not bound)."""
        self.activate()
        live_transients = [transient.obj for transient in pickled.transients] if live else ()
        return self.serializer.load(pickled.stream, stored_buffers(pickled),
                                    live_transients=live_transients)

    def restore(self, *names: str) -> Notebook:
        """A fresh notebook holding ``names`` as loaded from one dump of them."""
        return self.restore_from(self.dump(*names), names)

    @staticmethod
    def restore_from(pickled: Pickled, names: tuple[str, ...] | list[str]) -> Notebook:
        fresh = Notebook()
        values = fresh.load(pickled)
        assert len(values) == len(names)
        for name, value in zip(names, values, strict=True):
            fresh[name] = value
        return fresh


@pytest.fixture
def new_notebook(monkeypatch: pytest.MonkeyPatch) -> Callable[[], Notebook]:
    """Makes notebooks; ``sys.modules['__main__']`` is put back when the test ends."""
    monkeypatch.setitem(sys.modules, "__main__", sys.modules["__main__"])
    return Notebook


@pytest.fixture
def notebook(new_notebook: Callable[[], Notebook]) -> Notebook:
    return new_notebook()


@pytest.fixture
def closing() -> Iterator[Callable[[Any], Any]]:
    """Registers live resources (files, sockets, connections) to close when the test ends."""
    resources: list[Any] = []

    def register(resource: Any) -> Any:
        resources.append(resource)
        return resource

    yield register
    for resource in reversed(resources):
        resource.close()
