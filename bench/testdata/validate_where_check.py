#!/usr/bin/env python3
"""scripts/validate_summary.py --where on a made-up record whose answers are
known: two schemes at 2 ranks, each measured in two repetitions (the second
20 % slower), so the repetitions' biases, the wait beyond the predicted
exposed communication (as a share of the measured rest of the step) and the
compute error of each scheme's median run are fixed numbers."""
import json
import os
import subprocess
import sys

script, work = sys.argv[1:3]
os.makedirs(work, exist_ok=True)
path = os.path.join(work, "where.jsonl")


def line(scheme, median, wait, predicted, exposed):
    return {"bench": "compare_schemes", "scheme": scheme, "ranks": 2, "skipped": None,
            "median_s": median, "comm_wait_s": wait, "predicted_step_s": predicted,
            "predicted_exposed_comm_s": exposed}


rows = [
    # repetition 1: predicted exactly
    line("a", 1.00, 0.20, 1.00, 0.10), line("b", 2.00, 0.00, 2.00, 0.00),
    # repetition 2: every step 20 % slower, its wait too
    line("a", 1.20, 0.24, 1.00, 0.10), line("b", 2.40, 0.00, 2.00, 0.00),
]
with open(path, "w", encoding="utf-8") as fh:
    fh.write(json.dumps({"record": "bench", "signature": "TEST-sig", "cpu": "test", "date": "d",
                         "commit": "c"}) + "\n")
    fh.write(json.dumps({"record_run": "small-np2"}) + "\n")
    for r in rows:
        fh.write(json.dumps(r) + "\n")
out = subprocess.run([sys.executable, script, "--where", path], capture_output=True, text=True,
                     check=True).stdout
print(out)
# repetition 1 bias 0; repetition 2: (1.0/1.2 - 1 + 2.0/2.4 - 1) / 2 = -16.7 %.
# The median run of each scheme (of two: the slower) is repetition 2's:
# a: wait beyond (0.24 - 0.10) / (1.20 - 0.24) = +14.6 %, compute (0.90 / 0.96 - 1) = -6.25 %;
# b: wait beyond 0, compute 2.0 / 2.4 - 1 = -16.7 %. Of two values p10 and
# the median take the larger index's rule: sorted[int(f * 2)].
want = "| `where.jsonl` (TEST-sig) | 2 | 2 | +0 %, -17 % | +0 / +15 / +15 | -17 / -6 / -6 |"
if want not in out:
    sys.exit(f"validate_where_check: expected the row\n{want}")
print("validate_where_check: ok")
