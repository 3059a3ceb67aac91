"""Rolling an op back: the image's namespace put back as the last commit left it.

:class:`Rollback` is the rollback half of the image's participant
(:class:`kernos.image.changes.ImageParticipant`).  Names the op added,
deleted or rebound get back the exact objects of the last commit; a group in
the op's reach whose live values no longer pickle as stored (``_verdict``,
which a commit uses too) is reloaded from the snapshot, or, when its values
hold live resources, reset in place or left as the op left them, and the
:class:`~kernos.op.AbortReport` says which.
"""

from __future__ import annotations

import contextlib
import gc
import types
from typing import Any

from kernos.determinism import GeneratorParticipant
from kernos.image.state import GroupState, ImageState
from kernos.op import AbortReport, Op
from kernos.serialize.pickler import Pickled
from kernos.serialize.unpersisted import Unpersisted
from kernos.store.snapshots import StoredGroup, chunk_ids

__all__ = ["MISSING", "Rollback"]

MISSING = object()
"""What a name that is not bound looks up to."""
ATOMIC = frozenset({str, bytes, int, float, complex, bool, type(None)})
"""Types whose values hold no other objects."""


class Rollback:
    """Undoes an op on the image (mixed into the image's participant)."""

    op: Op
    image: ImageState
    generators: GeneratorParticipant

    def _rollback(self) -> AbortReport:
        image = self.image
        committed = image.committed
        removed = [name for name in image.persisted_names() if name not in committed]
        for name in removed:
            image.unbind(name)
        rebound: list[str] = []
        deleted: list[str] = []
        for name, value in committed.items():
            now = image.lookup(name, MISSING)
            if now is not value:
                (deleted if now is MISSING else rebound).append(name)
                image.bind(name, value)
        reach = image.expand(self.op.reach, committed)
        names = set(committed) if reach.everything else reach.names & committed.keys()
        keys = {image.group_of[name] for name in names if name in image.group_of}
        stale: dict[str, StoredGroup] = {}
        left_live: dict[str, str] = {}
        for key in sorted(keys):
            state = image.groups[key]
            if state.load_error is not None:
                continue
            verdict = self._verdict(state, settle=True)
            if verdict == "changed":
                stale[key] = state.stored
            elif verdict == "unsure":
                left_live.update(dict.fromkeys(state.stored.names, _UNSURE))
        reloaded, not_reset = self._reload(stale, left_live)
        image.unreset.update(left_live)
        # A value that is itself a live resource (an open file, a client holding threads)
        # is not in the image: whatever the op did to it stays done.
        not_reset += [name for name in sorted(names - set(not_reset)) if self._is_resource(name)]
        system = {name for name in removed + rebound + deleted if name.startswith("kernos:")}
        return AbortReport(
            op=self.op.id, removed=sorted(set(removed) - system),
            rebound=sorted(set(rebound) - system), deleted=sorted(set(deleted) - system),
            reloaded=sorted(reloaded), not_reset=sorted(not_reset),
            left_live={name: left_live[name] for name in sorted(set(left_live) - system)},
            random_reset=self.generators.reset)

    def _reload(self, stale: dict[str, StoredGroup],
                left_live: dict[str, str]) -> tuple[list[str], list[str]]:
        """Put back the committed values of groups the op changed in place.

        A group whose values hold live resources is not replaced by a copy: the
        copy would still talk to the live parts (a client's sockets and threads).
        If each of its names is a live resource itself, a container (a plain
        dict or list, or an instance of a class defined in a cell) or unchanged,
        the containers are reset in place from the copy (the copy holds the
        very same live objects; what it holds directly of the group's values is
        swapped for the live ones), unless something deeper inside the copy
        refers to one of the group's copied values.  Any other such group (a
        library's client holding sockets and threads, say) stays as the op left
        it, is reported, and is written by the next commit.

        A group whose stored values cannot be loaded now stays live too (in
        ``left_live``, with the loader's reason): its copy would be placeholders.
        """
        image = self.image
        committed = image.committed
        live = {key: image.groups[key].live_transients for key in stale}
        in_place: dict[str, list[str]] = {}
        loadable: dict[str, StoredGroup] = {}
        not_reset: list[str] = []
        for key, stored in stale.items():
            resources = [obj for obj in live[key] if not isinstance(obj, Unpersisted)]
            if not resources:
                loadable[key] = stored
                continue
            containers = [name for name in stored.names
                          if self._contents(committed[name]) is not None]
            others = [name for name in stored.names if name not in containers
                      and not any(committed[name] is obj for obj in resources)]
            changed = self._changed_names(stored, others) if others else []
            if not changed:
                loadable[key] = stored
                in_place[key] = containers
            else:
                not_reset += self._changed_names(stored)
        values, failed = image.load_groups(loadable, live=live) if loadable else ({}, set())
        reloaded: list[str] = []
        for key in loadable:
            names = loadable[key].names
            if failed & set(names):
                for name in names:
                    reason = getattr(values[name], "reason", "it could not be loaded")
                    left_live[name] = f"its stored value could not be loaded: {reason}"
                continue
            if key not in in_place:
                for name in names:
                    image.bind(name, values[name])
                    committed[name] = values[name]
                reloaded += names
                continue
            containers = in_place[key]
            roots = {id(values[name]): committed[name] for name in names}
            copies = {name: self._contents(values[name]) for name in containers}
            if any(roots.get(id(type(values[name])), type(values[name]))
                   is not type(committed[name]) or copies[name] is None
                   or _reaches(copies[name], roots) for name in containers):
                not_reset += containers
                continue
            for name in containers:
                _transplant(self._contents(committed[name]), copies[name], roots)
            reloaded += containers
        image.unreset.update(not_reset)
        return reloaded, not_reset

    def _is_resource(self, name: str) -> bool:
        """Whether ``name`` holds, as a whole, a live object that could not be persisted."""
        image = self.image
        key = image.group_of.get(name)
        value = image.committed.get(name, MISSING)
        return key is not None and any(
            value is obj for obj in image.groups[key].live_transients
            if not isinstance(obj, Unpersisted))

    def _contents(self, value: object) -> dict[Any, Any] | list[Any] | None:
        """What a rollback may reset in place: a plain dict or list, or the attributes of
        an instance of a class defined in a cell (the user's own object, not a library's)."""
        if type(value) in (dict, list):
            return value  # type: ignore[return-value]
        attributes = getattr(value, "__dict__", None)
        kind = type(value)
        if (type(attributes) is dict and not isinstance(value, type)
                and "__slots__" not in kind.__dict__ and kind.__module__ is not None
                and self.image.serializer.is_by_value(kind)):
            return attributes
        return None

    def _changed_names(self, stored: StoredGroup,
                       names: list[str] | None = None) -> list[str]:
        """The names of a group (or those of ``names``) whose values no longer pickle as
        their committed content."""
        image = self.image
        changed = []
        for name in stored.names if names is None else names:
            try:
                pickled = image.serializer.dump([(name, image.committed[name])], op=self.op.id)
            except Exception:
                changed.append(name)
                continue
            meta = image.meta.get(name)
            if meta is None or meta.hash != image.content_hash(pickled):
                changed.append(name)
        return changed

    def _verdict(self, state: GroupState, *, settle: bool = False) -> str:
        """Whether the group's live values hold what is stored: ``same`` or ``changed``.

        They are pickled as a commit stores them and compared with the stored
        stream and buffers, or, for values loaded from the store, with what they
        pickled to when loaded (``Image.baselines``).  With ``settle`` (a
        rollback), a group loaded but without a baseline yet gets one, and a
        difference is checked by pickling once more: values that pickle
        differently each time (some library object draws a counter or a clock in
        its ``__getstate__``) are ``unsure``: bytes cannot tell whether the op
        changed them.
        """
        image = self.image
        stored = state.stored
        values = [image.committed[name] for name in stored.names]
        try:
            pickled = image.pickle_group(stored.names, values)
        except Exception:
            return "changed"
        if _stored_as(pickled, stored, image):
            return "same"
        if settle:
            image.ensure_baseline(stored)
        if image.baselines.get(stored.tree) == image.content_hash(pickled):
            return "same"
        if settle:
            with contextlib.suppress(Exception):
                again = image.pickle_group(stored.names, values)
                if image.content_hash(again) != image.content_hash(pickled):
                    return "unsure"
        return "changed"


