#!/usr/bin/env python3
"""How much would other figures of a machine file change a paper's held-out
errors? (docs/scaling.md, "Where the gap to the paper remains").

A diagnostic, not a fit: it prices a preset's rows (scaling_study --json)
on the machine file with each combination of the --set values, and prints
the held-out rows' mean and worst |error| on the forward plus backward per
sample, with each held-out row's error. The held-out protocol forbids
shipping figures chosen this way (they would be fitted to the rows they
are then said to predict); what it shows is how large a change of a
figure the gap would need, and whether any single value fits the trend.

  scripts/heldout_sensitivity.py --machine machines/frontera-rtx.json \\
      --preset optimus-weak --preset optimus-strong \\
      --set 'links.inter_node.*.beta_bytes_s=6e9,5e9,4.5e9' \\
      --set 'links.inter_node.*.alpha_s=2e-5,1e-4'

A --set PATH is a dotted path in the machine file as fit_machine.py's
--param ('*' matches every key at that level).
"""
import argparse
import copy
import itertools
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fit_machine import paths, run_study  # noqa: E402


def held_out(points):
    """(mean, worst, per-row text) of the held-out rows' fwd+bwd per-sample errors."""
    errs, rows = [], []
    for p in points:
        if p.get("validation_role") != "held-out":
            continue
        pred = (p["predicted_fwd_s"] + p["predicted_bwd_s"]) / p["batch"]
        paper = p["paper_fwd_per_sample_s"] + p["paper_bwd_per_sample_s"]
        e = pred / paper - 1
        errs.append(abs(e))
        rows.append(f"{p['gpus']}:{p['scheme'].split(':')[0]} {100 * e:+.0f}")
    if not errs:
        sys.exit("heldout_sensitivity: no held-out rows (a preset with a paper's figures?)")
    return sum(errs) / len(errs), max(errs), ", ".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--machine", required=True)
    ap.add_argument("--preset", action="append", default=[])
    ap.add_argument("--study", action="append", default=[])
    ap.add_argument("--set", action="append", default=[], metavar="PATH=V1,V2,...")
    ap.add_argument("--scaling-study", default="build/bench/scaling_study")
    a = ap.parse_args()
    sources = [["--preset", p] for p in a.preset] + [["--study", s] for s in a.study]
    if not sources:
        sys.exit("heldout_sensitivity: give --preset or --study")
    with open(a.machine) as f:
        base = json.load(f)
    axes = []
    for s in a.set:
        path, eq, values = s.partition("=")
        if not eq or not values:
            sys.exit(f"heldout_sensitivity: --set {s!r}: expected PATH=V1,V2,...")
        try:
            vs = [float(v) for v in values.split(",")]
        except ValueError:
            sys.exit(f"heldout_sensitivity: --set {s!r}: the values are not numbers")
        paths(base, path)  # refuses a path the file lacks
        axes.append((path, vs))
    work = tempfile.mkdtemp()
    machine_path = os.path.join(work, "machine.json")
    print("| " + " | ".join(p for p, _ in axes) + " | held-out mean | worst | rows |")
    print("|" + "---|" * (len(axes) + 3))
    for combo in itertools.product(*[vs for _, vs in axes]) if axes else [()]:
        m = copy.deepcopy(base)
        for (path, _), v in zip(axes, combo):
            for parent, key in paths(m, path):
                parent[key] = v
        with open(machine_path, "w") as f:
            json.dump(m, f)
        points = []
        for src in sources:
            points += run_study(a.scaling_study, src, machine_path, [])
        mean, worst, rows = held_out(points)
        print("| " + " | ".join(f"{v:g}" for v in combo) +
              f" | {100 * mean:.1f} % | {100 * worst:.1f} % | {rows} |")


if __name__ == "__main__":
    main()
