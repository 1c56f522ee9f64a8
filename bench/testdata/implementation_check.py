#!/usr/bin/env python3
"""scaling_study's implementation profiles ("implementation" in a study file,
per study and per point; the Optimus presets' megatron-2021 and
optimus-2021 rows) reach the prediction, and the held-out table is printed.

On MACHINE_FILE (frontera-rtx.json):
  - a study of 1D and 2D points priced three ways (summa, the study's
    profile, a point's own) gives each point the profile it names in the
    JSON; a 2021 profile's step differs from this library's
    implementation of the same text, and its summa_step_s is that
    implementation's step (the summa study's predicted step);
  - megatron-2021 prices 1D with Megatron's distributed checkpoints
    (priced_scheme "...,dc=on"), planned with them: less memory than plain
    1D's plan;
  - an implementation of another scheme, an unknown name and "auto" under
    a profile are refused, naming what was given;
  - the optimus-weak preset prices its 1D rows as megatron-2021 and its 2D
    rows as optimus-2021, and prints the held-out table (the 4-GPU rows
    "fit", the others "held-out") with its summary lines.

usage: implementation_check.py SCALING_STUDY MACHINE_FILE WORKDIR
"""
import json
import os
import subprocess
import sys


def run(exe, machine, *args, check=True):
    p = subprocess.run([exe, *args, "--predict", machine], capture_output=True, text=True)
    if check and p.returncode != 0:
        sys.exit(f"implementation_check: {' '.join(args)} failed: {p.stderr}")
    return p


def points(exe, machine, path):
    out = run(exe, machine, "--study", path, "--json").stdout
    return [json.loads(l) for l in out.splitlines() if l.startswith("{")]


def write(work, name, study):
    path = os.path.join(work, name)
    with open(path, "w") as f:
        json.dump(study, f)
    return path


def fail(msg):
    sys.exit(f"implementation_check: FAIL: {msg}")


def main():
    exe, machine, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    base = [{"gpus": 16, "scheme": "1d:p=16", "batch": 32, "seq": 512, "layers": 4,
             "hidden": 2048, "heads": 32},
            {"gpus": 16, "scheme": "2d:q=4", "batch": 32, "seq": 512, "layers": 4,
             "hidden": 2048, "heads": 32}]
    ours = points(exe, machine, write(work, "summa.json", {"name": "s", "points": base}))
    if [p["implementation"] for p in ours] != ["summa", "summa"]:
        fail(f"default implementation {[p['implementation'] for p in ours]}")
    if any("summa_step_s" in p for p in ours):
        fail("a summa point carries summa_step_s")
    # the study's profile on the 1D point, a point's own on the 2D point
    mixed = [dict(base[0]), dict(base[1], implementation="optimus-2021")]
    theirs = points(exe, machine, write(work, "profiles.json", {
        "name": "p", "implementation": "megatron-2021", "points": mixed}))
    if [p["implementation"] for p in theirs] != ["megatron-2021", "optimus-2021"]:
        fail(f"profiles {[p['implementation'] for p in theirs]}")
    for a, b in zip(ours, theirs):
        if abs(b["predicted_step_s"] / a["predicted_step_s"] - 1) < 1e-3:
            fail(f"{b['scheme']}: {b['implementation']} is priced as summa "
                 f"({b['predicted_step_s']} s)")
        if abs(b["summa_step_s"] - a["predicted_step_s"]) > 1e-12 * a["predicted_step_s"]:
            fail(f"{b['scheme']}: summa_step_s {b['summa_step_s']} is not summa's step "
                 f"{a['predicted_step_s']}")
    if theirs[0].get("priced_scheme") != "1d:p=16,dc=on":
        fail(f"megatron-2021 priced {theirs[0].get('priced_scheme')}")
    if theirs[1].get("priced_scheme") != "2d:q=4,panel=0,overlap=off":
        fail(f"optimus-2021 priced {theirs[1].get('priced_scheme')}")
    if not theirs[0]["memory_per_gpu_bytes"] < ours[0]["memory_per_gpu_bytes"]:
        fail("megatron-2021's plan does not keep distributed checkpoints")
    # refusals, naming what was given
    refusals = [
        ({"name": "r", "implementation": "optimus-2021", "points": [base[0]]},
         "implementation 'optimus-2021' prices 2d schemes"),
        ({"name": "r", "implementation": "megatron", "points": [base[0]]},
         "implementation 'megatron' is not summa, optimus-2021, megatron-2021 or axonn"),
        ({"name": "r", "points": [dict(base[0], implementation=3)]},
         "point 0: implementation is 3, not a string"),
        ({"name": "r", "points": [dict(base[0], scheme="auto", implementation="axonn")]},
         "implementation 'axonn' prices one system's: give the point a scheme"),
    ]
    for k, (study, want) in enumerate(refusals):
        p = run(exe, machine, "--study", write(work, f"bad{k}.json", study), check=False)
        if p.returncode == 0 or want not in p.stderr:
            fail(f"refusal {k}: exit {p.returncode}, stderr {p.stderr!r}, wanted {want!r}")
    # the preset: its profiles and the held-out table
    preset = run(exe, machine, "--preset", "optimus-weak", "--json").stdout
    rows = [json.loads(l) for l in preset.splitlines() if l.startswith("{")]
    for p in rows:
        want = "megatron-2021" if p["scheme"].startswith("1d") else "optimus-2021"
        role = "fit" if p["gpus"] <= 4 else "held-out"
        if p["implementation"] != want or p["validation_role"] != role:
            fail(f"preset row {p['gpus']} {p['scheme']}: {p['implementation']}, "
                 f"{p['validation_role']}")
        step = p["predicted_step_s"] / p["batch"]
        paper = p["paper_fwd_per_sample_s"] + p["paper_bwd_per_sample_s"]
        if abs(p["step_error"] - (step - paper) / paper) > 1e-9:
            fail(f"step_error {p['step_error']}")
    table = run(exe, machine, "--preset", "optimus-weak").stdout
    for want in ("# held-out validation", "held-out rows: 6;", "on the paper's side of 1 at",
                 "megatron-2021", "summa/smp"):
        if want not in table:
            fail(f"the table has no {want!r}:\n{table}")
    print(f"implementation profiles reach the prediction: {len(rows)} preset rows, "
          f"{len(refusals)} refusals")


if __name__ == "__main__":
    main()
