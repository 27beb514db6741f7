#!/usr/bin/env python3
"""Draw `clink bench --json` rows as SVG charts: latency and bandwidth against message
size, one line per system (and waiting mode), log-log, the median over rounds.

Usage:
    clink bench --rounds 3 --json > bench.jsonl
    python3 scripts/bench-plot.py bench.jsonl OUT_PREFIX [--placement host|netns|bridge]

writes OUT_PREFIX-latency.svg and OUT_PREFIX-bandwidth.svg (one chart per metric that has
rows). Needs nothing beyond Python's standard library. Rows of `--rma`, `--spec` and other
experiments (they carry an `experiment`) are left out; so are rows of another placement
than the one asked for (default: every placement, told apart in the legend).
"""
import argparse
import json
import math
import statistics
import sys
from collections import defaultdict

METRICS = {
    "latency_us": ("latency", "one-way latency (us), median", "lower is better"),
    "bandwidth_gbs": ("bandwidth", "goodput (GB/s), median", "higher is better"),
}
# Distinct colours, then dashes for the blocking mode.
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf"]
W, H = 720, 440
LEFT, RIGHT, TOP, BOTTOM = 70, 190, 40, 50


def size_label(n):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def series(rows, metric, placement):
    """{label: [(size, median over rounds)]} for one metric."""
    d = defaultdict(list)
    for r in rows:
        if r.get("metric") != metric or "experiment" in r or r.get("median") is None:
            continue
        if placement and r.get("placement", "host") != placement:
            continue
        if r["median"] <= 0 or r["size"] <= 0:
            continue  # (size 0: a latency row the log axis cannot place)
        label = r["system"]
        if r.get("mtu"):
            label += f" mtu {r['mtu']}"
        if r.get("loss_pct"):
            label += f" loss {r['loss_pct']:g}%"
        if r.get("rate"):
            label += f" {r['rate']}"
        if not placement and r.get("placement", "host") != "host":
            label += f" ({r['placement']})"
        label += f" {r.get('mode', '')}".rstrip()
        d[(label, r["size"])].append(r["median"])
    out = defaultdict(list)
    for (label, size), v in d.items():
        out[label].append((size, statistics.median(v)))
    return {k: sorted(v) for k, v in sorted(out.items())}


def ticks(lo, hi):
    """Powers of ten (and 2x, 5x when the range is short) between lo and hi."""
    out = []
    e = math.floor(math.log10(lo))
    while 10 ** e <= hi * 1.0001:
        for m in (1, 2, 5) if math.log10(hi / lo) < 3 else (1,):
            v = m * 10 ** e
            if lo * 0.9999 <= v <= hi * 1.0001:
                out.append(v)
        e += 1
    return out


def chart(title, ylabel, note, data, colour_of):
    xs = [s for pts in data.values() for s, _ in pts]
    ys = [y for pts in data.values() for _, y in pts]
    x0, x1 = min(xs), max(xs)
    if x0 == x1:
        x0, x1 = x0 / 2, x1 * 2
    y0, y1 = min(ys) / 1.3, max(ys) * 1.3
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def px(x):
        return LEFT + pw * (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))

    def py(y):
        return TOP + ph * (1 - (math.log(y) - math.log(y0)) / (math.log(y1) - math.log(y0)))

    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{LEFT}" y="22" font-size="14">{title}</text>',
           f'<text x="{W - RIGHT}" y="22" text-anchor="end" fill="#555">{note}</text>',
           f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>']
    for s in sorted(set(xs)):
        x = px(s)
        svg.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + ph}" stroke="#eee"/>')
        svg.append(f'<text x="{x:.1f}" y="{TOP + ph + 15}" text-anchor="middle">'
                   f'{size_label(s)}</text>')
    svg.append(f'<text x="{LEFT + pw / 2}" y="{H - 10}" text-anchor="middle">'
               f'message size (bytes)</text>')
    for t in ticks(y0, y1):
        y = py(t)
        svg.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + pw}" y2="{y:.1f}" stroke="#eee"/>')
        svg.append(f'<text x="{LEFT - 5}" y="{y + 4:.1f}" text-anchor="end">{t:g}</text>')
    svg.append(f'<text transform="translate(16,{TOP + ph / 2}) rotate(-90)" '
               f'text-anchor="middle">{ylabel}</text>')
    for k, (label, pts) in enumerate(data.items()):
        colour = colour_of[label]
        dash = ' stroke-dasharray="5,3"' if label.endswith("blocking") else ""
        path = " ".join(f"{px(s):.1f},{py(y):.1f}" for s, y in pts)
        svg.append(f'<polyline points="{path}" fill="none" stroke="{colour}" '
                   f'stroke-width="2"{dash}/>')
        for s, y in pts:
            svg.append(f'<circle cx="{px(s):.1f}" cy="{py(y):.1f}" r="2.5" fill="{colour}">'
                       f'<title>{label} {size_label(s)}: {y:.4g}</title></circle>')
        ly = TOP + 12 + 16 * k
        svg.append(f'<line x1="{W - RIGHT + 10}" y1="{ly - 4}" x2="{W - RIGHT + 34}" '
                   f'y2="{ly - 4}" stroke="{colour}" stroke-width="2"{dash}/>')
        svg.append(f'<text x="{W - RIGHT + 40}" y="{ly}">{label}</text>')
    svg.append("</svg>")
    return "\n".join(svg) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows", help="a file of `clink bench --json` rows")
    ap.add_argument("prefix", help="output files are PREFIX-latency.svg, PREFIX-bandwidth.svg")
    ap.add_argument("--placement", choices=["host", "netns", "bridge"])
    a = ap.parse_args()
    rows = []
    with open(a.rows) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                sys.exit(f"{a.rows}:{n}: not a JSON row: {e}")
    charts = {m: series(rows, m, a.placement) for m in METRICS}
    # One colour per line across the charts.
    labels = sorted({label for data in charts.values() for label in data})
    colour_of = {label: COLOURS[k % len(COLOURS)] for k, label in enumerate(labels)}
    written = 0
    for metric, (name, ylabel, note) in METRICS.items():
        data = charts[metric]
        if not data:
            continue
        out = f"{a.prefix}-{name}.svg"
        with open(out, "w") as f:
            f.write(chart(f"clink bench: {name}", ylabel, note, data, colour_of))
        print(f"{out}: {len(data)} lines")
        written += 1
    if not written:
        sys.exit(f"{a.rows}: no latency or bandwidth rows to draw")


if __name__ == "__main__":
    main()
