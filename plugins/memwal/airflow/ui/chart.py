"""Lag over time as an inline SVG drawn on the server (no script, no CDN: air-gapped deployments)."""

from __future__ import annotations

from datetime import datetime
from html import escape

__all__ = ["lag_chart_svg"]

_COLOURS = ("#d9480f", "#1971c2", "#2f9e44", "#7048e8")


def lag_chart_svg(
    points: list[dict], series: tuple[str, ...], labels: dict[str, str] | None = None,
    width: int = 640, height: int = 180,
) -> str:
    """A line per series over `points` ([{"at": datetime, series: number}], oldest first)."""
    labels = labels or {}
    if not points:
        return (f'<svg class="lag-chart empty" width="{width}" height="40" role="img" aria-label="no lag history">'
                '<text x="8" y="24">no lag history recorded yet</text></svg>')
    left, right, top, bottom = 48, 12, 26, 28
    t0 = points[0]["at"].timestamp()
    t1 = max(points[-1]["at"].timestamp(), t0 + 1.0)
    vmax = max([float(p.get(s) or 0) for p in points for s in series] + [1.0])

    def x(at: datetime) -> float:
        return left + (at.timestamp() - t0) / (t1 - t0) * (width - left - right)

    def y(v: float) -> float:
        return top + (1.0 - v / vmax) * (height - top - bottom)

    out = [f'<svg class="lag-chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
           f'role="img" aria-label="lag over time" data-points="{len(points)}">']
    for frac in (0.0, 0.5, 1.0):
        v = vmax * frac
        out.append(f'<line x1="{left}" x2="{width - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" class="grid"/>'
                   f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
    for at, anchor in ((points[0]["at"], "start"), (points[-1]["at"], "end")):
        out.append(f'<text x="{x(at):.1f}" y="{height - 8}" text-anchor="{anchor}">'
                   f'{escape(at.strftime("%m-%d %H:%M"))}</text>')
    for i, s in enumerate(series):
        colour = _COLOURS[i % len(_COLOURS)]
        coords = " ".join(f"{x(p['at']):.1f},{y(float(p.get(s) or 0)):.1f}" for p in points)
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{coords}" '
                   f'data-series="{escape(s)}"/>')
        if len(points) == 1:
            px, py = coords.split(",")
            out.append(f'<circle cx="{px}" cy="{py}" r="3" fill="{colour}"/>')
        out.append(f'<text x="{left + i * 200}" y="12" fill="{colour}">'
                   f'{escape(labels.get(s, s))}: {float(points[-1].get(s) or 0):g}</text>')
    out.append("</svg>")
    return "".join(out)
