#!/usr/bin/env python3
"""Plot a scaling study: throughput and efficiency against devices, one line per scheme family.

    python3 scripts/plot_scaling.py RESULTS.jsonl --out PREFIX

RESULTS.jsonl is what `scaling_study --json` (or `--plot PREFIX`, which calls
this script) writes: one JSON object per point. Writes PREFIX-throughput.png
(training throughput and, beside it, inference throughput in sequences/s) and
PREFIX-efficiency.png. Predicted figures are solid lines, measured ones
(`--run`) dashed, the paper's dotted; one colour per scheme family (1D, 2D,
3D; the data axis is not a family of its own). Where several points share a
family and device count (different data-axis splits), the one with the
highest predicted throughput is drawn.

Efficiency is the tool's own for predicted and measured points (weak: model
flop/s per device against the family's first point; strong: throughput
against the first point over the device ratio). For the paper's points it is
computed from the published throughput the same way: weak, time per sample
at the first point over time per sample here (the per-device work is held
constant); strong, (throughput / first throughput) / (devices / first
devices).

Uses Debian's python3-matplotlib; exit status 2 on bad input, naming the file,
line and key.
"""
import argparse
import json
import sys
import textwrap

REQUIRED = ("study", "kind", "gpus", "scheme", "batch", "predicted_step_s", "throughput",
            "inference_throughput", "efficiency")
LABELS = {"1d": "1D (Megatron)", "2d": "2D (Optimus SUMMA)", "3d": "3D (AxoNN)"}
STYLES = {"predicted": ("-", "o"), "measured": ("--", "s"), "paper": (":", "^")}


def family(scheme):
    core = scheme.split(",", 1)[1] if scheme.startswith("data=") else scheme
    return core.split(":", 1)[0]


def read(path):
    points = []
    with (sys.stdin if path == "-" else open(path, encoding="utf-8")) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                p = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e})") from None
            for key in REQUIRED:
                if key not in p:
                    raise ValueError(f"{path}:{n}: no \"{key}\"")
            points.append(p)
    if not points:
        raise ValueError(f"{path}: no points")
    return points


def series(points):
    """family -> sorted points, one per device count (the best predicted)."""
    best = {}
    for p in points:
        key = (family(p["scheme"]), p["gpus"])
        if key not in best or p["throughput"] > best[key]["throughput"]:
            best[key] = p
    out = {}
    for (fam, _), p in sorted(best.items(), key=lambda kv: kv[0][1]):
        out.setdefault(fam, []).append(p)
    return out


def paper_efficiency(pts, kind):
    first = pts[0]
    eff = []
    for p in pts:
        if "paper_throughput" not in p or "paper_throughput" not in first:
            eff.append(None)
        elif kind == "weak":  # time per sample held: first's over this one's
            eff.append(p["paper_throughput"] / first["paper_throughput"])
        else:
            eff.append(p["paper_throughput"] / first["paper_throughput"]
                       / (p["gpus"] / first["gpus"]))
    return eff


def draw(ax, pts, colour, label, values):
    for source, (line, marker) in STYLES.items():
        xy = [(p["gpus"], v) for p, v in zip(pts, values[source]) if v is not None]
        if xy:
            ax.plot(*zip(*xy), line, marker=marker, color=colour, label=f"{label}, {source}")


# scaling_study replaces a PNG only if it carries this mark (bench/scaling_study.cpp,
# png_of_scaling_study): a tEXt "Software" chunk starting "summa scaling_study".
MARK = {"Software": "summa scaling_study (scripts/plot_scaling.py, matplotlib)"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="scaling_study --json output ('-': stdin)")
    ap.add_argument("--out", required=True, help="prefix of the PNGs to write")
    args = ap.parse_args()
    try:
        points = read(args.results)
    except (OSError, ValueError) as e:
        print(f"plot_scaling: {e}", file=sys.stderr)
        return 2
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kind = points[0]["kind"]
    title = points[0]["study"] + (f" on {points[0]['machine']}" if "machine" in points[0] else "")
    title = "\n".join(textwrap.wrap(title, 70))
    fams = series(points)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    devices = sorted({p["gpus"] for p in points})

    def axes(ax, ylabel):
        ax.set_xscale("log", base=2)
        ax.set_xticks(devices, [str(d) for d in devices])
        ax.set_xlabel("devices")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)

    written = []
    fig, (train, infer) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, (fam, pts) in enumerate(sorted(fams.items())):
        c, label = colours[i % len(colours)], LABELS.get(fam, fam)
        for ax, key in ((train, "throughput"), (infer, "inference_throughput")):
            draw(ax, pts, c, label, {"predicted": [p[key] for p in pts],
                                     "measured": [p.get("measured_" + key) for p in pts],
                                     "paper": [p.get("paper_" + key) for p in pts]})
    axes(train, "training throughput (sequences/s)")
    axes(infer, "inference throughput (sequences/s)")
    train.legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    written.append(f"{args.out}-throughput.png")
    fig.savefig(written[-1], dpi=120, metadata=MARK)

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    top = 1.1
    for i, (fam, pts) in enumerate(sorted(fams.items())):
        values = {"predicted": [p["efficiency"] for p in pts],
                  "measured": [p.get("measured_efficiency") for p in pts],
                  "paper": paper_efficiency(pts, kind)}
        top = max([top] + [1.05 * v for vs in values.values() for v in vs if v is not None])
        draw(ax, pts, colours[i % len(colours)], LABELS.get(fam, fam), values)
    axes(ax, f"{kind} scaling efficiency")
    ax.set_ylim(0, top)
    ax.legend(fontsize="small")
    ax.set_title(title, fontsize="medium")
    fig.tight_layout()
    written.append(f"{args.out}-efficiency.png")
    fig.savefig(written[-1], dpi=120, metadata=MARK)
    for w in written:
        print(f"plot_scaling: wrote {w}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
