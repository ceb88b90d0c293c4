#!/usr/bin/env python3
"""Where a GPU decode step's time goes: every kernel of one step, timed by ncu.

Runs bench/cuda/e2e_bench.py under Nsight Compute (gpu__time_duration of each kernel, no cache
flush, clocks left alone) for each KV setting, finds the last complete decode step in the launch
sequence (the period after which the kernel names repeat) and prints its kernels in launch order
with their durations, grouped by kernel, side by side for the settings, with the sum. Kernels
are timed one at a time, so the sum leaves out what overlaps in a real step (programmatic
dependent launch) and the gaps between kernels and the host's share of a step; compare it with
e2e_bench.py's ms per step for those.

usage: bench/cuda/step_split.py --lib build/bench/cuda/libturbokv_e2e_bench.so --model DIR
         [--depth 32768] [--batch 1] [--kv dense,3.5,3.5+last] [--kv-cache-gb 8] [--ncu ncu]
"""
import argparse
import csv
import io
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def short(name):
    """A kernel's name and template arguments, without namespaces, return type and parameters."""
    for anonymous in ("(anonymous namespace)::", "<unnamed>::"):
        name = name.replace(anonymous, "")
    name = re.sub(r"^void ", "", name)
    depth = 0
    for i, ch in enumerate(name):
        depth += (ch == "<") - (ch == ">")
        if ch == "(" and depth == 0:
            name = name[:i]
            break
    head, _, args = name.partition("<")
    head = head.split("::")[-1]
    args = re.sub(r"[A-Za-z_][A-Za-z_0-9]*::", "", args)
    return f"{head}<{args}" if args else head


def profile(args, kv):
    cmd = [args.ncu, "--csv", "--metrics", "gpu__time_duration.sum", "--cache-control", "none",
           "--clock-control", "none", sys.executable, os.path.join(HERE, "e2e_bench.py"),
           "--lib", args.lib, "--model", args.model, "--depths", str(args.depth), "--batch",
           str(args.batch), "--steps", "3", "--kv", kv, "--prefill", "0", "--no-torch",
           "--kv-cache-gb", str(args.kv_cache_gb)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    rows = [line for line in run.stdout.splitlines() if line.startswith('"')]
    if run.returncode != 0 or not rows:
        sys.exit(f"ncu failed for {kv} (exit {run.returncode}):\n{run.stdout[-2000:]}"
                 f"\n{run.stderr[-2000:]}")
    kernels = []
    for r in csv.DictReader(io.StringIO("\n".join(rows))):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "ns")
        us = value / 1e3 if unit in ("ns", "nsecond") else value * 1e3 if unit == "msecond" else value
        kernels.append((short(r["Kernel Name"]), us))
    return kernels


def last_step(kernels):
    """The last period p with names[-p:] == names[-2p:-p]: one decode step's kernels."""
    names = [k[0] for k in kernels]
    for p in range(4, len(names) // 2 + 1):
        if names[-p:] == names[-2 * p:-p]:
            return kernels[-p:]
    sys.exit("no repeating decode step found in the kernel sequence")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--depth", type=int, default=32768)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--kv", default="dense,3.5,3.5+last")
    ap.add_argument("--kv-cache-gb", type=float, default=8)
    ap.add_argument("--ncu", default="ncu")
    args = ap.parse_args()
    kvs = args.kv.split(",")
    steps = {kv: last_step(profile(args, kv)) for kv in kvs}
    print(f"# one decode step, batch {args.batch}, depth {args.depth}, model {args.model}: "
          "kernel durations (us) by ncu, one at a time")
    for kv in kvs:
        print(f"\n## {kv}: {len(steps[kv])} kernels, {sum(us for _, us in steps[kv]):.1f} us")
        print("  ".join(f"{n} {us:.1f}" for n, us in steps[kv]))
    order, totals = [], {kv: {} for kv in kvs}
    for kv in kvs:
        for n, us in steps[kv]:
            if n not in order:
                order.append(n)
            count, total = totals[kv].get(n, (0, 0.0))
            totals[kv][n] = (count + 1, total + us)
    width = max(len(n) for n in order) + 2
    print("\n" + "kernel".ljust(width) + "".join(f"{kv:>20}" for kv in kvs)
          + "   (kernels x, total us)")
    for n in order:
        cells = []
        for kv in kvs:
            count, total = totals[kv].get(n, (0, 0.0))
            cells.append(f"{count} x {total:.1f} us" if count else "")
        print(n.ljust(width) + "".join(f"{c:>20}" for c in cells))
    print("sum".ljust(width) + "".join(f"{sum(t for _, t in totals[kv].values()):>17.1f} us"
                                       for kv in kvs))

if __name__ == "__main__":
    main()
