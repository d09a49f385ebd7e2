"""wtc.charts: the SVG a chart is written as (parsed back as XML: lines where the data put them,
ticks at readable values, gaps at missing points, text escaped) and the same chart through
matplotlib; the training chart discover saves."""
from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import wtc
from wtc import charts
from wtc.discovery import Discovery

NS = "{http://www.w3.org/2000/svg}"
TINY = wtc.DTConfig(n_layers=1, n_heads=1, n_mlps=1, mlp_hidden=8, steps=20, hard_steps=5, polish_iters=5, replicas=2,
                    max_attempts=1, batch_size=16, eval_sequences=64, precision_iters=0, workers=1, grow=False)


def _chart(*panels, x=None, title="t"):
    x = np.arange(len(panels[0].left.series[0].y), dtype=float) if x is None else x
    return charts.Chart(title, x, "step", tuple(panels))


def _lines(doc: ET.Element) -> list[np.ndarray]:
    """Each polyline's points, (n, 2) pixels."""
    return [np.array([[float(v) for v in p.split(",")] for p in e.get("points").split()])
            for e in doc.iter(f"{NS}polyline")]


def _frames(doc: ET.Element) -> list[tuple[float, float, float, float]]:
    """(left, top, right, bottom) of each panel's frame (the unfilled black rectangles)."""
    return [(float(r.get("x")), float(r.get("y")), float(r.get("x")) + float(r.get("width")),
             float(r.get("y")) + float(r.get("height")))
            for r in doc.iter(f"{NS}rect") if r.get("stroke") == "black"]


def test_a_line_lands_where_its_values_put_it():
    y = np.array([2.0, 4.0, 3.0, 10.0])
    doc = ET.fromstring(charts.svg(_chart(charts.Panel(charts.Axis("v", (charts.Series(y, "v"),))))))
    (pts,) = _lines(doc)
    (left, top, right, bottom), = _frames(doc)
    assert pts.shape == (4, 2)
    assert left < pts[:, 0].min() and pts[:, 0].max() < right and top < pts[:, 1].min() and pts[:, 1].max() < bottom
    # 5% of the range padded each side: y pixel is affine in the value, higher values higher up
    frac = (bottom - pts[:, 1]) / (bottom - top)
    assert np.allclose(frac, (y - (2 - 0.4)) / (8 * 1.1), atol=2e-3)
    assert np.allclose(np.diff(pts[:, 0]), np.diff(pts[:, 0])[0], atol=0.11)     # evenly spaced steps


def test_a_log_axis_has_decade_ticks_equally_spaced():
    y = np.logspace(-3, 0, 20)
    doc = ET.fromstring(charts.svg(_chart(charts.Panel(charts.Axis("loss", (charts.Series(y, "loss"),), log=True)))))
    labels = {t.text: float(t.get("y")) for t in doc.iter(f"{NS}text") if t.get("text-anchor") == "end"}
    assert set(labels) == {"0.001", "0.01", "0.1", "1"}
    ys = sorted(labels.values())
    assert np.allclose(np.diff(ys), np.diff(ys)[0], atol=0.2)
    (pts,) = _lines(doc)
    assert np.allclose(np.diff(pts[:, 1]), np.diff(pts[:, 1])[0], atol=0.2)      # a geometric series: a line


def test_missing_points_break_a_line_and_a_log_axis_skips_non_positive_values():
    y = np.array([1.0, 2.0, np.nan, 3.0, np.inf, 4.0, 5.0])
    doc = ET.fromstring(charts.svg(_chart(charts.Panel(charts.Axis("v", (charts.Series(y, "v"),))))))
    assert [len(p) for p in _lines(doc)] == [2, 1, 2]
    z = np.array([1.0, 0.0, -1.0, 10.0, 100.0])
    doc = ET.fromstring(charts.svg(_chart(charts.Panel(charts.Axis("v", (charts.Series(z, "v"),), log=True)))))
    assert [len(p) for p in _lines(doc)] == [1, 2]
    empty = np.full(4, np.nan)
    doc = ET.fromstring(charts.svg(_chart(charts.Panel(charts.Axis("v", (charts.Series(empty, "v"),))))))
    assert _lines(doc) == []


