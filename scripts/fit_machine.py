#!/usr/bin/env python3
"""Fit a machine file's figures to a paper's fit rows (docs/scaling.md,
"Held-out validation").

The held-out protocol: a machine file for a published system comes from
data sheets, and at most the rows of a paper's table that ran within one
node may be used to fit its free figures; every other row is then a
prediction. This script does the fitting: it runs scaling_study --json on
the given presets (or study files) restricted to the points within one
node of the machine, and minimises the sum of squared log errors of the
predicted forward and backward time per sample against the paper's, over
the named figures of the machine file (Nelder-Mead in log space, each
figure kept within its bounds). It refuses a point beyond one node.

  scripts/fit_machine.py --machine machines/frontera-rtx.json \\
      --preset optimus-weak --preset optimus-strong \\
      --param device.gemm.f32.max_efficiency:0.3:1 \\
      --param 'links.intra_node.*.beta_bytes_s:1e9:3e10' \\
      --out machines/frontera-rtx.json

A parameter is a dotted path in the machine file ('*' matches every key
at that level: every collective of a link level moves together), with
optional bounds LOW:HIGH. The fitted values are written to --out (the
machine file itself may be replaced: its other figures are kept), and a
table of the fit rows' errors before and after is printed.
"""
import argparse
import copy
import json
import math
import os
import subprocess
import sys
import tempfile


def paths(doc, dotted):
    """Every (parent, key) the dotted path names in doc ('*': any key)."""
    parts = dotted.split(".")
    found = [(None, None, doc)]
    for part in parts:
        nxt = []
        for _, _, node in found:
            if not isinstance(node, dict):
                continue
            keys = list(node) if part == "*" else [part]
            for k in keys:
                if k in node:
                    nxt.append((node, k, node[k]))
        found = nxt
    if not found:
        sys.exit(f"fit_machine: --param {dotted}: no such figure in the machine file")
    for parent, key, value in found:
        if not isinstance(value, (int, float)) or value <= 0:
            sys.exit(f"fit_machine: --param {dotted}: {key} is {value!r}, not a positive number")
    return [(parent, key) for parent, key, _ in found]


