#!/usr/bin/env python3
"""Draw a pipelined step's timeline: which microbatch each stage ran when.

    python3 scripts/plot_pipeline.py timeline.jsonl -o pipeline.png [--summary]

The input is compare_schemes --timeline's JSON lines (one per operation of
every rank: scheme, stage, forward or backward, microbatch, start and end in
seconds since the step began after a barrier). One panel per scheme, one row
per stage (its first rank; the others of a stage run the same operations),
forwards and backwards as boxes labelled with their microbatch, the way
AxoNN's Figure 1 draws a schedule. --summary prints, per scheme and stage,
the step's span, the stage's busy time and its idle share (the bubble as
measured) as a Markdown table instead of (or besides, with -o) the plot.
Uses Debian's python3-matplotlib for the plot.
"""
import argparse
import json
import sys


def read(path):
    schemes = {}  # scheme -> {stage: [(forward, micro, start, end)]}, first rank per stage
    first_rank = {}
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    r = json.loads(line)
                    key, stage, rank = r["scheme"], r["stage"], r["rank"]
                    op = (r["forward"], r["microbatch"], r["start_s"], r["end_s"])
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    sys.exit(f"plot_pipeline: {path}:{n}: not a compare_schemes --timeline line ({e})")
                if first_rank.setdefault((key, stage), rank) != rank:
                    continue
                schemes.setdefault(key, {}).setdefault(stage, []).append(op)
    except OSError as e:
        sys.exit(f"plot_pipeline: cannot read {path}: {e}")
    if not schemes:
        sys.exit(f"plot_pipeline: {path} holds no operation")
    return schemes


def summary(schemes):
    print("| scheme | stage | step (ms) | busy (ms) | idle |")
    print("|---|---:|---:|---:|---:|")
    for key, stages in schemes.items():
        span = max(op[3] for ops in stages.values() for op in ops)
        for stage in sorted(stages):
            busy = sum(op[3] - op[2] for op in stages[stage])
            print(f"| `{key}` | {stage} | {1e3 * span:.1f} | {1e3 * busy:.1f} | "
                  f"{100 * (1 - busy / span):.0f} % |")


def plot(schemes, output):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(schemes), 1, squeeze=False,
                             figsize=(10, 1.2 + 0.55 * sum(len(s) for s in schemes.values())))
    for ax, (key, stages) in zip(axes[:, 0], schemes.items()):
        for stage, ops in stages.items():
            for forward, micro, start, end in ops:
                ax.barh(stage, 1e3 * (end - start), left=1e3 * start, height=0.8,
                        color="#4C72B0" if forward else "#DD8452", edgecolor="black",
                        linewidth=0.4)
                ax.text(1e3 * (start + end) / 2, stage, str(micro), ha="center", va="center",
                        fontsize=7, color="white")
        ax.set_yticks(sorted(stages))
        ax.set_yticklabels([f"stage {s}" for s in sorted(stages)])
        ax.invert_yaxis()
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("ms since the step began (forward: blue, backward: orange; microbatch)")
    fig.tight_layout()
    fig.savefig(output, dpi=110)
    print(output)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("timeline", help="compare_schemes --timeline output (JSON lines)")
    ap.add_argument("-o", "--output", help="PNG to write")
    ap.add_argument("--summary", action="store_true",
                    help="print each stage's busy and idle time as a Markdown table")
    args = ap.parse_args()
    if not args.output and not args.summary:
        ap.error("give -o PNG, --summary or both")
    schemes = read(args.timeline)
    if args.summary:
        summary(schemes)
    if args.output:
        plot(schemes, args.output)


if __name__ == "__main__":
    main()
