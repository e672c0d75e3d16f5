"""A PNG made in memory with zlib (no imaging dependency): the smoke test's image."""

from __future__ import annotations

import base64
import struct
import zlib

SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def solid_png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """An 8-bit RGB PNG of one colour."""
    if width < 1 or height < 1:
        raise ValueError(f"PNG size {width}x{height}: both sides must be >= 1")
    row = b"\x00" + bytes(rgb) * width  # filter type 0 (None) per scanline
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit, truecolour
    return (
        SIGNATURE
        + _chunk(b"IHDR", ihdr)
        + _chunk(b"IDAT", zlib.compress(row * height, 9))
        + _chunk(b"IEND", b"")
    )


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()



def raster_png(width: int, height: int, rows: list[bytearray]) -> bytes:
    """An 8-bit RGB PNG from `height` rows of `width` RGB triples (a chart drawn by hand)."""
    if len(rows) != height or any(len(r) != 3 * width for r in rows):
        raise ValueError(f"PNG raster: {height} rows of {3 * width} bytes expected")
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    data = b"".join(b"\x00" + bytes(r) for r in rows)
    return SIGNATURE + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(data, 9)) + \
        _chunk(b"IEND", b"")
