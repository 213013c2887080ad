#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0 OR MIT
"""Turns tests/bench/gpu.sh's results.jsonl into the BENCHMARKS.md table: for each kind
(cold, warm, first) and thread count, the median GB/s of gdirect and KvikIO over their runs
(every run was verified before it was recorded), and their ratio.

Usage: gpu_table.py results.jsonl
"""

import json
import re
import statistics
import sys


def main():
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    failed = [r["label"] for r in rows if r.get("failed")]
    speeds = {}
    for r in rows:
        m = re.match(r"(cold|warm|first) t(\d+) (gdirect|kvikio)( #\d+)?$", r.get("label", ""))
        if not m or r.get("failed"):
            continue
        key = (m.group(1), int(m.group(2)))
        speeds.setdefault(key, {}).setdefault(m.group(3), []).extend(x["gb_per_s"] for x in r["runs"])
    print("| read | threads | gdirect GB/s (median) | KvikIO GB/s (median) | gdirect / KvikIO | runs each |")
    print("| --- | --- | --- | --- | --- | --- |")
    names = {"cold": "cold (page cache dropped)", "warm": "warm steady state",
             "first": "warm, first read of a fresh process"}
    for kind in ("cold", "warm", "first"):
        for t in sorted(t for k, t in speeds if k == kind):
            s = speeds[(kind, t)]
            g, k = statistics.median(s.get("gdirect", [0])), statistics.median(s.get("kvikio", [0]))
            runs = min(len(s.get("gdirect", [])), len(s.get("kvikio", [])))
            print(f"| {names[kind]} | {t} | {g:.2f} | {k:.2f} | {g / k if k else 0:.2f}x | {runs} |")
    others = [r for r in rows if r.get("label") and not re.match(r"(cold|warm|first) t\d+ (gdirect|kvikio)( #\d+)?$", r["label"])]
    if others:
        print()
        print("| other measurement | median GB/s | runs |")
        print("| --- | --- | --- |")
        for r in others:
            if not r.get("failed"):
                runs = " ".join("%.2f" % x["gb_per_s"] for x in r["runs"])
                print(f"| {r['label']} | {r['median_gb_per_s']:.2f} | {runs} |")
    if failed:
        print(f"\nFAILED: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
