"""The Pareto chart as a PNG drawn pixel by pixel (ops/png.py; no plotting library): $/M
output tokens across, worst-cell p90 TTFT up; every measured candidate grey, the Pareto set
blue, the chosen one green with a ring. The axes' ranges are in the report beside it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tpuserve.ops.png import raster_png

W, H, M = 480, 320, 24
GREY, BLUE, GREEN, AXIS, WHITE = (150, 150, 150), (30, 90, 200), (20, 160, 60), (0, 0, 0), \
    (255, 255, 255)


def ranges(points: Mapping[str, tuple[float, float]]) -> tuple[float, float, float, float]:
    xs = [p[0] for p in points.values()] or [0.0]
    ys = [p[1] for p in points.values()] or [0.0]
    return min(xs), max(xs), min(ys), max(ys)


def render(points: Mapping[str, tuple[float, float]], pareto: set[str], best: str | None
           ) -> bytes:
    rows = [bytearray(bytes(WHITE) * W) for _ in range(H)]

    def dot(x: int, y: int, rgb: tuple[int, int, int], r: int) -> None:
        for dy in range(-r, r + 1):
            for dx in range(-r, r + 1):
                if dx * dx + dy * dy <= r * r and 0 <= x + dx < W and 0 <= y + dy < H:
                    rows[y + dy][3 * (x + dx):3 * (x + dx) + 3] = bytes(rgb)

    for x in range(M, W - M // 2):
        rows[H - M][3 * x:3 * x + 3] = bytes(AXIS)
    for y in range(M // 2, H - M + 1):
        rows[y][3 * M:3 * M + 3] = bytes(AXIS)
    x0, x1, y0, y1 = ranges(points)

    def at(p: tuple[float, float]) -> tuple[int, int]:
        fx = (p[0] - x0) / (x1 - x0) if x1 > x0 else 0.5
        fy = (p[1] - y0) / (y1 - y0) if y1 > y0 else 0.5
        return M + 8 + int(fx * (W - 2 * M - 16)), H - M - 8 - int(fy * (H - 2 * M - 16))

    for cid, p in sorted(points.items(), key=lambda kv: kv[0] in pareto):
        dot(*at(p), BLUE if cid in pareto else GREY, 3)
    if best in points:
        x, y = at(points[best])
        dot(x, y, GREEN, 7)
        dot(x, y, WHITE, 5)
        dot(x, y, GREEN, 3)
    return raster_png(W, H, rows)


def write(path: Path, points: Mapping[str, tuple[float, float]], pareto: set[str],
          best: str | None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".png.tmp")
    tmp.write_bytes(render(points, pareto, best))
    tmp.replace(path)
    return path
