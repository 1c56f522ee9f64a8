#!/usr/bin/env python3
"""scaling_study's optimizer offload (--offload-bucket, a study file's
"offload_bucket") reaches the memory plan and the step's price.

A whole-step bf16 study of a 1.3 B-parameter GPT under fixed schemes (plain
data parallelism and zero=1) on MACHINE_FILE, and a copy of that file with
a 1 GB/s host link:
  - offloaded, the memory per GPU is below the plain plan's, and two bucket
    sizes differ by exactly their staging buffers (2 buckets x 3 fp32
    buffers: 24 bytes per bucket element);
  - the study file's "offload_bucket" gives what the flag gives, and the
    flag overrides it (0: not offloaded);
  - the offloaded step is slower than the plain one, more so over the slow
    host link; the table's header says the optimizer is offloaded.

usage: offload_check.py SCALING_STUDY MACHINE_FILE WORKDIR
"""
import json
import os
import subprocess
import sys


def run(exe, machine, *args):
    out = subprocess.run([exe, *args, "--predict", machine, "--json"], check=True,
                         capture_output=True, text=True).stdout
    return {p["scheme"]: p for p in (json.loads(l) for l in out.splitlines()
                                     if l.startswith("{"))}


def main():
    exe, machine, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    points = [{"gpus": 8, "scheme": s, "batch": 16, "seq": 512, "layers": 24, "hidden": 2048,
               "heads": 16, "vocab": 50304} for s in ("data=2,1d:p=4", "data=2:zero=1,1d:p=4")]
    study = {"name": "offload", "kind": "weak", "stem_only": False, "dtype": "bf16",
             "points": points}
    path = os.path.join(work, "study.json")
    with open(path, "w") as f:
        json.dump(study, f)
    with open(machine) as f:
        slow = json.load(f)
    slow["device"]["host_bandwidth"] = 1e9
    slow_path = os.path.join(work, "slow-link.json")
    with open(slow_path, "w") as f:
        json.dump(slow, f)

    a, b = 1 << 20, 1 << 22
    plain = run(exe, machine, "--study", path)
    small = run(exe, machine, "--study", path, "--offload-bucket", str(a))
    large = run(exe, machine, "--study", path, "--offload-bucket", str(b))
    slow_plain = run(exe, slow_path, "--study", path)
    slow_small = run(exe, slow_path, "--study", path, "--offload-bucket", str(a))
    study["offload_bucket"] = a
    keyed_path = os.path.join(work, "study-keyed.json")
    with open(keyed_path, "w") as f:
        json.dump(study, f)
    keyed = run(exe, machine, "--study", keyed_path)
    overridden = run(exe, machine, "--study", keyed_path, "--offload-bucket", "0")
    for scheme, p in plain.items():
        mem = p["memory_per_gpu_bytes"]
        assert small[scheme]["memory_per_gpu_bytes"] < mem, (scheme, small[scheme], mem)
        diff = large[scheme]["memory_per_gpu_bytes"] - small[scheme]["memory_per_gpu_bytes"]
        assert diff == 24 * (b - a), (scheme, diff, 24 * (b - a))
        assert keyed[scheme] == small[scheme], (scheme, keyed[scheme], small[scheme])
        assert overridden[scheme] == p, (scheme, overridden[scheme], p)
        step, off = p["predicted_step_s"], small[scheme]["predicted_step_s"]
        slow_gap = slow_small[scheme]["predicted_step_s"] - slow_plain[scheme]["predicted_step_s"]
        assert off >= step, (scheme, off, step)
        assert slow_gap > off - step and slow_gap > 0, (scheme, slow_gap, off - step)
    header = subprocess.run([exe, "--study", path, "--predict", machine, "--offload-bucket",
                             str(a)], check=True, capture_output=True, text=True).stdout
    assert f"optimizer offloaded, buckets of {a}" in header, header
    print(f"offload reaches the plan and the price for {len(plain)} schemes")


if __name__ == "__main__":
    main()
