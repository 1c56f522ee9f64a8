#!/usr/bin/env python3
"""scripts/fit_machine.py recovers known figures and keeps to the held-out
protocol.

The oracle: a copy of MACHINE_FILE with its FP32 GEMM max_efficiency set to
0.55 and its intra-node bus bandwidth to 4e9 predicts a small study's
points; those predictions become the study's "paper" figures (one point
within one node of each scheme, and one beyond, whose figures are wrong on
purpose: were it fitted, the fit would move). Fitting the two figures from
the file's own values must find 0.55 and 4e9 within 2 % (the held-out point
never seen), and leave every other figure of the file as it was; a study
without a point within one node is refused.

usage: fit_machine_check.py SCALING_STUDY MACHINE_FILE FIT_MACHINE WORKDIR
"""
import json
import os
import subprocess
import sys


def fail(msg):
    sys.exit(f"fit_machine_check: FAIL: {msg}")


def main():
    exe, machine, fit, work = sys.argv[1:5]
    os.makedirs(work, exist_ok=True)
    with open(machine) as f:
        m = json.load(f)
    truth = json.loads(json.dumps(m))
    truth["device"]["gemm"]["f32"]["max_efficiency"] = 0.55
    for c in truth["links"]["intra_node"].values():
        c["beta_bytes_s"] = 4e9
    truth_path = os.path.join(work, "truth.json")
    with open(truth_path, "w") as f:
        json.dump(truth, f)
    per_node = m["devices_per_node"]
    points = [{"gpus": per_node, "scheme": "1d:p=%d" % per_node, "batch": 16, "seq": 256,
               "layers": 2, "hidden": 1024, "heads": 16, "implementation": "megatron-2021"},
              {"gpus": 4, "scheme": "2d:q=2", "batch": 16, "seq": 256, "layers": 2,
               "hidden": 1024, "heads": 16, "implementation": "optimus-2021"}]
    study = {"name": "fit check", "points": points}
    path = os.path.join(work, "study.json")
    with open(path, "w") as f:
        json.dump(study, f)
    out = subprocess.run([exe, "--study", path, "--predict", truth_path, "--json"], check=True,
                         capture_output=True, text=True).stdout
    rows = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    for p, r in zip(points, rows):
        p["paper_fwd_per_sample_s"] = r["predicted_fwd_s"] / r["batch"]
        p["paper_bwd_per_sample_s"] = r["predicted_bwd_s"] / r["batch"]
    # a held-out point with figures no machine file gives: must not be fitted
    points.append(dict(points[0], gpus=4 * per_node, scheme="1d:p=%d" % (4 * per_node),
                       paper_fwd_per_sample_s=1e-6, paper_bwd_per_sample_s=1e-6))
    with open(path, "w") as f:
        json.dump(study, f)
    fitted_path = os.path.join(work, "fitted.json")
    p = subprocess.run([sys.executable, fit, "--machine", machine, "--out", fitted_path,
                        "--study", path, "--scaling-study", exe,
                        "--param", "device.gemm.f32.max_efficiency:0.1:1",
                        "--param", "links.intra_node.*.beta_bytes_s:1e8:1e11"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        fail(f"fit_machine.py failed: {p.stderr}")
    with open(fitted_path) as f:
        got = json.load(f)
    eff = got["device"]["gemm"]["f32"]["max_efficiency"]
    betas = {c["beta_bytes_s"] for c in got["links"]["intra_node"].values()}
    if abs(eff / 0.55 - 1) > 0.02:
        fail(f"max_efficiency {eff}, expected 0.55\n{p.stdout}")
    if len(betas) != 1 or abs(betas.pop() / 4e9 - 1) > 0.02:
        fail(f"intra-node beta {got['links']['intra_node']}, expected 4e9\n{p.stdout}")
    # everything else as it was
    got["device"]["gemm"]["f32"]["max_efficiency"] = m["device"]["gemm"]["f32"]["max_efficiency"]
    for k, c in got["links"]["intra_node"].items():
        c["beta_bytes_s"] = m["links"]["intra_node"][k]["beta_bytes_s"]
    if got != m:
        fail("figures other than the fitted ones changed")
    # no point within one node: nothing may be fitted
    study["points"] = points[2:]
    with open(path, "w") as f:
        json.dump(study, f)
    p = subprocess.run([sys.executable, fit, "--machine", machine, "--out", fitted_path,
                        "--study", path, "--scaling-study", exe,
                        "--param", "device.gemm.f32.max_efficiency"],
                       capture_output=True, text=True)
    if p.returncode == 0 or "no point with a paper's figures within one node" not in p.stderr:
        fail(f"a study without a single-node row: exit {p.returncode}, {p.stderr!r}")
    print(f"fit_machine recovers max_efficiency {eff:.4f} and the intra-node beta from the "
          f"single-node rows only")


if __name__ == "__main__":
    main()
