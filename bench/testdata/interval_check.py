#!/usr/bin/env python3
"""scaling_study's prediction interval and a study's "ranks_per_device".

A copy of MACHINE_FILE with a calibration's spreads (10 % on the GEMM,
20 % on the element-wise bandwidth, 30 % on the links): every point's
--json has predicted_step_s_low < predicted_step_s < predicted_step_s_high
(an "auto" point's for the scheme it chose too),
and the machine file without spreads gives no interval. A study with
"ranks_per_device": 2 prices each point slower than with 1 (the compute of
two ranks on one device), and a bad value is refused by name.

With COMPARE_SCHEMES given, compare_schemes --predict on the file with
spreads has the same interval around its prediction (and says whether the
measured step lies in it), and none without spreads.

usage: interval_check.py SCALING_STUDY MACHINE_FILE WORKDIR [COMPARE_SCHEMES]
"""
import json
import os
import subprocess
import sys


def fail(msg):
    sys.exit(f"interval_check: FAIL: {msg}")


def run(exe, study, machine, check=True):
    p = subprocess.run([exe, "--study", study, "--predict", machine, "--json"],
                       capture_output=True, text=True)
    if check and p.returncode != 0:
        fail(f"scaling_study failed: {p.stderr}")
    return p, [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]


def main():
    exe, machine, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    with open(machine) as f:
        m = json.load(f)
    m["spread"] = {"gemm": {"f32": 0.1}, "memory_bandwidth": 0.2, "intra_node": 0.3,
                   "inter_node": 0.3}
    spread_path = os.path.join(work, "spread.json")
    with open(spread_path, "w") as f:
        json.dump(m, f)
    points = [{"gpus": g, "scheme": s, "batch": 8, "seq": 128, "layers": 2, "hidden": 256,
               "heads": 8, "vocab": 1024}
              for g, s in ((1, "1d:p=1"), (4, "2d:q=2"), (8, "data=2,1d:p=4"), (4, "auto"))]
    study = {"name": "interval", "stem_only": False, "points": points}
    path = os.path.join(work, "study.json")
    with open(path, "w") as f:
        json.dump(study, f)
    _, rows = run(exe, path, spread_path)
    for r in rows:
        lo, mid, hi = r.get("predicted_step_s_low"), r["predicted_step_s"], \
            r.get("predicted_step_s_high")
        if lo is None or hi is None or not lo < mid < hi:
            fail(f"{r['scheme']}: interval {lo} < {mid} < {hi} does not hold")
    _, plain = run(exe, path, machine)
    if any("predicted_step_s_low" in r for r in plain):
        fail("an interval without spreads in the machine file")
    study["ranks_per_device"] = 2
    with open(path, "w") as f:
        json.dump(study, f)
    _, shared = run(exe, path, machine)
    if len(rows) != len(points) or rows[-1]["scheme"] == "auto":
        fail(f"the auto point was not resolved to a scheme: {rows[-1:]}")
    for a, b in zip(plain, shared):
        if not b["predicted_step_s"] > a["predicted_step_s"]:
            fail(f"{a['scheme']}: ranks_per_device 2 priced {b['predicted_step_s']}, "
                 f"1 {a['predicted_step_s']}")
    study["ranks_per_device"] = 0
    with open(path, "w") as f:
        json.dump(study, f)
    p, _ = run(exe, path, machine, check=False)
    if p.returncode == 0 or '"ranks_per_device" is 0, not an integer between 1 and' not in p.stderr:
        fail(f"ranks_per_device 0: exit {p.returncode}, {p.stderr!r}")
    compared = ""
    if len(sys.argv) > 4:
        def compare(machine_file):
            p = subprocess.run([sys.argv[4], "--schemes", "1d:p=1", "--layers", "1", "--hidden",
                                "32", "--heads", "4", "--seq", "8", "--batch", "2", "--vocab", "64",
                                "--reps", "1", "--warmup", "0", "--format", "json", "--predict",
                                machine_file], capture_output=True, text=True)
            if p.returncode != 0:
                fail(f"compare_schemes failed: {p.stderr}")
            return [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
        for r in compare(spread_path):
            lo, mid, hi = r.get("predicted_step_s_low"), r["predicted_step_s"], \
                r.get("predicted_step_s_high")
            if lo is None or hi is None or not lo < mid < hi or \
                    not isinstance(r.get("measured_within_interval"), bool):
                fail(f"compare_schemes {r['scheme']}: interval {lo} < {mid} < {hi}, "
                     f"within {r.get('measured_within_interval')!r}")
        if any("predicted_step_s_low" in r for r in compare(machine)):
            fail("compare_schemes: an interval without spreads in the machine file")
        compared = "; compare_schemes' too"
    print(f"intervals bracket the prediction at {len(rows)} points{compared}; ranks_per_device "
          f"reaches the price")


if __name__ == "__main__":
    main()
