"""The Pareto chart: a real PNG (decoded here: its chunks, size and pixels), with a title and
both axes labelled with what they plot."""

from __future__ import annotations

import struct
import zlib

from tests.cli_support import is_png
from tpuserve.tune import chart

POINTS = {"a": (0.10, 340.0), "b": (0.12, 300.0), "c": (0.13, 420.0)}


def _decode(png: bytes) -> tuple[int, int, int, bytes]:
    """(width, height, bytes per pixel, the raw scanlines) of a non-interlaced 8-bit PNG."""
    pos, idat, head = 8, b"", b""
    while pos < len(png):
        (length,) = struct.unpack(">I", png[pos:pos + 4])
        kind, body = png[pos + 4:pos + 8], png[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            head = body
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", head[:10])
    assert depth == 8 and colour in (2, 6)
    return width, height, 3 if colour == 2 else 4, zlib.decompress(idat)


def test_the_chart_is_a_png_with_a_title_and_labelled_axes() -> None:
    png = chart.render(POINTS, {"a", "b"}, "a")
    assert is_png(png)
    width, height, bpp, raw = _decode(png)
    assert (width, height) == (640, 420)
    assert len(raw) == height * (1 + width * bpp)  # every scanline: a filter byte + pixels
    assert len(set(raw)) > 16  # drawn, not one colour
    fig = chart.figure(POINTS, {"a", "b"}, "a")
    (ax,) = fig.axes
    assert ax.get_title() == chart.TITLE and "Pareto" in ax.get_title()
    assert ax.get_xlabel().startswith("$ per million output tokens")
    assert ax.get_ylabel() == "worst-cell TTFT p90 (ms)"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["measured", "Pareto set", "chosen: a"]


def test_no_feasible_point_still_draws_a_labelled_png() -> None:
    assert is_png(chart.render({}, set(), None))
    (ax,) = chart.figure({}, set(), None).axes
    assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title()
