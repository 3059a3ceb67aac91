"""File globs, as ``file:read:GLOB`` and ``file:write:GLOB`` grants write them.

A glob is a ``/``-separated relative path over the allowlisted characters
(letters, digits, ``_ . - / * ?``), matched against a file's path relative to
the files root, component by component:

=============  ============================================================
``*``          any characters within one component (never a ``/``), also
               none: ``reports/*.md`` matches ``reports/r.md``, not
               ``reports/2024/r.md``
``?``          exactly one character within one component
``**``         a whole component only: any number of components.  At the
               end it needs at least one (``reports/**`` is every file
               under ``reports/``, at any depth, not a file named
               ``reports``); elsewhere also none (``a/**/b.md`` matches
               ``a/b.md`` and ``a/x/y/b.md``; ``**/*.md`` every ``.md``)
anything else  itself, exactly (case matters)
=============  ============================================================

A glob never names a directory as such: ``reports`` matches only a file
called ``reports``; write ``reports/**`` for what is under it.  A dot is
an ordinary character (``*`` matches ``.hidden``).

Refused (:func:`check_glob`, InvalidGrant): anything else than those
characters, an empty glob or component (``a//b``, a trailing ``/``), a
leading ``/``, a ``.`` or ``..`` component, ``**`` inside a component
(``a**``), more than 256 characters or 32 components.
"""

from __future__ import annotations

import functools
import re

from kernos.errors import InvalidGrant

__all__ = ["MAX_GLOB", "check_glob", "glob_matches"]

MAX_GLOB = 256
MAX_COMPONENTS = 32
_CHARACTERS = re.compile(r"[A-Za-z0-9_.\-/*?]+")


def check_glob(glob: object) -> str:
    """``glob`` if it is a well-formed file glob, else InvalidGrant saying what is wrong."""
    if type(glob) is not str:
        raise InvalidGrant(f"a file glob is a string like 'reports/*.md', not "
                           f"{type(glob).__name__}")
    assert isinstance(glob, str)
    if not glob or len(glob) > MAX_GLOB:
        raise InvalidGrant(f"a file glob has 1 to {MAX_GLOB} characters (like 'reports/*.md')")
    if not _CHARACTERS.fullmatch(glob):
        raise InvalidGrant(f"the file glob {glob[:80]!r} may hold only letters, digits and "
                           "'_', '.', '-', '/', '*', '?'")
    if glob.startswith("/"):
        raise InvalidGrant(f"the file glob {glob[:80]!r} is absolute; globs are relative to "
                           "the files root (write 'reports/*', not '/reports/*')")
    parts = glob.split("/")
    if len(parts) > MAX_COMPONENTS:
        raise InvalidGrant(f"the file glob {glob[:80]!r} has over {MAX_COMPONENTS} components")
    for part in parts:
        if part == "":
            raise InvalidGrant(f"the file glob {glob[:80]!r} has an empty component ('//' or "
                               "a trailing '/'); write 'reports/**' for a whole directory")
        if part in (".", ".."):
            raise InvalidGrant(f"the file glob {glob[:80]!r} has a {part!r} component")
        if "**" in part and part != "**":
            raise InvalidGrant(f"the file glob {glob[:80]!r}: '**' must be a whole component "
                               "('reports/**', 'a/**/b.md'); use '*' within a name")
    return glob


@functools.lru_cache(maxsize=1024)
def _component(part: str) -> re.Pattern[str]:
    pattern = "".join("[^/]*" if char == "*" else "[^/]" if char == "?" else re.escape(char)
                      for char in part)
    return re.compile(pattern, re.DOTALL)


def glob_matches(glob: str, path: str) -> bool:
    """Whether the relative ``path`` (``/``-separated, checked) matches ``glob`` (checked)."""
    pattern = glob.split("/")
    names = path.split("/")
    count = len(names)
    if "**" not in pattern and len(pattern) != count:
        return False
    # rest[j]: whether the pattern's components from i on match names[j:] (no recursion:
    # a path may have hundreds of components)
    rest = [j == count for j in range(count + 1)]
    for i in reversed(range(len(pattern))):
        part = pattern[i]
        if part == "**":
            least = 1 if i == len(pattern) - 1 else 0
            later = [False] * (count + 2)  # later[k]: rest[k] or rest[k + 1] or ...
            for k in reversed(range(count + 1)):
                later[k] = rest[k] or later[k + 1]
            rest = [j + least <= count and later[j + least] for j in range(count + 1)]
        else:
            compiled = _component(part)
            rest = [j < count and rest[j + 1] and compiled.fullmatch(names[j]) is not None
                    for j in range(count + 1)]
    return rest[0]