def test_a_constant_series_is_drawn_mid_panel():
    doc = ET.fromstring(charts.svg(_chart(charts.Panel(charts.Axis("v", (charts.Series(np.full(5, 7.0), "v"),))))))
    (pts,) = _lines(doc)
    (_, top, _, bottom), = _frames(doc)
    assert np.allclose(pts[:, 1], (top + bottom) / 2, atol=0.11)


def test_a_series_of_another_length_than_x_is_refused(tmp_path):
    chart = _chart(charts.Panel(charts.Axis("v", (charts.Series(np.ones(3), "short"),))), x=np.arange(4.0))
    for path in (tmp_path / "c.svg", tmp_path / "c.png"):
        with pytest.raises(ValueError, match=r"series 'short' has shape \(3,\), the x axis \(4,\)"):
            charts.write(chart, path)


def test_text_is_escaped():
    title = 'a<b & "c">'
    svg = charts.svg(_chart(charts.Panel(charts.Axis("<y>", (charts.Series(np.ones(3), "s&t"),)), legend=True),
                            title=title))
    texts = [t.text for t in ET.fromstring(svg).iter(f"{NS}text")]
    assert title in texts and "<y>" in texts and "s&t" in texts


@settings(max_examples=200, deadline=None)
@given(st.floats(-1e6, 1e6), st.floats(1e-6, 1e6))
def test_linear_ticks_are_few_round_and_inside(lo, relative_span):
    span = relative_span * max(1.0, abs(lo))
    hi = lo + span
    got = charts.ticks(lo, hi, log=False)
    assert 2 <= len(got) <= 11
    values = [v for v, _ in got]
    assert all(lo <= v <= hi for v in values)
    steps = np.diff(values)
    assert np.allclose(steps, steps[0], rtol=1e-3)
    mantissa = steps[0] / 10 ** math.floor(math.log10(steps[0]))
    assert any(abs(mantissa - m) < 1e-3 for m in (1, 2, 2.5, 5, 10))
    assert all(abs(float(text) - v) <= 1e-3 * steps[0] for v, text in got)     # labels tell the ticks apart
    assert len({text for _, text in got}) == len(got)
    assert all(len(text) <= 14 for _, text in got)                             # no float junk


@settings(max_examples=200, deadline=None)
@given(st.floats(-12, 12), st.floats(0.01, 20))
@example(1e-9, 1.0)             # a decade a rounding below the axis's start is outside it
def test_log_ticks_are_inside_and_at_least_two(a, span):
    lo, hi = 10.0 ** a, 10.0 ** (a + span)
    got = charts.ticks(lo, hi, log=True)
    assert len(got) >= 2 or span < 0.05
    assert all(lo <= v <= hi and v > 0 for v, _ in got)


def test_the_training_chart_drawn_and_saved(tmp_path):
    _, history = wtc.train("prev2", TINY, seed=0, progress=False)
    chart = history.chart()
    series = [s for p in chart.panels for a in (p.left, p.right) if a is not None for s in a.series]
    assert [s.label for s in series][:1] == ["loss (MSE, normalised)"] and "tau" in [s.label for s in series]
    svg_path = history.plot(tmp_path / "h.svg")
    doc = ET.parse(svg_path).getroot()
    assert len(_lines(doc)) == len(series) and all(len(p) == len(history) for p in _lines(doc))
    png = history.plot(tmp_path / "h.png")
    assert (tmp_path / "h.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.endswith("h.png")
    # discover's save writes the chart as training.svg and removes an earlier version's training.png
    out = tmp_path / "out"
    out.mkdir()
    (out / "training.png").write_bytes(b"from an earlier version")
    Discovery(wtc.tasks.get("prev2"), None, None, history, None, 0.0).save(out)
    assert not (out / "training.png").exists()
    ET.parse(out / "training.svg")
    assert "![training](training.svg)" in (out / "report.md").read_text()
