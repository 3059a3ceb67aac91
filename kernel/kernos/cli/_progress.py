"""Progress on stderr, for the waits a person would otherwise watch in silence.

Shown only when stderr is a terminal, or with ``--progress`` (and never with
``--no-progress``), so stdout stays clean for pipes and ``--json``.  On a
terminal the line is redrawn in place by a ticker thread (the main thread is
usually blocked in a kernel request); elsewhere each phase prints one line
when it starts and one when it ends, and a bar prints at most every tenth.
A phase with no known total shows a spinner; :meth:`Progress.update` turns it
into a bar with the percentage (and megabytes, for a count of bytes), as the
kernel's ``kernos_progress`` messages do through :meth:`Progress.follow`.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

__all__ = ["Progress"]

_WIDTH = 24
_QUIET_SECONDS = 0.3
"""A terminal shows nothing for waits shorter than this (no flicker on fast commands)."""


class Progress:
    """Phases (``phase``), optionally with a bar (``update``); ``close`` ends the last one."""

    def __init__(self, enabled: bool, *, tty: bool, stream: TextIO | None = None,
                 interval: float = 0.2) -> None:
        self.enabled = enabled
        self._tty = tty
        self._stream = stream if stream is not None else sys.stderr
        self._interval = interval
        self._lock = threading.Lock()
        self._label: str | None = None
        self._started = 0.0
        self._fraction: float | None = None
        self._sizes: tuple[int, int] | None = None
        self._last_tenth = -1
        self._drawn = False
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def phase(self, label: str) -> None:
        """Start a phase (ending the one before): ``kernos: LABEL  1.2 s``."""
        if not self.enabled:
            return
        with self._lock:
            self._finish_locked()
            self._label, self._started, self._fraction = label, time.monotonic(), None
            self._sizes = None
            self._last_tenth = -1
            if self._tty:
                self._draw_locked()
                if self._ticker is None:
                    self._ticker = threading.Thread(target=self._tick, daemon=True,
                                                    name="kernos-progress")
                    self._ticker.start()
            else:
                self._write(f"kernos: {label} ...\n")

    def update(self, done: int, total: int, *, in_bytes: bool = False) -> None:
        """The current phase is ``done`` of ``total`` through (a bar instead of a spinner);
        ``in_bytes`` also shows the megabytes."""
        if not self.enabled or self._label is None or total <= 0:
            return
        with self._lock:
            self._fraction = min(1.0, max(0.0, done / total))
            self._sizes = (min(done, total), total) if in_bytes else None
            if self._tty:
                self._draw_locked()
            elif round(self._fraction * 100) // 10 > self._last_tenth:
                self._last_tenth = round(self._fraction * 100) // 10  # as the percent shows
                self._write(f"kernos: {self._label} {self._fraction:.0%}{self._megabytes()}\n")

    def follow(self, label: str) -> Callable[[str, int, int], None] | None:
        """A client ``progress`` callback that draws the kernel's progress messages as
        the bar of phase ``label`` (the current one); a restore the request waits for
        gets a phase of its own, after which ``label`` starts again.  None when no
        progress is shown (so the client does not wait for progress messages)."""
        if not self.enabled:
            return None
        restoring = False

        def show(what: str, done: int, total: int) -> None:
            nonlocal restoring
            if (what == "restore") != restoring:
                restoring = what == "restore"
                self.phase("restoring the image" if restoring else label)
            self.update(done, total, in_bytes=True)
            if restoring and done >= total:
                restoring = False
                self.phase(label)

        return show

    def close(self) -> None:
        """End the last phase and stop the ticker (safe to call twice)."""
        if not self.enabled:
            return
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        with self._lock:
            self._finish_locked()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    # -- drawing ---------------------------------------------------------------

    def _finish_locked(self) -> None:
        if self._label is None:
            return
        elapsed = time.monotonic() - self._started
        if self._tty:
            if self._drawn:
                self._write("\r\x1b[K")  # the finished phase leaves no line behind
            self._drawn = False
        else:
            self._write(f"kernos: {self._label} done in {elapsed:.1f} s\n")
        self._label = None

    def _draw_locked(self) -> None:
        if self._label is None:
            return
        elapsed = time.monotonic() - self._started
        if elapsed < _QUIET_SECONDS:
            return
        if self._fraction is None:
            spinner = "|/-\\"[int(elapsed / self._interval) % 4]
            line = f"kernos: {self._label} {spinner} {elapsed:.1f} s"
        else:
            filled = int(self._fraction * _WIDTH)
            bar = "#" * filled + "-" * (_WIDTH - filled)
            line = (f"kernos: {self._label} [{bar}] {self._fraction:4.0%}{self._megabytes()} "
                    f"{elapsed:.1f} s")
        columns = shutil.get_terminal_size((80, 24)).columns
        self._write("\r\x1b[K" + line[:max(columns - 1, 10)])  # a wrapped line never clears
        self._drawn = True

    def _megabytes(self) -> str:
        if self._sizes is None:
            return ""
        done, total = self._sizes
        return f" ({done / 1e6:.0f} of {total / 1e6:.0f} MB)"

    def _tick(self) -> None:
        while not self._stop.wait(self._interval):
            with self._lock:
                self._draw_locked()

    def _write(self, text: str) -> None:
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError):
            self.enabled = False  # stderr went away; progress is never worth a failure
