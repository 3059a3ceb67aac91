"""``kernos events --follow`` ends even when closing its connection stalls."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_a_stalled_close_is_reported_and_the_process_exits_with_its_code() -> None:
    script = textwrap.dedent("""
        import threading
        from kernos.cli._kernel import _close_within

        class Stuck:
            def close(self):
                threading.Event().wait()  # a teardown that never ends

        print("the events so far", flush=False)
        _close_within(Stuck(), 0.5, 7)
        print("not reached")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 7
    assert done.stdout == "the events so far\n"  # flushed, nothing after
    assert "closing the connection took over 0.5 s" in done.stderr
    assert "thread kernos-close:" in done.stderr and "in close" in done.stderr


def test_a_prompt_close_returns() -> None:
    from kernos.cli._kernel import _close_within

    closed: list[bool] = []

    class Prompt:
        def close(self) -> None:
            closed.append(True)

    _close_within(Prompt(), 5, 7)
    assert closed == [True]
