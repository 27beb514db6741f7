#!/usr/bin/env python3
"""Summarise `clink bench --rounds N --json` output: min and median over rounds per
system/mode/size, and the ratios of medians between systems.

Usage: clink bench --rounds 3 --json > bench.jsonl; python3 scripts/bench-summary.py bench.jsonl

Rows of `clink bench --rma` and `--spec` (they carry an `experiment`) are summarised per
experiment, system, variant, metric, size, MTU and number of endpoints: each round's
median, and their median (and the rounds' p99s, for the rows that have one). Rows without
a value (a `--spec` hit rate of a run with no bulk bytes) are left out. Rows from network
namespaces are told apart by MTU (`system@mtu`).
"""
import json
import statistics as st
import sys
from collections import defaultdict

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rma = defaultdict(list)
for r in rows:
    if "experiment" in r and r["median"] is not None:
        key = (r["experiment"], r["system"], r["variant"], r["metric"], r["size"],
               r.get("mtu") or 0, r.get("endpoints") or 0)
        rma[key].append((r["round"], r["median"], r.get("p99")))
if rma:
    print("| experiment | system | variant | metric | size | mtu | endpoints | rounds | median | p99 by round |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for k in sorted(rma):
        v = [m for _, m, _ in sorted(rma[k])]
        p99 = ", ".join(f"{p:.3g}" for _, _, p in sorted(rma[k]) if p is not None) or "-"
        rounds = ", ".join(f"{m:.3g}" for m in v)
        print("| " + " | ".join(str(x) for x in k) + f" | {rounds} | {st.median(v):.3g} | {p99} |")
rows = [r for r in rows if "experiment" not in r]
if not rows:
    sys.exit(0)
d = defaultdict(list)
for r in rows:
    system = f'{r["system"]}@{r["mtu"]}' if r.get("mtu") else r["system"]
    d[(system, r["mode"], r["metric"], r["size"])].append(r["median"])
cols = sorted({(k[0], k[1]) for k in d})


def cell(v):
    return "-" if not v else f"{min(v):.3g} / {st.median(v):.3g}"


for metric, unit in [("latency_us", "one-way latency, us"), ("bandwidth_gbs", "streaming bandwidth, GB/s")]:
    sizes = sorted({k[3] for k in d if k[2] == metric})
    print(f"\n{unit}: min / median over rounds\n")
    print("| size | " + " | ".join(f"{s} {m}" for s, m in cols) + " |")
    print("|---|" + "---|" * len(cols))
    for z in sizes:
        print(f"| {z} | " + " | ".join(cell(d.get((s, m, metric, z))) for s, m in cols) + " |")


def med(*k):
    v = d.get(k)
    return st.median(v) if v else None


def ratio(name, a, b):
    if a is not None and b is not None and b > 0:
        print(f"- {name}: {a:.3g} / {b:.3g} = {a / b:.2f}")


print("\nratios of medians:")
ratio("8 B latency, busy: clink / ucx (target <= 0.8)", med("clink", "busy", "latency_us", 8), med("ucx", "busy", "latency_us", 8))
ratio("1 MiB bandwidth: clink / ucx (target >= 1.2)", med("clink", "busy", "bandwidth_gbs", 1 << 20), med("ucx", "busy", "bandwidth_gbs", 1 << 20))
for z in [8, 64, 1024, 65536]:
    ratio(f"{z} B latency, blocking: clink / unix (target <= 1.0)", med("clink", "blocking", "latency_us", z), med("unix", "blocking", "latency_us", z))
