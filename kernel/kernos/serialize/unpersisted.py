"""The placeholder a restore puts where a value could not be persisted.

Kernos never drops a value silently and never re-runs code to rebuild one.  An
open file, a socket, a running thread or a generator stays usable in the live
session, but a snapshot can only remember *that it was there* and why it could
not be kept.  After a restore the name (or the slot inside a container) holds
an :class:`Unpersisted` that says exactly that, and any use of it fails with the
same explanation.

Some values have nothing left to lose: a closed file of a kind that cannot be
rebuilt, a finished thread.  Their placeholder is *lossless*: it says so, and
the kernel does not warn about it.
"""

from __future__ import annotations

from typing import Any, NoReturn

__all__ = ["Unpersisted", "UnpersistedValueError"]


class UnpersistedValueError(AttributeError):
    """A value was used that the snapshot could not keep."""


class Unpersisted:
    """Stands in, after a restore, for a value that could not be persisted."""

    __slots__ = ("lossless", "name", "op", "path", "reason", "type_name")

    def __init__(
        self, *, name: str, path: str, type_name: str, reason: str, op: int | None = None,
        lossless: bool = False,
    ) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "path", path)
        object.__setattr__(self, "type_name", type_name)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "lossless", lossless)

    def explain(self) -> str:
        made = f" (stored by op {self.op})" if self.op is not None else ""
        if self.lossless:
            return (f"{self.path} was a {self.type_name} with nothing left to keep{made}: "
                    f"{self.reason}")
        return (
            f"{self.path} was a {self.type_name} that could not be persisted{made}: "
            f"{self.reason}"
        )

    def __repr__(self) -> str:
        return f"<unpersisted {self.type_name} at {self.path}: {self.reason}>"

    def __getattr__(self, attribute: str) -> NoReturn:
        raise UnpersistedValueError(self.explain())

    def __setattr__(self, attribute: str, value: Any) -> NoReturn:
        raise UnpersistedValueError(self.explain())

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise UnpersistedValueError(self.explain())

    def __iter__(self) -> NoReturn:
        raise UnpersistedValueError(self.explain())

    def __bool__(self) -> NoReturn:
        raise UnpersistedValueError(self.explain())

    def __eq__(self, other: object) -> bool:
        if type(other) is not Unpersisted:
            return NotImplemented
        return (self.path, self.type_name, self.reason) == (other.path, other.type_name,
                                                            other.reason)

    def __hash__(self) -> int:
        return hash((self.path, self.type_name, self.reason))

    # Python looks these up on the type, not through __getattr__: each must explain too.
    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise UnpersistedValueError(self.explain())

    __len__ = __getitem__ = __setitem__ = __delitem__ = __contains__ = _refuse
    __next__ = __enter__ = __exit__ = __aenter__ = __aexit__ = __await__ = _refuse
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _refuse
    __truediv__ = __rtruediv__ = __floordiv__ = __mod__ = __pow__ = __matmul__ = _refuse
    __lt__ = __le__ = __gt__ = __ge__ = __neg__ = __abs__ = __int__ = __float__ = _refuse
    __index__ = __fspath__ = _refuse

    def __reduce__(self) -> tuple[Any, ...]:
        if self.lossless:
            return (_make, (self.name, self.path, self.type_name, self.reason, self.op, True))
        return (_make, (self.name, self.path, self.type_name, self.reason, self.op))


def _make(name: str, path: str, type_name: str, reason: str, op: int | None,
          lossless: bool = False) -> Unpersisted:
    return Unpersisted(name=name, path=path, type_name=type_name, reason=reason, op=op,
                       lossless=lossless)
