"""Drawing helpers for the sample apps' screens: header, buttons, fields, tabs, tables.

Each helper draws on a :class:`Canvas` and returns the :class:`Hotspot` a click on it
should hit (``None`` for a disabled control), so a screen's ``render`` is a straight list of
draw calls that also builds its click map. All text is drawn at scale 2 (12x18 px cells) so
a vision model can read it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleetenv.local.apps.screen import (
    BLACK,
    BLUE,
    CELL_H,
    CELL_W,
    GREY,
    LIGHT,
    LINE,
    NAVY,
    PALE_BLUE,
    WHITE,
    Canvas,
    Color,
    fit,
)

SCREEN_WIDTH = 800
SCREEN_HEIGHT = 600
SCALE = 2
CHAR_W = CELL_W * SCALE
CHAR_H = CELL_H * SCALE
HEADER_H = 40
CONTROL_H = 30
"""Height of buttons and text fields."""
_CONTROL_TEXT_DY = (CONTROL_H - CHAR_H) // 2 + 1


@dataclass(frozen=True)
class Hotspot:
    """A clickable region of the current screen and what it means to the app."""

    x: int
    y: int
    w: int
    h: int
    target: str
    """What was clicked, e.g. ``"row"``, ``"button:resolve"``, ``"field:search"``."""
    value: int | str | None = None

    def contains(self, x: int, y: int) -> bool:
        return self.x <= x < self.x + self.w and self.y <= y < self.y + self.h

    @property
    def center(self) -> tuple[int, int]:
        return self.x + self.w // 2, self.y + self.h // 2


def header(canvas: Canvas, title: str, right: str = "") -> None:
    """The dark title bar across the top of every screen."""
    canvas.fill(0, 0, SCREEN_WIDTH, HEADER_H, NAVY)
    canvas.text(16, 11, title, WHITE, NAVY, SCALE)
    if right:
        canvas.text(SCREEN_WIDTH - 16 - len(right) * CELL_W, 16, right, WHITE, NAVY, 1)


def label(
    canvas: Canvas, x: int, y: int, text: str, color: Color = BLACK, background: Color = WHITE,
    max_chars: int | None = None,
) -> None:  # fmt: skip
    """Text at scale 2, optionally cut to ``max_chars``."""
    canvas.text(x, y, fit(text, max_chars) if max_chars else text, color, background, SCALE)


def button(
    canvas: Canvas, x: int, y: int, w: int, text: str, target: str,
    value: int | str | None = None, *, enabled: bool = True, color: Color = BLUE,
) -> Hotspot | None:
    """A filled button with centred text; disabled buttons are grey and not clickable."""
    fill = color if enabled else LINE
    ink = WHITE if enabled else GREY
    canvas.fill(x, y, w, CONTROL_H, fill)
    text_x = x + max((w - len(text) * CHAR_W) // 2, 4)
    canvas.text(text_x, y + _CONTROL_TEXT_DY, text, ink, fill, SCALE)
    return Hotspot(x, y, w, CONTROL_H, target, value) if enabled else None


def text_field(
    canvas: Canvas, x: int, y: int, w: int, value: str, target: str, *, focused: bool,
    placeholder: str = "",
) -> Hotspot:
    """A one-line input; the focused one has a blue border and a caret."""
    canvas.fill(x, y, w, CONTROL_H, WHITE)
    canvas.frame(x, y, w, CONTROL_H, BLUE if focused else LINE, 2 if focused else 1)
    room = (w - 16) // CHAR_W
    shown = value + ("_" if focused else "")
    if shown:
        canvas.text(x + 8, y + _CONTROL_TEXT_DY, shown[-room:], BLACK, WHITE, SCALE)
    elif placeholder:
        canvas.text(x + 8, y + _CONTROL_TEXT_DY, fit(placeholder, room), GREY, WHITE, SCALE)
    return Hotspot(x, y, w, CONTROL_H, target)


def tabs(
    canvas: Canvas, x: int, y: int, w: int, names: Sequence[str], selected: str, target: str
) -> list[Hotspot]:
    """A row of equal-width tabs; the selected one is highlighted."""
    spots = []
    for index, name in enumerate(names):
        left = x + index * (w + 8)
        chosen = name == selected
        fill = PALE_BLUE if chosen else LIGHT
        canvas.fill(left, y, w, 26, fill)
        if chosen:
            canvas.fill(left, y + 24, w, 2, BLUE)
        text_x = left + (w - len(name) * CHAR_W) // 2
        canvas.text(text_x, y + 5, name, BLUE if chosen else BLACK, fill, SCALE)
        spots.append(Hotspot(left, y, w, 26, target, name))
    return spots


def table(
    canvas: Canvas, y: int, columns: Sequence[tuple[str, int, int]],
    cells: Sequence[Sequence[str]], row_ids: Sequence[int], target: str,
) -> list[Hotspot]:
    """A full-width header row plus zebra-striped body rows; each body row is one hotspot.

    ``columns`` are ``(title, x offset, max chars)``.
    """
    x, width, row_h = 16, SCREEN_WIDTH - 32, 26
    canvas.fill(x, y, width, row_h, NAVY)
    for title, offset, _ in columns:
        canvas.text(x + offset, y + 4, title, WHITE, NAVY, SCALE)
    spots = []
    for index, (values, row_id) in enumerate(zip(cells, row_ids, strict=True)):
        top = y + row_h * (index + 1)
        fill = WHITE if index % 2 == 0 else LIGHT
        canvas.fill(x, top, width, row_h, fill)
        for (_, offset, max_chars), value in zip(columns, values, strict=True):
            canvas.text(x + offset, top + 4, fit(value, max_chars), BLACK, fill, SCALE)
        spots.append(Hotspot(x, top, width, row_h, target, row_id))
    canvas.fill(x, y + row_h * (len(cells) + 1), width, 1, LINE)
    return spots

