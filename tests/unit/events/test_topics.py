"""Topics and topic patterns: validation, matching, and containment (``covers``).

``covers(granted, requested)`` decides capability grants ("a grant to emit
``orders.**`` lets you emit ``orders.*``"), so it must never say yes when some
topic the requested pattern matches is outside the granted one.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernos.audit.topics import MAX_SEGMENTS, check_topic, compile_pattern, covers, matches
from kernos.errors import EventError, UsageError


def p(text: str) -> tuple[str, ...]:
    return compile_pattern(text)


# -- topics ---------------------------------------------------------------------------------


@pytest.mark.parametrize("topic", [
    "a", "orders.created", "ledger.alice.debit", "A-b_C.9", "-", "_",
    "x" * 64, ".".join(["s"] * MAX_SEGMENTS), ".".join(["y" * 64] * MAX_SEGMENTS),
])
def test_valid_topics_are_returned_unchanged(topic: str) -> None:
    assert check_topic(topic) == topic


@pytest.mark.parametrize("topic", [
    "", ".", "a.", ".a", "a..b", "x" * 65, ".".join(["s"] * (MAX_SEGMENTS + 1)),
    "a b", "orders.*", "orders.**", "*", "ord*", "a.[a-z]", "\u00e9t\u00e9", "a/b", "a\n",
    "\u0661", "a.b\t",
])
def test_invalid_topics_raise_event_error_naming_the_topic(topic: str) -> None:
    with pytest.raises(EventError) as caught:
        check_topic(topic)
    message = str(caught.value)
    assert repr(topic[:80]) in message
    assert "is not a topic" in message
    assert "dot-separated" in message  # says what a topic is


@pytest.mark.parametrize("value", [None, 1, b"orders.created", ["orders"], 1.5])
def test_a_topic_that_is_not_a_string_names_its_type(value: object) -> None:
    with pytest.raises(EventError, match=type(value).__name__):
        check_topic(value)


def test_a_str_subclass_is_not_a_topic() -> None:
    class Sneaky(str):
        pass

    with pytest.raises(EventError, match="Sneaky"):
        check_topic(Sneaky("orders.created"))


def test_event_error_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        check_topic("")


def test_a_long_invalid_topic_is_shown_shortened() -> None:
    topic = "bad topic " * 100
    with pytest.raises(EventError) as caught:
        check_topic(topic)
    assert len(str(caught.value)) < 400


# -- patterns -------------------------------------------------------------------------------


@pytest.mark.parametrize("pattern, segments", [
    ("orders.created", ("orders", "created")),
    ("orders.*", ("orders", "*")),
    ("orders.**", ("orders", "**")),
    ("**", ("**",)),
    ("*", ("*",)),
    ("*.*.**", ("*", "*", "**")),
    (".".join(["*"] * MAX_SEGMENTS), ("*",) * MAX_SEGMENTS),
])
def test_valid_patterns_compile_to_their_segments(pattern: str,
                                                  segments: tuple[str, ...]) -> None:
    assert compile_pattern(pattern) == segments


@pytest.mark.parametrize("pattern, problem", [
    ("**.orders", "'**' may only be the last segment"),
    ("a.**.b", "'**' may only be the last segment"),
    ("**.**", "'**' may only be the last segment"),
    ("ord*", "the segment 'ord*'"),
    ("orders.*x", "the segment '*x'"),
    ("orders.***", "the segment '***'"),
    ("a.[a-z]", "the segment '[a-z]'"),
    ("a..b", "the segment ''"),
    ("", "the segment ''"),
    ("a.", "the segment ''"),
    ("a b", "the segment 'a b'"),
    ("x" * 65, "neither a name"),
    ("a\n", "neither a name"),
    (".".join(["*"] * (MAX_SEGMENTS + 1)), f"more than {MAX_SEGMENTS} segments"),
])
def test_invalid_patterns_raise_event_error_naming_the_problem(pattern: str,
                                                               problem: str) -> None:
    with pytest.raises(EventError) as caught:
        compile_pattern(pattern)
    message = str(caught.value)
    assert problem in message
    assert "is not a topic pattern" in message
    assert repr(pattern[:80]) in message


@pytest.mark.parametrize("value", [None, 3, ("orders", "*"), b"orders.*"])
def test_a_pattern_that_is_not_a_string_names_its_type(value: object) -> None:
    with pytest.raises(EventError, match=type(value).__name__):
        compile_pattern(value)


# -- matching -------------------------------------------------------------------------------


@pytest.mark.parametrize("pattern, topic, expected", [
    ("orders.created", "orders.created", True),
    ("orders.created", "orders.paid", False),
    ("orders.created", "orders", False),
    ("orders.created", "orders.created.x", False),
    ("orders.*", "orders.created", True),
    ("orders.*", "orders", False),
    ("orders.*", "orders.a.b", False),
    ("orders.*", "order.created", False),
    ("orders.**", "orders", True),
    ("orders.**", "orders.created", True),
    ("orders.**", "orders.a.b.c", True),
    ("orders.**", "ordersx", False),
    ("orders.**", "order", False),
    ("orders.**", "x.orders", False),
    ("**", "a", True),
    ("**", "a.b.c.d", True),
    ("*", "a", True),
    ("*", "a.b", False),
    ("*.created", "orders.created", True),
    ("*.created", "orders.paid", False),
    ("*.*.**", "a", False),
    ("*.*.**", "a.b", True),
    ("*.*.**", "a.b.c", True),
    ("Orders.*", "orders.x", False),  # case matters
])
def test_matches(pattern: str, topic: str, expected: bool) -> None:
    assert matches(p(pattern), check_topic(topic)) is expected


# -- containment ----------------------------------------------------------------------------


@pytest.mark.parametrize("granted, requested, expected", [
    ("**", "**", True),
    ("**", "orders.*", True),
    ("**", "a.b.c", True),
    ("orders.**", "orders.**", True),
    ("orders.**", "orders.*", True),
    ("orders.**", "orders", True),
    ("orders.**", "orders.a.**", True),
    ("orders.**", "**", False),
    ("orders.**", "*.created", False),
    ("orders.**", "order.**", False),
    ("orders.*", "orders.created", True),
    ("orders.*", "orders.*", True),
    ("orders.*", "orders.**", False),  # orders.** also matches orders and orders.a.b
    ("orders.*", "orders", False),
    ("orders.*", "*.created", False),
    ("orders.created", "orders.*", False),
    ("orders.created", "orders.created", True),
    ("*.created", "orders.created", True),
    ("*.created", "*.created", True),
    ("*.created", "*.*", False),
    ("a.*.**", "a.**", False),  # a.** matches a, which a.*.** does not
    ("a.*.**", "a.b.**", True),
    ("a.*.**", "a.b", True),
    ("a.b.**", "a.*.**", False),
    ("*", "**", False),
])
def test_covers(granted: str, requested: str, expected: bool) -> None:
    assert covers(p(granted), p(requested)) is expected


# Exhaustive check on a small universe.  Patterns use the literals a and b;
# topics also use c, which stands for "any other name", and are one segment
# longer than the longest pattern head, so a topic that separates two patterns
# exists in this universe whenever one exists at all.
_PATTERN_SEGMENTS = ("a", "b", "*")
_PATTERNS = [".".join(parts) for n in range(1, 4)
             for parts in itertools.product(_PATTERN_SEGMENTS, repeat=n)]
_PATTERNS += [".".join((*parts, "**")) for n in range(0, 4)
              for parts in itertools.product(_PATTERN_SEGMENTS, repeat=n)]
_TOPICS = [".".join(parts) for n in range(1, 6) for parts in itertools.product("abc", repeat=n)]


def _matched_sets() -> dict[str, frozenset[str]]:
    return {pattern: frozenset(topic for topic in _TOPICS if matches(p(pattern), topic))
            for pattern in _PATTERNS}


def test_covers_never_grants_more_than_the_granted_pattern_matches() -> None:
    matched = _matched_sets()
    unsound = [(granted, requested) for granted in _PATTERNS for requested in _PATTERNS
               if covers(p(granted), p(requested)) and not matched[requested] <= matched[granted]]
    assert unsound == []


# "*.**" and "**" match exactly the same topics (a topic has at least one segment).
_KNOWN_INCOMPLETE = {("*.**", "**")}


def test_covers_is_exact_on_a_small_universe() -> None:
    matched = _matched_sets()
    wrong = [(granted, requested) for granted in _PATTERNS for requested in _PATTERNS
             if (granted, requested) not in _KNOWN_INCOMPLETE
             and covers(p(granted), p(requested)) != (matched[requested] <= matched[granted])]
    assert wrong == []


def test_star_then_double_star_covers_double_star() -> None:
    assert covers(p("*.**"), p("**")) is True


# -- properties (hypothesis) ----------------------------------------------------------------

_NAMES = st.sampled_from(["a", "b", "c", "x-1", "Y_2"])


@st.composite
def patterns(draw: st.DrawFn) -> tuple[str, ...]:
    head = draw(st.lists(st.one_of(_NAMES, st.just("*")), min_size=0, max_size=6))
    if draw(st.booleans()) or not head:
        return compile_pattern(".".join([*head, "**"]))
    return compile_pattern(".".join(head))


@st.composite
def topics_of(draw: st.DrawFn, pattern: tuple[str, ...]) -> str:
    """A topic that ``pattern`` matches."""
    parts: list[str] = []
    for segment in pattern:
        if segment == "*":
            parts.append(draw(st.one_of(_NAMES, st.just("other"))))
        elif segment == "**":
            parts += draw(st.lists(st.one_of(_NAMES, st.just("other")), max_size=4))
        else:
            parts.append(segment)
    if not parts:
        parts = [draw(_NAMES)]
    return check_topic(".".join(parts[:MAX_SEGMENTS]))


@settings(max_examples=300, deadline=None)
@given(data=st.data(), granted=patterns(), requested=patterns())
def test_covered_patterns_only_match_topics_the_grant_matches(
        data: st.DataObject, granted: tuple[str, ...], requested: tuple[str, ...]) -> None:
    topic = data.draw(topics_of(requested))
    if len(topic.split(".")) == MAX_SEGMENTS:
        return  # truncated: not necessarily a topic of ``requested``
    assert matches(requested, topic)
    if covers(granted, requested):
        assert matches(granted, topic), (granted, requested, topic)


@settings(max_examples=200, deadline=None)
@given(pattern=patterns())
def test_every_pattern_covers_itself_and_is_covered_by_everything(
        pattern: tuple[str, ...]) -> None:
    assert covers(pattern, pattern)
    assert covers(("**",), pattern)


@settings(max_examples=300, deadline=None)
@given(a=patterns(), b=patterns(), c=patterns())
def test_covers_is_transitive(a: tuple[str, ...], b: tuple[str, ...],
                              c: tuple[str, ...]) -> None:
    if covers(a, b) and covers(b, c):
        assert covers(a, c)


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=st.sampled_from("ab.*-_ \u00e9\n"), max_size=12))
def test_validation_raises_only_event_error_and_accepts_only_what_it_promises(
        text: str) -> None:
    try:
        check_topic(text)
    except EventError:
        pass
    else:
        segments = text.split(".")
        assert 1 <= len(segments) <= MAX_SEGMENTS
        assert all(segment and set(segment) <= set("ab-_") for segment in segments)
    try:
        compiled = compile_pattern(text)
    except EventError:
        pass
    else:
        assert ".".join(compiled) == text
        assert "**" not in compiled[:-1]
        assert all(s in ("*", "**") or (s and set(s) <= set("ab-_")) for s in compiled)
