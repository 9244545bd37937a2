"""A tiny pure-Python raster canvas and PNG encoder for the sample apps' screenshots.

The ``computer`` tool must return real PNG screenshots of an app's state, and fleetenv must
not grow a Pillow dependency for that. An 800x600 RGB image is 1.4 MB of pixels, so the
canvas keeps one ``bytearray`` per pixel row and draws with slice assignment: a rectangle
is one slice per row, and a line of text is one slice per pixel row (the glyph rows of all
characters are pre-rendered for a given colour pair, cached, and joined). That keeps a full
screenshot well under the 50 ms budget without any native code.
"""

from __future__ import annotations

import struct
import zlib
from functools import lru_cache

Color = tuple[int, int, int]

WHITE: Color = (255, 255, 255)
BLACK: Color = (20, 24, 31)
GREY: Color = (110, 117, 128)
LIGHT: Color = (236, 239, 243)
LINE: Color = (205, 210, 218)
BLUE: Color = (37, 99, 235)
PALE_BLUE: Color = (219, 234, 254)
GREEN: Color = (22, 128, 61)
PALE_GREEN: Color = (220, 252, 231)
RED: Color = (190, 30, 45)
NAVY: Color = (30, 41, 59)

GLYPH_W = 5
GLYPH_H = 8
CELL_W = GLYPH_W + 1
CELL_H = GLYPH_H + 1

# The classic 5x8 "glcdfont" (ASCII 0x20-0x7E), column-major: 5 bytes per glyph, one per
# column, bit 0 = top row. Rows 0-6 hold capitals, row 7 the descenders of g/j/p/q/y.
# fmt: off
_FONT_HEX = (
    "0000000000" "00005f0000" "0007000700" "147f147f14" "242a7f2a12" "2313086462"
    "3649562050" "0008070300" "001c224100" "0041221c00" "2a1c7f1c2a" "08083e0808"
    "0080703000" "0808080808" "0000606000" "2010080402" "3e5149453e" "00427f4000"
    "7249494946" "2141494d33" "1814127f10" "2745454539" "3c4a494931" "4121110907"
    "3649494936" "464949291e" "0000140000" "0040340000" "0008142241" "1414141414"
    "0041221408" "0201590906" "3e415d594e" "7c1211127c" "7f49494936" "3e41414122"
    "7f4141413e" "7f49494941" "7f09090901" "3e41415173" "7f0808087f" "00417f4100"
    "2040413f01" "7f08142241" "7f40404040" "7f021c027f" "7f0408107f" "3e4141413e"
    "7f09090906" "3e4151215e" "7f09192946" "2649494932" "03017f0103" "3f4040403f"
    "1f2040201f" "3f4038403f" "6314081463" "0304780403" "6159494d43" "007f414141"
    "0204081020" "004141417f" "0402010204" "4040404040" "0003070800" "2054547840"
    "7f28444438" "3844444428" "384444287f" "3854545418" "00087e0902" "18a4a49c78"
    "7f08040478" "00447d4000" "2040403d00" "7f10284400" "00417f4000" "7c04780478"
    "7c08040478" "3844444438" "fc18242418" "18242418fc" "7c08040408" "4854545424"
    "04043f4424" "3c4040207c" "1c2040201c" "3c4030403c" "4428102844" "4c9090907c"
    "4464544c44" "0008364100" "0000770000" "0041360800" "0201020402"
)
# fmt: on


def _decode_font() -> dict[str, tuple[tuple[bool, ...], ...]]:
    """Turn the column-major table into ``char -> rows of 5 on/off pixels``."""
    font: dict[str, tuple[tuple[bool, ...], ...]] = {}
    for index in range(95):
        columns = bytes.fromhex(_FONT_HEX[index * 10 : index * 10 + 10])
        rows = tuple(
            tuple(bool(columns[col] >> row & 1) for col in range(GLYPH_W)) for row in range(GLYPH_H)
        )
        font[chr(0x20 + index)] = rows
    return font


_FONT = _decode_font()


