#!/usr/bin/env python3
"""Draws BENCHMARKS.md's plots from `trireme bench --json` reports, as SVG, with Python's
standard library only.

    python3 docs/bench-plots.py latency OUT.svg [LABEL]=REPORT.json [[LABEL]=REPORT.json ...]
    python3 docs/bench-plots.py depth OUT.svg REPORT.json

`latency`: for every phase of every report, its send latency at p50, p90, p99, p99.9 and the
maximum (the percentiles the report carries), on a logarithmic axis; one line per phase and
report. `depth`: the steady phase's queue depth (ready + in flight + delayed), second by second.
"""

import json
import math
import sys

WIDTH, HEIGHT = 720, 420
LEFT, RIGHT, TOP, BOTTOM = 70, 190, 40, 50
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#7f7f7f"]
PERCENTILES = [("p50", "p50"), ("p90", "p90"), ("p99", "p99"), ("p99_9", "p99.9"), ("max", "max")]


def escape(text):
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class Svg:
    def __init__(self, title):
        self.parts = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
            f'font-family="sans-serif" font-size="12">',
            f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
            f'<text x="{WIDTH / 2}" y="22" text-anchor="middle" font-size="14">{escape(title)}</text>',
        ]

    def line(self, x1, y1, x2, y2, colour="#000", width=1, dash=None):
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        self.parts.append(
            f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
            f'stroke="{colour}" stroke-width="{width}"{extra}/>'
        )

    def polyline(self, points, colour, width=2):
        joined = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        self.parts.append(
            f'<polyline points="{joined}" fill="none" stroke="{colour}" stroke-width="{width}"/>'
        )
        for x, y in points:
            self.parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{colour}"/>')

    def text(self, x, y, text, anchor="start", colour="#000", rotate=None):
        turn = f' transform="rotate({rotate} {x} {y})"' if rotate else ""
        self.parts.append(
            f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" fill="{colour}"{turn}>'
            f"{escape(text)}</text>"
        )

    def legend(self, entries):
        x = WIDTH - RIGHT + 15
        for index, (label, colour) in enumerate(entries):
            y = TOP + 10 + index * 18
            self.line(x, y - 4, x + 18, y - 4, colour, 3)
            self.text(x + 24, y, label)

    def write(self, path):
        self.parts.append("</svg>")
        with open(path, "w", encoding="utf-8") as out:
            out.write("\n".join(self.parts) + "\n")


def axes(svg, x_label, y_label):
    svg.line(LEFT, HEIGHT - BOTTOM, WIDTH - RIGHT, HEIGHT - BOTTOM)
    svg.line(LEFT, TOP, LEFT, HEIGHT - BOTTOM)
    svg.text((LEFT + WIDTH - RIGHT) / 2, HEIGHT - 12, x_label, "middle")
    svg.text(18, (TOP + HEIGHT - BOTTOM) / 2, y_label, "middle", rotate=-90)


def latency(out, reports):
    series = []
    for label, path in reports:
        with open(path, encoding="utf-8") as f:
            report = json.load(f)
        for phase in report["phases"]:
            send = phase["latency_ms"].get("send")
            if not send or not send.get("count"):
                continue
            name = f"{label} {phase['phase']}, {phase['tasks']} in flight".strip()
            series.append((name, [send[key] for key, _ in PERCENTILES]))
    if not series:
        sys.exit("no phase with send latencies in the reports")
    values = [v for _, vs in series for v in vs if v > 0]
    low = 10 ** math.floor(math.log10(min(values)))
    high = 10 ** math.ceil(math.log10(max(values)))
    svg = Svg("Send latency by percentile (trireme bench, ms, log scale)")
    axes(svg, "percentile", "latency, ms")
    span_x = WIDTH - RIGHT - LEFT - 40
    xs = [LEFT + 20 + i * span_x / (len(PERCENTILES) - 1) for i in range(len(PERCENTILES))]

    def y_of(value):
        fraction = (math.log10(max(value, low)) - math.log10(low)) / (
            math.log10(high) - math.log10(low)
        )
        return HEIGHT - BOTTOM - fraction * (HEIGHT - BOTTOM - TOP)

    decade = low
    while decade <= high:
        y = y_of(decade)
        svg.line(LEFT, y, WIDTH - RIGHT, y, "#ddd", 1, "3,3")
        svg.text(LEFT - 6, y + 4, f"{decade:g}", "end")
        decade *= 10
    for x, (_, name) in zip(xs, PERCENTILES):
        svg.text(x, HEIGHT - BOTTOM + 16, name, "middle")
    legend = []
    for index, (name, vs) in enumerate(series):
        colour = COLOURS[index % len(COLOURS)]
        svg.polyline([(x, y_of(v)) for x, v in zip(xs, vs)], colour)
        legend.append((name, colour))
    svg.legend(legend)
    svg.write(out)


def depth(out, path):
    with open(path, encoding="utf-8") as f:
        report = json.load(f)
    steady = next((p for p in report["phases"] if p.get("steady")), None)
    if steady is None:
        sys.exit("the report has no steady phase")
    samples = steady["steady"]["depth"]
    if not samples:
        sys.exit("the steady phase has no depth samples")
    times = [s["t_s"] for s in samples]
    depths = [
        (s.get("ready") or 0) + (s.get("in_flight") or 0) + (s.get("delayed") or 0) for s in samples
    ]
    top = max(max(depths), 1)
    scale = 10 ** math.floor(math.log10(top))
    top = math.ceil(top / scale) * scale
    end = max(times) or 1
    title = (
        f"Queue depth in the steady phase: {steady['steady']['target_rate']} msg/s offered, "
        f"{steady['steady']['sent_per_s']:.0f} sent (trireme bench)"
    )
    svg = Svg(title)
    axes(svg, "seconds", "messages in the queue (ready + in flight + delayed)")

    def point(t, v):
        x = LEFT + t / end * (WIDTH - RIGHT - LEFT)
        y = HEIGHT - BOTTOM - v / top * (HEIGHT - BOTTOM - TOP)
        return x, y

    for step in range(0, 6):
        value = top * step / 5
        _, y = point(0, value)
        svg.line(LEFT, y, WIDTH - RIGHT, y, "#ddd", 1, "3,3")
        svg.text(LEFT - 6, y + 4, f"{value:g}", "end")
    for step in range(0, 6):
        t = end * step / 5
        x, _ = point(t, 0)
        svg.text(x, HEIGHT - BOTTOM + 16, f"{t:.0f}", "middle")
    svg.polyline([point(t, v) for t, v in zip(times, depths)], COLOURS[0])
    svg.legend([("depth", COLOURS[0])])
    svg.write(out)


def main(argv):
    if len(argv) >= 4 and argv[1] == "latency":
        reports = []
        for item in argv[3:]:
            label, sep, path = item.partition("=")
            if not sep or not path:
                sys.exit(f"LABEL=REPORT.json expected, got {item!r}")
            reports.append((label, path))
        latency(argv[2], reports)
    elif len(argv) == 4 and argv[1] == "depth":
        depth(argv[2], argv[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
