"""Formatting: per-cell tables, sample statistics and the final target table."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from driver import TIMING_KEYS, CellResult

__all__ = ["Row", "cell_table", "fmt_bytes", "fmt_ms", "fmt_samples", "median", "summary_table"]


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def fmt_ms(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 10_000:
        return f"{value / 1000:.1f} s"
    if value >= 100:
        return f"{value:.0f} ms"
    return f"{value:.1f} ms"


def fmt_bytes(value: float | None) -> str:
    if value is None:
        return "-"
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= size:
            return f"{sign}{value / size:.1f} {unit}"
    return f"{sign}{value:.0f} B"


def fmt_samples(values: Sequence[float], unit: str = "ms") -> str:
    """``median (min-max, n=N)`` for a list of samples in ms or s."""
    show = fmt_ms if unit == "ms" else (lambda v: f"{v:.2f} s")
    if len(values) == 1:
        return show(values[0])
    return (f"{show(median(values))} (min {show(min(values))}, max {show(max(values))}, "
            f"n={len(values)})")


def cell_table(results: Sequence[CellResult]) -> str:
    """One line per cell: kernel-reported timings, client round trip and bytes."""
    header = ["cell", "status", *TIMING_KEYS, "commit", "total", "round trip", "written",
              "history +"]
    rows = [header]
    for result in results:
        timings = result.timings
        rows.append([
            result.label,
            result.op_status,
            *(fmt_ms(timings.get(key)) for key in TIMING_KEYS),
            fmt_ms(result.commit_ms),
            fmt_ms(result.total_ms),
            fmt_ms(result.round_trip_ms),
            fmt_bytes(result.bytes_written),
            fmt_bytes(result.history_added),
        ])
    return _grid(rows, left=2)


@dataclass(frozen=True)
class Row:
    """One line of the final table: a measured median against a baseline and a target."""

    what: str
    measured: str
    baseline: str
    ratio: float | None
    """measured / baseline, when both are numbers of the same kind."""
    target: str
    passed: bool | None
    """None when there is no target (shown as INFO)."""

    @property
    def verdict(self) -> str:
        if self.passed is None:
            return "INFO"
        return "PASS" if self.passed else "MISS"


def summary_table(rows: Sequence[Row]) -> str:
    header = ["what", "measured (median)", "baseline (this run)", "ratio", "target", "result"]
    lines = [header]
    for row in rows:
        ratio = "-" if row.ratio is None else (f"{row.ratio:.3g}x" if row.ratio >= 0.001
                                               else f"{row.ratio:.1e}x")
        lines.append([row.what, row.measured, row.baseline, ratio, row.target, row.verdict])
    return _grid(lines, left=1)


def _grid(rows: list[list[str]], *, left: int) -> str:
    """Columns padded to their widest cell; the first ``left`` columns align left."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = []
    for number, row in enumerate(rows):
        cells = [cell.ljust(width) if index < left else cell.rjust(width)
                 for index, (cell, width) in enumerate(zip(row, widths, strict=True))]
        out.append("  ".join(cells).rstrip())
        if number == 0:
            out.append("  ".join("-" * width for width in widths))
    return "\n".join(out)
