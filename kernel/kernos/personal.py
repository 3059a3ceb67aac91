"""Personal data: values tagged with a data subject, erasable by crypto-shredding.

``personal(value, subject="c-1042")`` wraps a value that belongs to a data
subject.  The wrapper never shows its value by accident: ``repr`` prints
``personal(<hidden>, subject='c-1042')``, summaries in the history do the
same, and ordinary pickling refuses it.  Code reads the value with
``.reveal()`` (or ``.value``).

How the bytes are kept erasable (the choice, and its limits)
-----------------------------------------------------------
Kernos uses *crypto-shredding*.  Every subject gets its own random 256-bit
key, kept in ``<workspace>/keys/``, outside the git history.  The image
serializer never writes a personal value in the clear: it writes the value
sealed (AES-256-GCM) under the subject's key.  The same holds for the audit
log: an event payload that holds personal values, and the code of an op
that tagged values as personal, are written sealed, as payload files beside
the chain.  Erasing the subject destroys its key (overwritten, synced,
unlinked) and deletes the sealed code; every snapshot, packfile, reflog and
old commit that holds the sealed bytes is then unreadable, with no history
rewrite, so the audit chain and the snapshot hashes still verify.  Event
payloads keep their other fields.  A restore or a checkout shows
``personal(<erased>, subject=...)`` where the value was.

Limits, stated plainly:

* only values *inside* the wrapper are protected.  ``name = p.reveal()``
  makes an ordinary, unprotected copy; so does printing it into a cell's
  output, which the notebook file keeps;
* subject ids are kept (in manifests and the audit chain) to prove the
  erasure happened: use pseudonymous ids (``c-1042``), not e-mail addresses;
* copies of the workspace taken before the erasure (backups, clones, git
  bundles) still hold the key; so does every fork (``kernos fork`` copies the
  keys, so that the fork restores the same values): erase the subject in each;
* overwriting a file does not reach blocks that a copy-on-write or
  wear-levelling device keeps; put workspaces with personal data on an
  encrypted volume as well;
* values are sealed with Python's standard pickle: plain data (str, bytes,
  numbers, lists, dicts, dates, ...) and numpy arrays are accepted, objects of
  classes defined in cells are not.

Sealing is deterministic (the nonce is derived from the key and the
plaintext, as in SIV constructions), so an unchanged value pickles to the
same bytes and does not count as a change at every commit.  It reveals
whether two sealed values of the same subject are equal, nothing more.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import json
import os
import pickle
import re
import secrets
import weakref
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from kernos.errors import ErasedValue, UsageError
from kernos.serialize.sealing import register_sealer

__all__ = ["Keyring", "Personal", "check_subject", "personal"]

SUBJECT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@:+\-]{0,127}")
_MAGIC = b"KS1"
_NONCE = 12

# Subjects of the personal values created, and revealed, since the current op
# began (ops run one at a time), and every live wrapper by subject (for erasure).
_created: set[str] = set()
_revealed: set[str] = set()
_live: dict[str, weakref.WeakValueDictionary[int, Personal]] = {}


def check_subject(subject: object) -> str:
    if type(subject) is not str or not SUBJECT.fullmatch(subject):
        raise UsageError(
            f"a data subject is an id of 1-128 characters (letters, digits and _.@:+-, "
            f"starting with a letter or digit), not {str(subject)[:60]!r}; prefer a "
            "pseudonymous id such as 'c-1042'")
    assert isinstance(subject, str)
    return subject


class Personal:
    """A value that belongs to a data subject.  See the module docstring."""

    __slots__ = ("__weakref__", "_erased", "_subject", "_value")

    def __init__(self, value: object, *, subject: str) -> None:
        subject = check_subject(subject)
        if isinstance(value, Personal):
            raise UsageError("personal() of a personal value: wrap the plain value once")
        try:
            pickle.dumps(value, protocol=5)
        except Exception as error:
            raise UsageError(
                f"personal() holds plain data that Python's pickle can store (str, bytes, "
                f"numbers, lists, dicts, dates, arrays); a {type(value).__name__} cannot be "
                f"sealed ({type(error).__name__}: {str(error)[:120]})") from None
        self._value = value
        self._subject = subject
        self._erased = False
        _created.add(subject)
        _track(self)

    @classmethod
    def _restored(cls, subject: str, value: object, erased: bool) -> Personal:
        self = cls.__new__(cls)
        self._value = value
        self._subject = subject
        self._erased = erased
        _track(self)
        return self

    @property
    def subject(self) -> str:
        return self._subject

    @property
    def erased(self) -> bool:
        return self._erased

    def reveal(self) -> Any:
        """The value; :class:`~kernos.errors.ErasedValue` once its subject is erased."""
        if self._erased:
            raise ErasedValue(self._subject)
        _revealed.add(self._subject)
        return self._value

    @property
    def value(self) -> Any:
        return self.reveal()

    def _erase(self) -> None:
        self._value = None
        self._erased = True

    def __repr__(self) -> str:
        state = "erased" if self._erased else "hidden"
        return f"personal(<{state}>, subject={self._subject!r})"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Personal):
            return NotImplemented
        if self._erased or other._erased:
            return self is other
        return bool(self._subject == other._subject and self._value == other._value)

    __hash__ = None  # type: ignore[assignment]

    def __copy__(self) -> Personal:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> Personal:
        if self._erased:
            return self
        # A copy is not a new tag: it does not make the running op's code personal.
        return Personal._restored(self._subject, copy.deepcopy(self._value, memo), False)

    def __reduce_ex__(self, protocol: object) -> Any:
        raise TypeError("a personal value is pickled only by the Kernos image, which seals "
                        "it under its subject's key; reveal() it to copy the plain value")

    # -- sealing (called by the image serializer) --------------------------------

    def _sealed(self, keyring: Keyring) -> tuple[Any, tuple[object, ...]]:
        if self._erased:
            return (erased_personal, (self._subject,))
        plaintext = pickle.dumps(self._value, protocol=5)
        return (open_personal, (self._subject, keyring.seal([self._subject], plaintext)))


# The image pickler writes a personal value sealed under its subject's key.
register_sealer(Personal, Personal._sealed)


def _track(wrapper: Personal) -> None:
    _live.setdefault(wrapper.subject, weakref.WeakValueDictionary())[id(wrapper)] = wrapper


def personal(value: object, *, subject: str) -> Personal:
    """Tag ``value`` as personal data of ``subject`` (see :class:`Personal`)."""
    return Personal(value, subject=subject)


def erased_personal(subject: str) -> Personal:
    """Load-side constructor of an erased value (part of the on-disk format)."""
    return Personal._restored(subject, None, True)


def open_personal(subject: str, sealed: bytes) -> Personal:
    """Load-side constructor of a sealed value (part of the on-disk format)."""
    from kernos.serialize import rebuild

    keyring = rebuild.current_keyring()
    plaintext = keyring.open([subject], sealed) if keyring is not None else None
    if plaintext is None:
        return Personal._restored(subject, None, True)
    return Personal._restored(subject, pickle.loads(plaintext), False)


def created_subjects() -> frozenset[str]:
    """The subjects of the personal values created since the running op began."""
    return frozenset(_created)


def touched_subjects() -> frozenset[str]:
    """The subjects whose values the running op created or revealed: what it sends out of
    the image (an LLM request, say) may hold their data, so it is kept sealed under them."""
    return frozenset(_created | _revealed)


def forget_created() -> None:
    """Start counting afresh (a new op begins)."""
    _created.clear()
    _revealed.clear()


def erase_live(subject: str) -> int:
    """Erase every live wrapper of ``subject`` in this process; returns how many."""
    wrappers = list(_live.pop(subject, {}).values())
    for wrapper in wrappers:
        wrapper._erase()
    return len(wrappers)


def subjects_in(value: object, *, limit: int = 10_000) -> set[str]:
    """Subjects of the personal values inside plain containers (dict, list, tuple)."""
    found: set[str] = set()
    stack = [value]
    seen = 0
    while stack and seen < limit:
        item = stack.pop()
        seen += 1
        if isinstance(item, Personal):
            found.add(item.subject)
        elif type(item) is dict:
            stack.extend(item.values())
        elif type(item) in (list, tuple):
            stack.extend(item)  # type: ignore[arg-type]
    return found


class Keyring:
    """Per-subject keys in ``<workspace>/keys``, one file per subject."""

    def __init__(self, directory: Path, *, durable: bool = True) -> None:
        self.directory = directory
        self.durable = durable
        self._keys: dict[str, bytes] = {}

    def _path(self, subject: str) -> Path:
        return self.directory / (hashlib.sha256(subject.encode()).hexdigest()[:40] + ".key")

    def key(self, subject: str, *, create: bool = False) -> bytes | None:
        found = self._keys.get(subject)
        if found is not None:
            return found
        path = self._path(subject)
        try:
            data = json.loads(path.read_text())
            found = bytes.fromhex(data["key"])
        except FileNotFoundError:
            if not create:
                return None
            found = self._create(subject, path)
        except (ValueError, KeyError, TypeError, OSError) as error:
            from kernos.errors import WorkspaceCorrupt

            raise WorkspaceCorrupt(str(self.directory),
                                   f"the key file {path.name} is unreadable ({error})") from None
        self._keys[subject] = found
        return found

    def _create(self, subject: str, path: Path) -> bytes:
        from kernos._durable import replace_file

        self.directory.mkdir(exist_ok=True)
        key = secrets.token_bytes(32)
        replace_file(path, json.dumps({"subject": subject, "key": key.hex()}).encode(),
                     durable=self.durable, mode=0o600)
        return key

    def subjects(self) -> list[str]:
        found = []
        for path in sorted(self.directory.glob("*.key")):
            try:
                found.append(str(json.loads(path.read_text())["subject"]))
            except (ValueError, KeyError, TypeError, OSError):
                continue
        return sorted(found)

    def _combined(self, subjects: Sequence[str], *, create: bool) -> bytes | None:
        keys = []
        for subject in sorted(set(subjects)):
            key = self.key(subject, create=create)
            if key is None:
                return None
            keys.append(key)
        if len(keys) == 1:
            return keys[0]
        return hashlib.sha256(b"kernos-keys\0" + b"".join(keys)).digest()

    def seal(self, subjects: Sequence[str], plaintext: bytes) -> bytes:
        """Encrypt under the keys of every subject: destroying any one of them shreds it."""
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        key = self._combined(subjects, create=True)
        assert key is not None
        nonce = hmac.new(key, plaintext, hashlib.sha256).digest()[:_NONCE]
        aad = _aad(subjects)
        return _MAGIC + nonce + AESGCM(key).encrypt(nonce, plaintext, aad)

    def open(self, subjects: Sequence[str], sealed: bytes) -> bytes | None:
        """The plaintext, or None when a subject's key was destroyed."""
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        key = self._combined(subjects, create=False)
        if key is None:
            return None
        if not sealed.startswith(_MAGIC):
            return None
        nonce = sealed[len(_MAGIC): len(_MAGIC) + _NONCE]
        try:
            return AESGCM(key).decrypt(nonce, sealed[len(_MAGIC) + _NONCE:], _aad(subjects))
        except InvalidTag:
            return None

    def destroy(self, subject: str) -> bool:
        """Overwrite, sync and delete the subject's key.  Returns whether one existed."""
        from kernos._durable import fsync_dir

        self._keys.pop(subject, None)
        path = self._path(subject)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return False
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, b"\0" * size)
            os.fsync(fd)
        finally:
            os.close(fd)
        path.unlink()
        fsync_dir(self.directory)
        return True


def _aad(subjects: Iterable[str]) -> bytes:
    return json.dumps(sorted(set(subjects))).encode()
