"""Timestamps as the history records them: UTC, ISO 8601, milliseconds."""

from __future__ import annotations

import time


def utc_now() -> str:
    stamp = time.time()
    whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(stamp))
    return f"{whole}.{int(stamp % 1 * 1000):03d}Z"
