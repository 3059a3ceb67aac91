"""verify() on payloads an erasure deleted: a subject can be erased more than once.

``erase()`` accepts a subject again once a new value gave it a new key, and
the second erasure deletes the code sealed for it since the first.  verify
kept only a subject's *first* erasure, so it called that second deletion
tampering; it now keeps the latest (found by ``scripts/mutation audit.verify``,
whose ``setdefault`` survivors showed no test had a subject erased twice).
"""

from __future__ import annotations

from pathlib import Path

from core_support import CoreEnv
from kernos.audit import erase, verify
from kernos.personal import personal


def test_a_subject_erased_twice_explains_the_payloads_of_both_times(tmp_path: Path) -> None:
    env = CoreEnv(tmp_path / "ws", hidden={"personal": personal})
    padding = "# padding\n" * 600  # the code goes to a payload, sealed for the subject
    env.run(f"a = personal('first', subject='c-alice')\n{padding}")
    first = erase(env.image.audit, "c-alice")
    env.run(f"b = personal('second', subject='c-alice')\n{padding}")
    second = erase(env.image.audit, "c-alice")
    anchor = f"2:{env.image.audit.read(2)['hash']}"  # the first erasure
    env.close()
    assert (first.record, second.record) == (2, 4)
    assert len(first.payloads) == len(second.payloads) == 1
    report = verify(env.path)
    assert report.ok, report.summary()
    since = verify(env.path, since=anchor)
    assert since.ok, since.summary()