@lru_cache(maxsize=4096)
def _glyph_rows(char: str, fg: Color, bg: Color, scale: int) -> tuple[bytes, ...]:
    """One cell of ``char`` (glyph plus 1-pixel spacing), as ``CELL_H*scale`` pixel rows."""
    rows = _FONT.get(char) or _FONT["?"]
    on, off = bytes(fg) * scale, bytes(bg) * scale
    out: list[bytes] = []
    for row in rows:
        line = b"".join(on if pixel else off for pixel in row) + off
        out.extend([line] * scale)
    out.extend([off * CELL_W] * scale)
    return tuple(out)


def fit(text: str, max_chars: int) -> str:
    """Cut ``text`` to ``max_chars`` characters, marking the cut with ``..``."""
    if len(text) <= max_chars:
        return text
    if max_chars <= 2:
        return text[:max_chars]
    return text[: max_chars - 2] + ".."


def wrap(text: str, max_chars: int) -> list[str]:
    """Greedy word wrap; words longer than a line are cut."""
    lines: list[str] = []
    current = ""
    for word in text.split():
        word = word[:max_chars]
        candidate = f"{current} {word}" if current else word
        if len(candidate) <= max_chars:
            current = candidate
        else:
            lines.append(current)
            current = word
    if current:
        lines.append(current)
    return lines


class Canvas:
    """An RGB raster with clipped rectangles and bitmap text."""

    def __init__(self, width: int, height: int, background: Color = WHITE) -> None:
        if width <= 0 or height <= 0:
            raise ValueError(f"canvas size must be positive, got {width}x{height}")
        self.width = width
        self.height = height
        blank = bytes(background) * width
        self._rows = [bytearray(blank) for _ in range(height)]

    def fill(self, x: int, y: int, w: int, h: int, color: Color) -> None:
        """Fill a rectangle (clipped to the canvas)."""
        x0, y0 = max(x, 0), max(y, 0)
        x1, y1 = min(x + w, self.width), min(y + h, self.height)
        if x0 >= x1 or y0 >= y1:
            return
        span = bytes(color) * (x1 - x0)
        for row in self._rows[y0:y1]:
            row[x0 * 3 : x1 * 3] = span

    def frame(self, x: int, y: int, w: int, h: int, color: Color, thickness: int = 1) -> None:
        """Draw a rectangle outline."""
        self.fill(x, y, w, thickness, color)
        self.fill(x, y + h - thickness, w, thickness, color)
        self.fill(x, y, thickness, h, color)
        self.fill(x + w - thickness, y, thickness, h, color)

    def text(
        self,
        x: int,
        y: int,
        text: str,
        color: Color = BLACK,
        background: Color = WHITE,
        scale: int = 2,
    ) -> int:
        """Draw one line of text on a known background colour; return its width in pixels.

        Characters outside printable ASCII render as ``?``. Text running past the right
        edge is clipped at a whole character.
        """
        if y >= self.height or x >= self.width:
            return 0
        cell = CELL_W * scale
        room = max((self.width - max(x, 0)) // cell, 0)
        visible = text[:room]
        if not visible:
            return 0
        glyphs = [_glyph_rows(ch, color, background, scale) for ch in visible]
        x0 = max(x, 0) * 3
        for dy in range(CELL_H * scale):
            py = y + dy
            if 0 <= py < self.height:
                line = b"".join(g[dy] for g in glyphs)
                self._rows[py][x0 : x0 + len(line)] = line
        return len(visible) * cell

    def pixel(self, x: int, y: int) -> Color:
        """The colour at ``(x, y)``; for tests and assertions."""
        row = self._rows[y]
        return (row[x * 3], row[x * 3 + 1], row[x * 3 + 2])

    def to_png(self, level: int = 6) -> bytes:
        """Encode as an 8-bit RGB PNG (filter type 0 on every row)."""
        raw = b"".join(b"\x00" + bytes(row) for row in self._rows)
        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n"
            + _chunk(b"IHDR", header)
            + _chunk(b"IDAT", zlib.compress(raw, level))
            + _chunk(b"IEND", b"")
        )


def _chunk(tag: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(tag + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", crc)


def png_size(png: bytes) -> tuple[int, int]:
    """``(width, height)`` from a PNG's IHDR; raises ``ValueError`` if it is not a PNG."""
    if png[:8] != b"\x89PNG\r\n\x1a\n" or png[12:16] != b"IHDR":
        raise ValueError("not a PNG image (bad signature or missing IHDR)")
    width, height = struct.unpack(">II", png[16:24])
    return width, height
