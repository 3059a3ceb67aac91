"""Every corpus payload, run as mallory against Kernos, must reach none of its goals.

For each payload (see ``corpus``): the canary file is neither read nor
written, no secret shows up in any output, error, namespace or host value, no
host object (builtin, frame, module, type, host function) sits in mallory's
namespace or the host's, a denial or breach never lets the op commit, and
afterwards (in the same session and after a restore) fresh ops still work.
"""

from __future__ import annotations

import pytest

from security.corpus import CATEGORIES, CORPUS, ids
from security.goals import World
from security.harness import committed_violations, open_image, run_isolated
from security.payload import Payload

PARAMS = [pytest.param(payload, id=name, marks=(
              [pytest.mark.xfail(strict=True, reason=payload.bug)] if payload.bug else []))
          for payload, name in zip(CORPUS, ids(CORPUS), strict=True)]


@pytest.mark.parametrize("payload", PARAMS)
def test_payload_is_contained(world: World, payload: Payload) -> None:
    report = run_isolated(world, payload)
    assert report.crashed is None, report.crashed
    assert report.killed is None, report.killed
    if payload.stops:  # by a breach in the interpreter, naming the limit
        raised = report.steps[0]["raised"] or ""
        assert any(words in raised for words in payload.stops), report.steps[0]
    live = report.violations
    committed = committed_violations(world)
    assert (live, committed) == ([], []), (payload.goal, report.steps)


def test_corpus_covers_every_category() -> None:
    counts = {category: sum(p.category == category for p in CORPUS) for category in CATEGORIES}
    assert len(CORPUS) >= 110
    assert all(count >= 8 for count in counts.values()), counts
    assert {p.category for p in CORPUS} == set(CATEGORIES)


def test_allowlisted_datetime_formatting_works_for_agents(world: World) -> None:
    """strftime/strptime are allowlisted; their C code imports through the agent's builtins."""
    workspace, image, runtime, _, _ = open_image(world)
    try:
        op = image.begin(source="")
        runtime.run("mallory", "day = datetime.datetime(2020, 1, 2).strftime('%Y-%m-%d')\n"
                               "back = datetime.datetime.strptime(day, '%Y-%m-%d').isoformat()\n")
        op.commit()
        names = runtime.namespace("mallory").user_items()
        assert (names["day"], names["back"]) == ("2020-01-02", "2020-01-02T00:00:00")
    finally:
        workspace.close()