def _stored_as(pickled: Pickled, stored: StoredGroup, image: ImageState) -> bool:
    """Whether ``pickled`` is, byte for byte, what ``stored`` holds."""
    if len(pickled.buffers) != len(stored.buffers):
        return False
    parts = [(memoryview(pickled.stream), stored.stream)]
    parts += list(zip(pickled.buffers, stored.buffers, strict=True))
    return all(len(data) == part.size
               and chunk_ids(data, image.cache, by_content=part.by_content) == part.chunks
               for data, part in parts)


_UNSURE = ("it pickles differently each time, so whether the cell changed it cannot be "
           "told; a copy would cut it off from what it shares")


def _transplant(live: Any, copy: Any, roots: dict[int, object]) -> None:
    """Give a live dict or list the contents of its reloaded copy, keeping its identity.

    ``roots`` maps the copies of the group's containers to the live ones, so a
    container held directly by another is the live one, not its copy.
    """
    if type(live) is dict:
        live.clear()
        live.update({key: roots.get(id(value), value) for key, value in copy.items()})
    else:
        live[:] = [roots.get(id(value), value) for value in copy]


def _reaches(copy: Any, roots: dict[int, object], budget: int = 100_000) -> bool:
    """Whether anything below the direct contents of ``copy`` refers to a copied container
    (bounded: unsure means yes).  Those references could not be pointed at the live ones."""
    children = list(copy.values()) + list(copy) if type(copy) is dict else list(copy)
    seen = set(roots)
    frontier = [child for child in children if id(child) not in roots]
    while frontier:
        for child in _referents(frontier.pop()):
            if id(child) in roots:
                return True
            if id(child) in seen or type(child) in ATOMIC or isinstance(child, type):
                continue
            seen.add(id(child))
            frontier.append(child)
            budget -= 1
            if budget <= 0:
                return True
    return False


def _referents(obj: object) -> list[object]:
    """What ``obj`` holds; a function's globals (the namespace, a module) are not its own."""
    if isinstance(obj, types.FunctionType):
        held: list[object] = list(obj.__defaults__ or ())
        for cell in obj.__closure__ or ():
            with contextlib.suppress(ValueError):  # an empty cell
                held.append(cell.cell_contents)
        return held
    if isinstance(obj, types.ModuleType):
        return []
    return gc.get_referents(obj)

