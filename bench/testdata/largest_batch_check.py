#!/usr/bin/env python3
"""scaling_study --largest-batch against the GiB/gpu column's own plan: for
every point of a preset, a study of that point at the largest batch fits the
device (memory_fits) and one at the next multiple of the scheme's batch
granularity does not. The preset's points must use the study file defaults
(f32, stem only, full recompute), as optimus-weak does; each point is
planned as the implementation it is priced as (its "implementation").

usage: largest_batch_check.py SCALING_STUDY MACHINE_FILE PRESET WORKDIR
"""
import json
import os
import subprocess
import sys


def run(exe, machine, *args):
    out = subprocess.run([exe, *args, "--predict", machine, "--json"], check=True,
                         capture_output=True, text=True).stdout
    return [json.loads(l) for l in out.splitlines() if l.startswith("{")]


def main():
    exe, machine, preset, work = sys.argv[1:5]
    os.makedirs(work, exist_ok=True)
    points = run(exe, machine, "--preset", preset, "--largest-batch")
    assert points, "no points"
    checked = 0
    for p in points:
        largest, g = p.get("largest_batch"), p.get("batch_granularity")
        assert largest is not None and g, f"no largest batch for {p['scheme']}: {p}"
        for batch, want in ((largest, True), (largest + g, False)):
            if batch == 0:
                continue
            study = {"name": "check", "kind": p["kind"], "points": [
                {"gpus": p["gpus"], "scheme": p["scheme"], "batch": batch, "seq": p["seq"],
                 "layers": p["layers"], "hidden": p["hidden"], "heads": p["heads"],
                 "vocab": p["vocab"], "implementation": p["implementation"]}]}
            path = os.path.join(work, "point.json")
            with open(path, "w") as f:
                json.dump(study, f)
            (got,) = run(exe, machine, "--study", path)
            if got.get("memory_fits") != want:
                sys.exit(f"{p['scheme']} on {p['gpus']} devices: batch {batch} "
                         f"memory_fits={got.get('memory_fits')}, expected {want} "
                         f"(largest_batch {largest}, granularity {g})")
            checked += 1
    print(f"largest_batch_check: {checked} plans agree with --largest-batch over "
          f"{len(points)} points")


main()
