"""Topics and topic patterns: the syntax events are named by.

Events are emitted and delivered by :mod:`kernos.events`; the audit log that
records them filters its records and events by these patterns too
(``AuditLog.records``, ``AuditLog.events_since``), so the syntax sits here,
below both.

A *topic* is one to 16 dot-separated segments of letters, digits, ``_`` and
``-`` (``orders.created``, ``ledger.alice.debit``).  A *pattern* is a topic
whose segments may also be ``*`` (exactly one segment) or, as the last
segment only, ``**`` (zero or more segments).  ``orders.*`` matches
``orders.created`` but not ``orders`` or ``orders.a.b``; ``orders.**``
matches all three; ``**`` matches every topic.  Nothing else is pattern
syntax: a segment like ``ord*`` or ``[a-z]`` is an error, not a literal.
"""

from __future__ import annotations

import re

from kernos.errors import EventError

__all__ = ["check_topic", "compile_pattern", "covers", "matches"]

_SEGMENT = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_SEGMENTS = 16


def check_topic(topic: object) -> str:
    """``topic`` if it is a valid topic, else :class:`EventError` saying why."""
    if type(topic) is not str:
        raise EventError(f"a topic is a string like 'orders.created', not "
                         f"{type(topic).__name__}")
    assert isinstance(topic, str)
    segments = topic.split(".")
    if len(segments) > MAX_SEGMENTS or not all(_SEGMENT.fullmatch(s) for s in segments):
        raise EventError(
            f"{topic[:80]!r} is not a topic: use 1-{MAX_SEGMENTS} dot-separated segments of "
            "letters, digits, '_' and '-' (for example 'orders.created')")
    return topic


def compile_pattern(pattern: object) -> tuple[str, ...]:
    """The segments of a valid pattern, else :class:`EventError` saying why."""
    if type(pattern) is not str:
        raise EventError(f"a topic pattern is a string like 'orders.*', not "
                         f"{type(pattern).__name__}")
    assert isinstance(pattern, str)
    segments = tuple(pattern.split("."))
    problem = None
    if len(segments) > MAX_SEGMENTS:
        problem = f"more than {MAX_SEGMENTS} segments"
    for position, segment in enumerate(segments):
        if segment == "**":
            if position != len(segments) - 1:
                problem = "'**' may only be the last segment"
        elif segment != "*" and not _SEGMENT.fullmatch(segment):
            problem = (f"the segment {segment[:40]!r} is neither a name (letters, digits, '_', "
                       "'-') nor '*' or '**'")
        if problem:
            break
    if problem:
        raise EventError(
            f"{pattern[:80]!r} is not a topic pattern: {problem}. Patterns are dot-separated "
            "segments; '*' matches one segment, a final '**' any number (e.g. 'orders.*', "
            "'ledger.**').")
    return segments


def matches(pattern: tuple[str, ...], topic: str) -> bool:
    """Whether a compiled pattern matches a (valid) topic."""
    parts = topic.split(".")
    if pattern and pattern[-1] == "**":
        head = pattern[:-1]
        if len(parts) < len(head):
            return False
        parts = parts[: len(head)]
        pattern = head
    if len(parts) != len(pattern):
        return False
    return all(p == "*" or p == part for p, part in zip(pattern, parts, strict=True))


def covers(granted: tuple[str, ...], requested: tuple[str, ...]) -> bool:
    """Whether every topic ``requested`` matches is matched by ``granted`` too."""
    g_open = bool(granted) and granted[-1] == "**"
    r_open = bool(requested) and requested[-1] == "**"
    g_head = granted[:-1] if g_open else granted
    r_head = requested[:-1] if r_open else requested
    if any((r == "*" and g != "*") or g not in ("*", r)
           for g, r in zip(g_head, r_head, strict=False)):
        return False
    if not r_open:  # requested topics have exactly len(r_head) segments
        return len(r_head) == len(g_head) or (g_open and len(r_head) >= len(g_head))
    # Requested topics have len(r_head) or more segments (at least one: no topic is empty).
    if not g_open:
        return False
    shortest = max(len(r_head), 1)
    return shortest >= len(g_head) and all(g == "*" for g in g_head[len(r_head):])
