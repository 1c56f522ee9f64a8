#!/usr/bin/env python3
"""compare_schemes --pass plan against --pass train on one configuration:
every scheme's bytes sent per axis, memory per rank and largest batch must
be the ones the real steps measure (exit 1 naming the first difference);
and a real step's collective calls per axis (calls_per_rank) are counted
wherever it moved bytes (a group of one rank makes calls that move none).

    plan_equals_train.py MPIEXEC NP COMPARE_SCHEMES [model flags...]
"""
import json
import subprocess
import sys

mpiexec, np, tool, flags = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]


def run(*extra):
    out = subprocess.run([mpiexec, "-np", np, tool, *flags, "--format", "json", *extra],
                         check=True, capture_output=True, text=True).stdout
    return {j["scheme"]: j for j in map(json.loads, (l for l in out.split("\n") if l.startswith("{")))}


plan = run("--pass", "plan")
train = run("--pass", "train", "--reps", "1", "--warmup", "0")
ran = {s: j for s, j in train.items() if not j.get("skipped")}
if not ran or set(plan) != set(ran):
    sys.exit(f"schemes differ: plan {sorted(plan)} train {sorted(ran)}")
for scheme, p in plan.items():
    t = ran[scheme]
    m = t["memory_bytes_per_rank"]
    pairs = [("largest_batch", p["largest_batch"], t["largest_batch"]),
             ("total", p["total_bytes"], m["total_capacity"]),
             ("parameters", p["parameters_bytes"], m["parameters"]),
             ("activations", p["activations_bytes"], m["activations"])]
    pairs += [(f"sent {a}", p[f"sent_bytes_{a}"], t["bytes_sent_per_rank"][a])
              for a in t["bytes_sent_per_rank"]]
    for name, a, b in pairs:
        if a != b:
            sys.exit(f"{scheme}: {name} planned {a}, measured {b}")
    for a, sent in t["bytes_sent_per_rank"].items():
        calls = t["calls_per_rank"][a]
        if sent > 0 and calls == 0:
            sys.exit(f"{scheme}: axis {a} sent {sent} bytes in {calls} calls")
print(f"plan_equals_train: {len(plan)} schemes, every figure equal")
