"""Line charts described once and drawn two ways: as SVG text written here (numpy only: no plotting
library to import, ~0.01 s a chart) or through matplotlib for raster and other formats.

A Chart is panels stacked over one shared x axis; each panel has a left y axis and, optionally, a
right one (a twin), each linear or logarithmic, each holding line series. Non-finite points (and
points at or below zero on a log axis) are gaps in a line, not zeros.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

import numpy as np

# matplotlib's default cycle, so an SVG and a PNG of one chart look alike
BLUE, ORANGE, GREEN, RED, GRAY = "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#7f7f7f"


@dataclass(frozen=True)
class Series:
    """One line: a value per x (NaN/inf: a gap), its legend label and look."""

    y: np.ndarray                 # (n,) one value per x
    label: str
    color: str = BLUE
    dashed: bool = False
    opacity: float = 1.0


@dataclass(frozen=True)
class Axis:
    """A y axis, linear or logarithmic, and the series drawn against it."""

    label: str
    series: tuple[Series, ...]
    log: bool = False


@dataclass(frozen=True)
class Panel:
    """One plot of the stack: a left axis and optionally a right one over the shared x."""

    left: Axis
    right: Axis | None = None
    legend: bool = False          # a legend of the panel's series, both axes'


@dataclass(frozen=True)
class Chart:
    """Panels stacked over one shared x axis, with a title; the unit `write` draws."""

    title: str
    x: np.ndarray                 # (n,) shared by every series
    xlabel: str
    panels: tuple[Panel, ...]
    width: int = 880              # pixels (the PNG: 8 x 6 inches at 110 dpi)
    height: int = 660


def write(chart: Chart, path) -> str:
    """Draw `chart` to `path`: SVG written here for a .svg path, matplotlib for any other suffix."""
    path = Path(path)
    if path.suffix.lower() == ".svg":
        path.write_text(svg(chart))
    else:
        _matplotlib(chart, path)
    return str(path)


# ---------------------------------------------------------------- scales and ticks


def _usable(y: np.ndarray, log: bool) -> np.ndarray:
    """Which points can be drawn: finite, and positive on a log axis."""
    ok = np.isfinite(y)
    return ok & (y > 0) if log else ok


def limits(values: list[np.ndarray], log: bool) -> tuple[float, float]:
    """The axis range (in data units) covering the drawable values with a 5% margin each side;
    a single value gets a range around it, no value a unit range."""
    arrays = [np.asarray(v, np.float64) for v in values]
    pts = np.concatenate([a[_usable(a, log)] for a in arrays]) if arrays else np.zeros(0)
    if log:
        pts = np.log10(pts)
    if pts.size == 0:
        lo, hi = (0.0, 1.0)
    else:
        lo, hi = float(pts.min()), float(pts.max())
        if hi - lo < 1e-12 * max(1.0, abs(lo)):
            pad = 0.5 if log else max(0.5, abs(lo) * 0.1)
            lo, hi = lo - pad, hi + pad
        span = hi - lo
        lo, hi = lo - 0.05 * span, hi + 0.05 * span
    return (10.0 ** lo, 10.0 ** hi) if log else (lo, hi)


def ticks(lo: float, hi: float, log: bool) -> list[tuple[float, str]]:
    """(value, label) of the ticks inside [lo, hi]: 1-2-2.5-5 steps on a linear axis (about five
    ticks); decades on a log axis, 1x, 2x and 5x of them when fewer than two decades show, and
    linear steps when the axis spans less than that."""
    if log:
        a, b = math.log10(lo), math.log10(hi)
        decades = [v for v in (10.0 ** k for k in range(math.floor(a), math.ceil(b) + 1)) if lo <= v <= hi]
        if len(decades) >= 2:
            step = max(1, math.ceil(len(decades) / 7))     # at most ~7 labels on a long log axis
            return [(v, _label(v)) for v in decades[::step]]
        values = [m * 10.0 ** k for k in range(math.floor(a), math.ceil(b) + 1) for m in (1, 2, 5)]
        inside = [(v, _label(v)) for v in values if lo <= v <= hi]
        if len(inside) >= 2:
            return inside
        return [(v, text) for v, text in ticks(lo, hi, log=False) if v > 0]   # under a factor of 5
    raw = (hi - lo) / 5
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.floor(lo / step)
    out = []
    for k in range(first, first + 14):
        v = k * step
        if v < lo:
            continue
        if v > hi:
            break
        # as many significant digits as tell ticks `step` apart (one more for a 2.5 step)
        digits = math.floor(math.log10(max(abs(v), step))) - math.floor(math.log10(step) + 1e-9) + 1
        out.append((v, _label(v, digits + (1 if round(step / power, 6) == 2.5 else 0))))
    return out


def _label(v: float, digits: int = 6) -> str:
    text = f"{v:.{max(1, digits)}g}"
    return "0" if text in ("-0", "0") else text


# ---------------------------------------------------------------- SVG


_LEFT, _RIGHT, _TOP, _BOTTOM, _GAP = 78, 78, 40, 52, 10
_CHAR = 6.6        # average width of a 12 px sans-serif character, for the legend box


def svg(chart: Chart) -> str:
    """The chart as an SVG document (text)."""
    W, H = chart.width, chart.height
    x = np.asarray(chart.x, np.float64)
    _check(chart, len(x))
    x0, x1 = _LEFT, W - _RIGHT
    xlo, xhi = limits([x], log=False)
    n = len(chart.panels)
    panel_h = (H - _TOP - _BOTTOM - _GAP * (n - 1)) / max(n, 1)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
           'font-family="DejaVu Sans, Arial, sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{(x0 + x1) / 2:.1f}" y="{_TOP - 14}" text-anchor="middle" font-size="14">{escape(chart.title)}</text>']

    def px(v):
        return x0 + (v - xlo) / (xhi - xlo) * (x1 - x0)

    for i, panel in enumerate(chart.panels):
        top = _TOP + i * (panel_h + _GAP)
        bottom = top + panel_h
        last = i == n - 1
        for xv, text in ticks(xlo, xhi, log=False):
            out.append(f'<line x1="{px(xv):.1f}" y1="{bottom:.1f}" x2="{px(xv):.1f}" y2="{bottom + 4:.1f}" stroke="black"/>')
            if last:
                out.append(f'<text x="{px(xv):.1f}" y="{bottom + 18:.1f}" text-anchor="middle">{escape(text)}</text>')
        entries = []
        for axis, side in ((panel.left, "left"), (panel.right, "right")):
            if axis is None:
                continue
            out += _axis(axis, side, x, px, top, bottom, x0, x1)
            entries += list(axis.series)
        out.append(f'<rect x="{x0}" y="{top:.1f}" width="{x1 - x0}" height="{panel_h:.1f}" fill="none" stroke="black"/>')
        if panel.legend and entries:
            out += _legend(entries, x1, top)
    out.append(f'<text x="{(x0 + x1) / 2:.1f}" y="{H - 12}" text-anchor="middle">{escape(chart.xlabel)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _check(chart: Chart, n: int) -> None:
    for panel in chart.panels:
        for axis in (panel.left, panel.right):
            for s in axis.series if axis is not None else ():
                if np.shape(s.y) != (n,):
                    raise ValueError(f"chart {chart.title!r}: series {s.label!r} has shape {np.shape(s.y)}, "
                                     f"the x axis ({n},)")


def _axis(axis: Axis, side: str, x: np.ndarray, px, top: float, bottom: float, x0: float, x1: float) -> list[str]:
    lo, hi = limits([s.y for s in axis.series], axis.log)
    f = math.log10 if axis.log else (lambda v: v)
    flo, fhi = f(lo), f(hi)

    def py(v):
        return bottom - (f(v) - flo) / (fhi - flo) * (bottom - top)

    edge, sign, anchor = (x0, -1, "end") if side == "left" else (x1, 1, "start")
    out = []
    for v, text in ticks(lo, hi, axis.log):
        y = py(v)
        out.append(f'<line x1="{edge:.1f}" y1="{y:.1f}" x2="{edge + 4 * sign:.1f}" y2="{y:.1f}" stroke="black"/>')
        out.append(f'<text x="{edge + 7 * sign:.1f}" y="{y + 4:.1f}" text-anchor="{anchor}">{escape(text)}</text>')
    mid = (top + bottom) / 2
    lx = edge + 52 * sign
    out.append(f'<text x="{lx:.1f}" y="{mid:.1f}" text-anchor="middle" transform="rotate(-90 {lx:.1f} {mid:.1f})">'
               f'{escape(axis.label)}</text>')
    for s in axis.series:
        y = np.asarray(s.y, np.float64)
        style = f'fill="none" stroke="{s.color}" stroke-width="1.5"'
        style += ' stroke-dasharray="6 3"' if s.dashed else ""
        style += f' stroke-opacity="{s.opacity:g}"' if s.opacity < 1 else ""
        for run in _runs(_usable(y, axis.log) & np.isfinite(x)):
            pts = " ".join(f"{px(a):.1f},{py(b):.1f}" for a, b in zip(x[run], y[run]))
            out.append(f'<polyline {style} points="{pts}"/>')
    return out


def _runs(ok: np.ndarray) -> list[slice]:
    """The maximal runs of True in `ok`, as slices (a gap breaks a line)."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], ok.astype(np.int8), [0]])))
    return [slice(a, b) for a, b in zip(edges[::2], edges[1::2])]


