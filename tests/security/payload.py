"""The payload type of the escape corpus, and the preludes payloads share.

A payload is run as ``mallory`` (see ``harness``).  The goals are always one
of: the canary file's content (read it, or write ``target_path``), a secret
(the human's ``SECRET``, the victim's ``vsecret``), or a real host object
(``open``, ``__import__``, ``type``, ``object``, a frame, a module, a host
function) kept in mallory's namespace, written to the host or handed to the
human.  The checks are generic (``goals``): a payload only says what it
tries, in the most promising way for each route, and with preludes that work
both in Kernos and in the naive sandbox of ``test_naive_policy``.

``corpus_reach`` holds the categories that try to *reach* something (frames,
format, dunder, imports), ``corpus_effects`` those that try to *do*
something (reduce, baseexception, swallow, typeconfusion, namespaces),
``corpus_bombs`` the bombs (timebombs, resources); ``corpus.CORPUS`` is all
of them.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass


@dataclass(frozen=True)
class Payload:
    category: str
    goal: str
    """What the attack tries to reach, in words (the checks are generic)."""
    source: str
    """mallory's code, run in one op that is then committed (or rolled back)."""
    followup: str | None = None
    """mallory's code for the next op (a time bomb's trigger, say)."""
    victim: str | None = None
    """victim's code for an op after mallory's (names it sets must start with ``v_``)."""
    host: str | None = None
    """Human Python run in an op afterwards, with ``agents`` in scope; it sets ``result``."""
    naive: bool = True
    """Whether the naive sandbox may run it (False for bombs it has no limit for)."""
    bug: str | None = None
    """Set when Kernos does not contain it: the test is then a strict xfail."""
    stops: tuple[str, ...] = ()
    """For a bomb a limit stops: the error of its op names one of these (the limits that
    may stop it first)."""


def code(text: str) -> str:
    return textwrap.dedent(text).strip("\n") + "\n"


# Preludes that work both against Kernos (read() gives a view; .copy() the value)
# and against the naive sandbox (read() gives the raw object).
PATH = code("""
    p = read('canary_path')
    path = p if isinstance(p, str) else p.copy()
    t = read('target_path')
    target = t if isinstance(t, str) else t.copy()
    leaks = []
""")

# What a payload does once it holds the real builtins (a dict or a module).
USE_BUILTINS = code("""
    def use(b):
        try:
            opener = b['open']
        except Exception:
            opener = b.open
        handle = opener(path)
        leaks.append(handle.read())
        handle.close()
        handle = opener(target, 'w')
        handle.write('pwned')
        handle.close()
        print(leaks)
""")


def attempt(body: str) -> str:
    """PATH + USE_BUILTINS + ``body`` run inside try/except Exception (printing the error)."""
    indented = textwrap.indent(code(body), "    ")
    return PATH + USE_BUILTINS + "try:\n" + indented + (
        "except Exception as error:\n    print('blocked:', error)\n")


def P(category: str, goal: str, source: str, **options: object) -> Payload:
    return Payload(category=category, goal=goal, source=source, **options)  # type: ignore[arg-type]


def tool_source(body: str) -> str:
    """``src = (...)``: agent code that binds ``src`` to ``body`` (a tool's source)."""
    lines = code(body).splitlines(keepends=True)
    return "src = (\n" + "".join(f"    {line!r}\n" for line in lines) + ")\n"
