#!/bin/bash
# Two builds of clink alternated, busy rows of `clink bench`, and the median of the
# per-round ratios B/A per metric and size.
#
#   scripts/bench-ab.sh ROUNDS CLINK_A CLINK_B [clink bench options]
#   scripts/bench-ab.sh 30 /tmp/old/clink target/release/clink --placement netns --mtu 1500 --lat-sizes 64 --bw-sizes 1M
set -euo pipefail
if [ $# -lt 3 ]; then
    echo "usage: $0 ROUNDS CLINK_A CLINK_B [clink bench options]" >&2
    exit 2
fi
rounds=$1 a=$2 b=$3
shift 3
for bin in "$a" "$b"; do
    [ -x "$bin" ] || { echo "$0: $bin: not an executable" >&2; exit 2; }
done
rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
for r in $(seq "$rounds"); do
    for side in A B; do
        bin=$a
        [ "$side" = B ] && bin=$b
        "$bin" bench --systems clink --mode busy --json "$@" 2>/dev/null |
            python3 -c "
import json, sys
for line in sys.stdin:
    d = json.loads(line)
    print('$side', $r, d['metric'], d['size'], d['median'])" >> "$rows"
    done
done
python3 - "$rows" <<'PY'
import collections, statistics, sys
by = collections.defaultdict(dict)
for side, rnd, metric, size, median in (l.split() for l in open(sys.argv[1])):
    by[(metric, int(size))].setdefault(rnd, {})[side] = float(median)
for (metric, size), rounds in sorted(by.items()):
    pairs = [r for r in rounds.values() if len(r) == 2]
    if not pairs:
        continue
    ratios = [r['B'] / r['A'] for r in pairs]
    print(f"{metric} {size}: B/A median {statistics.median(ratios):.3f} "
          f"(range {min(ratios):.2f}-{max(ratios):.2f}, {len(ratios)} rounds); "
          f"A median {statistics.median(r['A'] for r in pairs):.3f}, "
          f"B median {statistics.median(r['B'] for r in pairs):.3f}")
PY
