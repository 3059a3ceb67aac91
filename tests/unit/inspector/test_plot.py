"""The SVG line chart: well-formed, escaped, scaled, and clean when there is nothing to draw."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ElementTree

from kernos.inspector.plot import HEIGHT, MAX_DOTS, WIDTH, line_chart, nice_ticks

SVG = "{http://www.w3.org/2000/svg}"
HOSTILE = "<script>alert('x')</script>&\""


def parse(svg: str) -> ElementTree.Element:
    return ElementTree.fromstring(svg)  # raises on anything that is not well-formed


def polyline_points(svg: str) -> list[tuple[float, float]]:
    line = parse(svg).find(f"{SVG}polyline")
    assert line is not None
    return [(float(x), float(y)) for x, y in
            (pair.split(",") for pair in line.attrib["points"].split())]


def test_every_text_is_escaped() -> None:
    svg = line_chart([(1, 5), (2, 7)], title=HOSTILE, x_label=HOSTILE, y_label=HOSTILE,
                     y_format=lambda value: HOSTILE, x_format=lambda value: HOSTILE)
    assert "<script" not in svg
    root = parse(svg)
    texts = [element.text for element in root.iter() if element.text]
    assert HOSTILE in texts  # the title, read back as text, is what was given
    assert root.attrib["aria-label"] == HOSTILE


def test_empty_series_says_so() -> None:
    svg = line_chart([], title="Image size", empty="No committed ops yet")
    root = parse(svg)
    assert root.find(f"{SVG}polyline") is None
    assert "No committed ops yet" in [element.text for element in root.iter()]
    assert parse(line_chart([(1, None), (None, 2), (2, math.nan), (3, math.inf)],
                            title="t")).find(f"{SVG}polyline") is None


def test_points_are_sorted_scaled_and_inside_the_chart() -> None:
    svg = line_chart([(3, 30), (1, 10), (2, None), (4, True), (5, 0)], title="t")
    points = polyline_points(svg)
    assert len(points) == 3  # None and a bool are left out
    xs = [x for x, _ in points]
    assert xs == sorted(xs)
    assert all(0 <= x <= WIDTH and 0 <= y <= HEIGHT for x, y in points)
    by_value = dict(zip((10, 30, 0), (y for _, y in points), strict=True))
    assert by_value[30] < by_value[10] < by_value[0]  # larger values are drawn higher
    assert parse(svg).findall(f"{SVG}circle")


def test_one_point_and_flat_series_draw_without_dividing_by_zero() -> None:
    assert len(polyline_points(line_chart([(7, 100)], title="t"))) == 1
    flat = polyline_points(line_chart([(1, 0), (2, 0), (3, 0)], title="t"))
    assert len({y for _, y in flat}) == 1


def test_many_points_have_no_dots() -> None:
    svg = line_chart([(i, i * i) for i in range(MAX_DOTS + 1)], title="t")
    assert parse(svg).findall(f"{SVG}circle") == []
    assert len(polyline_points(svg)) == MAX_DOTS + 1


def test_nice_ticks_are_round_and_cover_the_range() -> None:
    assert nice_ticks(0, 100) == [0, 20, 40, 60, 80, 100]
    assert nice_ticks(0, 1234) == [0, 500, 1000]
    assert nice_ticks(5, 5) == [5]
    assert nice_ticks(10, 0) == nice_ticks(0, 10)
    assert nice_ticks(0, math.inf) == []
    for high in (0.3, 7, 99, 12_345_678):
        ticks = nice_ticks(0, high)
        step = ticks[1] - ticks[0]
        mantissa = step / 10 ** math.floor(math.log10(step))
        assert round(mantissa, 6) in (1, 2, 5)
        assert ticks[0] <= 0 and ticks[-1] <= high and high - ticks[-1] < step