def run_study(binary, source, machine_path, gpus):
    args = [binary] + source + ["--predict", machine_path, "--json"]
    out = []
    for extra in [["--gpus", str(g)] for g in gpus] or [[]]:
        p = subprocess.run(args + extra, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"fit_machine: {' '.join(args + extra)} failed:\n{p.stderr}")
        out += [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
    return out


def errors(points):
    """Per point: log errors of fwd and bwd per sample against the paper."""
    rows = []
    for p in points:
        if "paper_fwd_per_sample_s" not in p:
            continue
        b = p["batch"]
        rows.append((p, math.log(p["predicted_fwd_s"] / b / p["paper_fwd_per_sample_s"]),
                     math.log(p["predicted_bwd_s"] / b / p["paper_bwd_per_sample_s"])))
    return rows


def nelder_mead(f, x0, steps, iterations):
    n = len(x0)
    simplex = [list(x0)]
    for i in range(n):
        x = list(x0)
        x[i] += steps[i]
        simplex.append(x)
    values = [f(x) for x in simplex]
    for _ in range(iterations):
        order = sorted(range(n + 1), key=lambda i: values[i])
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        if abs(values[-1] - values[0]) < 1e-10:
            break
        centroid = [sum(x[i] for x in simplex[:-1]) / n for i in range(n)]
        worst = simplex[-1]
        reflected = [c + (c - w) for c, w in zip(centroid, worst)]
        fr = f(reflected)
        if fr < values[0]:
            expanded = [c + 2 * (c - w) for c, w in zip(centroid, worst)]
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = [c + 0.5 * (w - c) for c, w in zip(centroid, worst)]
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:  # shrink towards the best
                best = simplex[0]
                simplex = [best] + [[b + 0.5 * (x - b) for b, x in zip(best, s)]
                                    for s in simplex[1:]]
                values = [values[0]] + [f(x) for x in simplex[1:]]
    i = min(range(n + 1), key=lambda i: values[i])
    return simplex[i], values[i]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--machine", required=True, help="the machine file to start from")
    ap.add_argument("--out", required=True, help="where to write the fitted machine file")
    ap.add_argument("--preset", action="append", default=[], help="a scaling_study preset")
    ap.add_argument("--study", action="append", default=[], help="a scaling_study study file")
    ap.add_argument("--param", action="append", required=True,
                    help="PATH[:LOW:HIGH], a figure of the machine file to fit")
    ap.add_argument("--scaling-study", default="build/bench/scaling_study")
    ap.add_argument("--iterations", type=int, default=200)
    a = ap.parse_args()
    with open(a.machine) as f:
        machine = json.load(f)
    per_node = machine["devices_per_node"]
    sources = [["--preset", p] for p in a.preset] + [["--study", s] for s in a.study]
    if not sources:
        sys.exit("fit_machine: give --preset or --study")
    # the fit rows: the points with a paper's figures within one node
    probe_dir = tempfile.mkdtemp()
    probe = os.path.join(probe_dir, "machine.json")
    with open(probe, "w") as f:
        json.dump(machine, f)
    gpus = {}
    for s in sources:
        pts = run_study(a.scaling_study, s, probe, [])  # every point (no --gpus)
        gpus[tuple(s)] = sorted({p["gpus"] for p in pts
                                 if "paper_fwd_per_sample_s" in p and p["gpus"] <= per_node})
        if not gpus[tuple(s)]:
            sys.exit(f"fit_machine: {' '.join(s)} has no point with a paper's figures within one "
                     f"node ({per_node} devices)")
    params = []
    for spec in a.param:
        path, *bounds = spec.split(":")
        if bounds and len(bounds) != 2:
            sys.exit(f"fit_machine: --param {spec}: bounds are LOW:HIGH")
        low, high = (float(bounds[0]), float(bounds[1])) if bounds else (1e-300, 1e300)
        params.append((path, low, high))
    targets = [paths(machine, p) for p, _, _ in params]
    x0 = [math.log(targets[i][0][0][targets[i][0][1]]) for i in range(len(params))]

    def build(x):
        m = copy.deepcopy(machine)
        t = [paths(m, p) for p, _, _ in params]
        for (path, low, high), where, v in zip(params, t, x):
            for parent, key in where:
                parent[key] = min(high, max(low, math.exp(v)))
        return m

    def evaluate(x):
        with open(probe, "w") as f:
            json.dump(build(x), f)
        rows = []
        for s in sources:
            rows += errors(run_study(a.scaling_study, s, probe, gpus[tuple(s)]))
        return rows

    def loss(x):
        return sum(ef * ef + eb * eb for _, ef, eb in evaluate(x))

    before = evaluate(x0)
    best, value = nelder_mead(loss, x0, [0.2] * len(x0), a.iterations)
    after = evaluate(best)
    fitted = build(best)
    print(f"fit_machine: {len(after)} fit rows (within one node, {per_node} devices), "
          f"{len(params)} figures; sum of squared log errors {loss(x0):.4f} -> {value:.4f}")
    print(f"{'gpus':>5} {'scheme':>10} {'fwd% before':>12} {'bwd% before':>12} "
          f"{'fwd% after':>11} {'bwd% after':>11}")
    for (p, f0, b0), (_, f1, b1) in zip(before, after):
        pct = lambda e: 100 * (math.exp(e) - 1)
        print(f"{p['gpus']:>5} {p['scheme']:>10} {pct(f0):>+12.1f} {pct(b0):>+12.1f} "
              f"{pct(f1):>+11.1f} {pct(b1):>+11.1f}")
    for (path, _, _), where in zip(params, [paths(fitted, p) for p, _, _ in params]):
        print(f"  {path} = {where[0][0][where[0][1]]:.6g}")
    with open(a.out, "w") as f:
        json.dump(fitted, f, indent=2)
        f.write("\n")
    print(f"fit_machine: wrote {a.out}")


if __name__ == "__main__":
    main()
