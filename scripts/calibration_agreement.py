#!/usr/bin/env python3
"""Do two calibrations of this machine agree? (docs/scaling.md, "Calibration
you can trust").

Prices every validation point of scripts/validate_time_model.sh (every
scheme of 1, 2 and 4 ranks on its three GPTs, f32, whole steps; 4 ranks on
2 cores priced with 2 ranks per core) with scaling_study on each machine
file, and prints each point's relative difference, the mean and worst per
model and rank count, and a verdict against --limit (default 5 %). With
--calibrate N it first runs calibrate N times back to back (as
validate_time_model.sh --calibrate does: 2 ranks, f32, the three GPTs'
shapes) and compares the first with each later one.

  scripts/calibration_agreement.py --calibrate 2 --out /tmp/agree
  scripts/calibration_agreement.py machines/a.json machines/b.json

Exit status 1 when a point differs by more than the limit.
"""
import argparse
import json
import os
import subprocess
import sys

MODELS = [  # scripts/validate_time_model.sh's
    ("small", dict(layers=2, hidden=128, heads=4, seq=64, batch=16, vocab=1024)),
    ("medium", dict(layers=2, hidden=256, heads=8, seq=64, batch=16, vocab=2048)),
    ("large", dict(layers=2, hidden=512, heads=8, seq=128, batch=8, vocab=4096)),
]


def schemes(ranks):
    """summa::schemes_for(ranks): 1D, 2D where square, 3D every factorisation, every data axis."""
    out = []
    for data in [d for d in range(1, ranks + 1) if ranks % d == 0]:
        t = ranks // data
        prefix = f"data={data}," if data > 1 else ""
        texts = [f"1d:p={t}"]
        q = int(round(t ** 0.5))
        if q * q == t:
            texts.append(f"2d:q={q}")
        for x in range(1, t + 1):
            for y in range(1, t // x + 1):
                if t % (x * y) == 0:
                    texts.append(f"3d:{x}x{y}x{t // (x * y)}")
        out += [prefix + s for s in texts]
    return out


def predictions(exe, machine, work, cores):
    got = {}
    for ranks in (1, 2, 4):
        points = []
        for name, m in MODELS:
            for s in schemes(ranks):
                points.append(dict(m, gpus=ranks, scheme=s, model=name))
        study = {"name": f"agreement {ranks}", "stem_only": False, "dtype": "f32",
                 "ranks_per_device": max(1, -(-ranks // cores)),
                 "points": [{k: v for k, v in p.items() if k != "model"} for p in points]}
        path = os.path.join(work, f"agreement-{ranks}.json")
        with open(path, "w") as f:
            json.dump(study, f)
        p = subprocess.run([exe, "--study", path, "--predict", machine, "--json"],
                           capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"calibration_agreement: scaling_study on {machine} failed:\n{p.stderr}")
        rows = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
        for point, row in zip(points, rows):
            got[(point["model"], ranks, point["scheme"])] = row["predicted_step_s"]
    return got


def compare(a_path, b_path, a, b, limit):
    print(f"# {a_path} against {b_path}: relative difference of each validation prediction")
    print("| model | ranks | points | mean | worst | worst point |")
    print("|---|---|---|---|---|---|")
    worst_all, diffs = 0.0, []
    for name, _ in MODELS:
        for ranks in (1, 2, 4):
            d = {s: abs(b[(name, ranks, s)] - a[(name, ranks, s)]) /
                 (0.5 * (a[(name, ranks, s)] + b[(name, ranks, s)]))
                 for (n, r, s) in a if n == name and r == ranks}
            w = max(d, key=d.get)
            diffs += list(d.values())
            worst_all = max(worst_all, d[w])
            print(f"| {name} | {ranks} | {len(d)} | {100 * sum(d.values()) / len(d):.1f} % | "
                  f"{100 * d[w]:.1f} % | {w} |")
    ok = worst_all <= limit
    within = sum(1 for d in diffs if d <= limit)
    print(f"calibration_agreement: {len(diffs)} predictions, mean {100 * sum(diffs) / len(diffs):.1f}"
          f" %, worst {100 * worst_all:.1f} %, {within} within {100 * limit:g} %: "
          f"{'PASS' if ok else 'FAIL'}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("machines", nargs="*", help="two or more machine files to compare")
    ap.add_argument("--calibrate", type=int, default=0,
                    help="run calibrate this many times back to back first")
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default="/tmp/summa-agreement")
    ap.add_argument("--limit", type=float, default=0.05)
    ap.add_argument("--calibrate-args", default="",
                    help="more calibrate flags, e.g. '--min-seconds 0.1 --reps 7'")
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1,
                    help="cores of the machine the predictions are for (ranks beyond share)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    machines = list(a.machines)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    for k in range(a.calibrate):
        path = os.path.join(a.out, f"calibration-{k + 1}.json")
        if os.path.exists(path):
            os.remove(path)
        cmd = ["mpirun", "-np", "2", os.path.join(a.build, "bench", "calibrate"), "--out", path,
               "--dtype", "f32", "--ranks", "1,2,4"]
        for _, m in MODELS:
            cmd += ["--gpt", ",".join(f"{k}={v}" for k, v in m.items())]
        cmd += a.calibrate_args.split()
        print(f"calibration_agreement: calibration {k + 1}: {' '.join(cmd)}", flush=True)
        p = subprocess.run(cmd, env=env, text=True, capture_output=True)
        sys.stdout.write(p.stdout)
        sys.stderr.write(p.stderr)
        if p.returncode != 0:
            sys.exit(f"calibration_agreement: calibrate failed ({p.returncode})")
        machines.append(path)
    if len(machines) < 2:
        sys.exit("calibration_agreement: give two machine files, or --calibrate 2")
    exe = os.path.join(a.build, "bench", "scaling_study")
    first = predictions(exe, machines[0], a.out, a.cores)
    ok = True
    for other in machines[1:]:
        ok &= compare(machines[0], other, first, predictions(exe, other, a.out, a.cores), a.limit)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
