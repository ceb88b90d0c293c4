#!/usr/bin/env python3
"""Bits vs KL divergence of KV-cache settings from `turbokv perplexity --sweep ... --csv FILE`.

Each row of the CSV is one setting; it is drawn in one of four families: TurboQuant, TurboQuant
with recent tokens in fp16 (a setting with --kv-recent-tokens), uniform groups, and uniform
groups after a Hadamard rotation (a setting with --kv-hadamard). The x axis
is kv_bits_effective (everything stored for the whole model, per K/V element), the y axis
kld_mean (log scale). Each family's Pareto frontier (the settings no other setting of the family
beats on both bits and KLD) is joined by a line.

    python3 scripts/plot_pareto.py bench/results/pareto.csv -o docs/pareto.png
"""
import argparse
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

FAMILIES = [("turboquant", "TurboQuant", "tab:blue", "o"),
            ("turboquant+recent", "TurboQuant + recent tokens in fp16", "tab:purple", "D"),
            ("uniform", "uniform groups", "tab:orange", "s"),
            ("uniform+hadamard", "uniform + Hadamard", "tab:green", "^")]


def family(row):
    if row["kv_scheme"] == "turboquant":
        return "turboquant+recent" if "--kv-recent-tokens" in row["setting"] else "turboquant"
    return "uniform+hadamard" if "--kv-hadamard" in row["setting"] else "uniform"


def frontier(points):
    """The points no other point beats on both coordinates, by ascending bits."""
    best, out = float("inf"), []
    for bits, kld, label in sorted(points):
        if kld < best:
            out.append((bits, kld, label))
            best = kld
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", nargs="+", help="CSV files written by perplexity --sweep --csv")
    parser.add_argument("-o", "--output", required=True, help="PNG to write")
    parser.add_argument("--title", default="KV cache: whole-model bits vs KL divergence")
    parser.add_argument("--max-bits", type=float, default=None,
                        help="leave out settings above this many bits")
    args = parser.parse_args()

    points = {name: [] for name, *_ in FAMILIES}
    for path in args.csv:
        with open(path, newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                bits, kld = float(row["kv_bits_effective"]), float(row["kld_mean"])
                if args.max_bits is not None and bits > args.max_bits:
                    continue
                points[family(row)].append((bits, kld, row["setting"]))
    if not any(points.values()):
        sys.exit("plot_pareto: no settings in " + ", ".join(args.csv))

    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    for name, label, color, marker in FAMILIES:
        if not points[name]:
            continue
        xs, ys = [p[0] for p in points[name]], [p[1] for p in points[name]]
        ax.scatter(xs, ys, color=color, marker=marker, alpha=0.45, s=28)
        front = frontier(points[name])
        ax.plot([p[0] for p in front], [p[1] for p in front], color=color, marker=marker,
                label=f"{label} (frontier)", linewidth=1.8)
    ax.set_yscale("log")
    ax.set_xlabel("bits per K/V element, whole model (codes, norms, means, fp16 sinks and dense layers)")
    ax.set_ylabel("kld_mean vs dense cache")
    ax.set_title(args.title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.output)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
