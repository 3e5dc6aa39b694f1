"""Small charts for the status page, drawn on the server as inline SVG.

Inline SVG needs no JavaScript library and no network (the page must work on a machine
with no internet), and it obeys the page's Content-Security-Policy: colours are SVG
presentation attributes, not `style`, which the policy forbids inline. Only numbers
and fixed words go into the markup; the caption is escaped all the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from markupsafe import Markup

WIDTH, HEIGHT = 480, 120
PAD_LEFT, PAD_BOTTOM, PAD_TOP = 44, 18, 8
BAR = "#3b82c4"
LINE = "#c46a3b"
AXIS = "#888888"
DOTS_UP_TO = 40


def _frame(label: str, body: list[str], top: str, bottom_left: str, bottom_right: str) -> Markup:
    plot_bottom = HEIGHT - PAD_BOTTOM
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{escape(label)}">',
        f"<title>{escape(label)}</title>",
        f'<line x1="{PAD_LEFT}" y1="{PAD_TOP}" x2="{PAD_LEFT}" y2="{plot_bottom}" '
        f'stroke="{AXIS}" stroke-width="1"/>',
        f'<line x1="{PAD_LEFT}" y1="{plot_bottom}" x2="{WIDTH}" y2="{plot_bottom}" '
        f'stroke="{AXIS}" stroke-width="1"/>',
        f'<text x="{PAD_LEFT - 4}" y="{PAD_TOP + 9}" text-anchor="end" font-size="10" '
        f'fill="{AXIS}">{escape(top)}</text>',
        f'<text x="{PAD_LEFT - 4}" y="{plot_bottom}" text-anchor="end" font-size="10" '
        f'fill="{AXIS}">0</text>',
        f'<text x="{PAD_LEFT}" y="{HEIGHT - 4}" font-size="10" fill="{AXIS}">'
        f"{escape(bottom_left)}</text>",
        f'<text x="{WIDTH}" y="{HEIGHT - 4}" text-anchor="end" font-size="10" fill="{AXIS}">'
        f"{escape(bottom_right)}</text>",
        *body,
        "</svg>",
    ]
    # Safe to mark: built above from numbers, fixed words and escaped text.
    return Markup("".join(parts))


def _nice_max(values: Sequence[float]) -> float:
    top = max(values, default=0.0)
    return top if top > 0 else 1.0


def _num(x: float) -> str:
    return f"{x:.0f}" if x >= 10 or float(x).is_integer() else f"{x:.1f}"


def pages_per_hour(counts: Sequence[int]) -> Markup:
    """Bars: pages finished in each hour, oldest left; the last bar is the current hour."""
    n = max(len(counts), 1)
    top = _nice_max([float(c) for c in counts])
    plot_w = WIDTH - PAD_LEFT - 2
    plot_h = HEIGHT - PAD_BOTTOM - PAD_TOP
    slot = plot_w / n
    body: list[str] = []
    for i, c in enumerate(counts):
        h = plot_h * c / top
        x = PAD_LEFT + 1 + i * slot
        ago = n - 1 - i
        when = "this hour" if ago == 0 else f"{ago} h ago"
        body.append(
            f'<rect class="bar" x="{x + 1:.1f}" y="{HEIGHT - PAD_BOTTOM - h:.1f}" '
            f'width="{max(slot - 2, 1):.1f}" height="{h:.1f}" fill="{BAR}">'
            f"<title>{c} pages, {escape(when)}</title></rect>"
        )
    return _frame(
        f"Pages per hour over the last {n} hours (most recent: {counts[-1] if counts else 0})",
        body,
        _num(top),
        f"{n} h ago",
        "now",
    )


def seconds_per_page(seconds: Sequence[float]) -> Markup:
    """A line: seconds each of the last pages took, oldest left."""
    n = len(seconds)
    top = _nice_max(seconds)
    plot_w = WIDTH - PAD_LEFT - 2
    plot_h = HEIGHT - PAD_BOTTOM - PAD_TOP
    body: list[str] = []
    if n:
        step = plot_w / max(n - 1, 1)
        points = " ".join(
            f"{PAD_LEFT + 1 + i * step:.1f},{HEIGHT - PAD_BOTTOM - plot_h * s / top:.1f}"
            for i, s in enumerate(seconds)
        )
        body.append(
            f'<polyline class="line" points="{points}" fill="none" stroke="{LINE}" '
            'stroke-width="1.5"/>'
        )
        if n <= DOTS_UP_TO:  # a few points: a line alone would hide them (or be invisible)
            for xy in points.split():
                x, y = xy.split(",")
                body.append(f'<circle cx="{x}" cy="{y}" r="2.5" fill="{LINE}"/>')
    plural = "page" if n == 1 else "pages"
    return _frame(
        f"Seconds per page over the last {n} {plural}",
        body,
        _num(top) + " s",
        f"{n} {plural} ago" if n else "no pages yet",
        "latest",
    )