def _legend(entries: list[Series], x1: float, top: float) -> list[str]:
    width = 40 + _CHAR * max(len(s.label) for s in entries)
    left, y = x1 - width - 8, top + 8
    out = [f'<rect x="{left:.1f}" y="{y:.1f}" width="{width:.1f}" height="{18 * len(entries) + 6}" fill="white" '
           'fill-opacity="0.8" stroke="#cccccc"/>']
    for k, s in enumerate(entries):
        cy = y + 14 + 18 * k
        dash = ' stroke-dasharray="6 3"' if s.dashed else ""
        out.append(f'<line x1="{left + 6:.1f}" y1="{cy - 4:.1f}" x2="{left + 30:.1f}" y2="{cy - 4:.1f}" '
                   f'stroke="{s.color}" stroke-width="1.5"{dash}/>')
        out.append(f'<text x="{left + 36:.1f}" y="{cy:.1f}">{escape(s.label)}</text>')
    return out


# ---------------------------------------------------------------- matplotlib


def _matplotlib(chart: Chart, path: Path) -> None:
    # a Figure without pyplot: no global figure state, and a third of a second less to import;
    # fixed margins instead of a layout engine's extra pass (tight_layout 1.2 s, fixed 0.3 s a plot)
    from matplotlib.figure import Figure

    _check(chart, len(chart.x))
    fig = Figure(figsize=(chart.width / 110, chart.height / 110))
    fig.subplots_adjust(left=0.09, right=0.9, top=0.94, bottom=0.08, hspace=0.06)
    axes = fig.subplots(len(chart.panels), 1, sharex=True, squeeze=False)[:, 0]
    x = np.asarray(chart.x)
    for ax, panel in zip(axes, chart.panels):
        lines = []
        for axis, target in ((panel.left, ax), (panel.right, None)):
            if axis is None:
                continue
            target = target if target is not None else ax.twinx()
            for s in axis.series:
                y = np.asarray(s.y, np.float64)
                y = np.where(_usable(y, axis.log), y, np.nan)
                lines += target.plot(x, y, color=s.color, alpha=s.opacity, linestyle="--" if s.dashed else "-",
                                     label=s.label)
            if axis.log:
                target.set_yscale("log")
            target.set_ylabel(axis.label)
        if panel.legend and lines:
            ax.legend(lines, [ln.get_label() for ln in lines], loc="upper right")
    axes[0].set_title(chart.title)
    axes[-1].set_xlabel(chart.xlabel)
    fig.savefig(path, dpi=110)
