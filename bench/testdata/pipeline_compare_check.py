#!/usr/bin/env python3
"""compare_schemes runs pipelined schemes beside the others (docs/pipeline.md):

    pipeline_compare_check.py MPIEXEC NP COMPARE_SCHEMES MACHINE PLOT_SCRIPT WORKDIR

At NP ranks, 1D over every rank, a data axis, and a 2-stage pipeline under
each schedule (axonn, gpipe, 1f1b) over 1D groups of NP/2, --predict MACHINE
and --timeline:
  - every scheme ran, with a finite loss and the same loss for every
    pipeline (the same batch and weights, flushed);
  - every rank's bytes on every axis equal the traffic model (pipelines:
    the stage messages on the pipe axis too), and each pipeline carries its
    predicted step (predict_pipeline_step_time);
  - the timeline holds every rank's 2M operations of each pipeline, each
    microbatch forward then backward, backwards in microbatch order, the
    spans of one rank not overlapping; GPipe's first stage runs all its
    forwards before any backward, 1F1B's at most P of them;
  - scripts/plot_pipeline.py draws it and prints each stage's idle share.
"""
import json
import os
import subprocess
import sys

mpiexec, np, tool, machine, plot, work = sys.argv[1:7]
os.makedirs(work, exist_ok=True)
timeline = os.path.join(work, "timeline.jsonl")
half = int(np) // 2
pipes = [f"pipe=2:micro=4{s},1d:p={half}" for s in ("", ":schedule=gpipe", ":schedule=1f1b")]
schemes = [f"1d:p={np}", f"data=2,1d:p={half}"] + pipes
out = subprocess.run([mpiexec, "-np", np, tool, "--layers", "2", "--hidden", "32", "--heads", "8",
                      "--seq", "8", "--batch", "8", "--vocab", "64", "--reps", "1", "--warmup", "1",
                      "--budget-mib", "1", "--max-batch", "64", "--format", "json",
                      "--predict", machine, "--timeline", timeline, "--schemes", ";".join(schemes)],
                     capture_output=True, text=True)
if out.returncode != 0:
    sys.exit(f"compare_schemes exited {out.returncode}:\n{out.stdout}\n{out.stderr}")
got = {j["scheme"]: j for j in map(json.loads, (l for l in out.stdout.splitlines()
                                                  if l.startswith("{")))}
assert set(got) == set(schemes), sorted(got)
losses = set()
for scheme, j in got.items():
    assert not j["skipped"] and j["finite"], (scheme, j.get("skipped"))
    assert j["prediction_matches"] is True, (scheme, "bytes differ from the traffic model")
    assert j["predicted_step_s"] > 0, scheme
    if scheme in pipes:
        assert j["pipe_bytes_sent_per_rank"] > 0 and j["stages"] == 2 and j["micro"] == 4, j
        losses.add(round(j["loss"], 5))
assert len(losses) == 1, losses

ops = {}
with open(timeline, encoding="utf-8") as f:
    for line in f:
        r = json.loads(line)
        ops.setdefault((r["scheme"], r["rank"]), []).append(r)
for scheme in pipes:
    for rank in range(int(np)):
        mine = ops[(scheme, rank)]
        assert len(mine) == 8, (scheme, rank, len(mine))
        seen, backwards, end = set(), [], 0.0
        for r in mine:
            assert r["start_s"] >= end and r["end_s"] >= r["start_s"], (scheme, rank, r)
            end = r["end_s"]
            if r["forward"]:
                seen.add(r["microbatch"])
            else:
                assert r["microbatch"] in seen, (scheme, rank, r)
                backwards.append(r["microbatch"])
        assert backwards == [0, 1, 2, 3], (scheme, rank, backwards)
        if r["stage"] == 0:
            first_backward = next(i for i, x in enumerate(mine) if not x["forward"])
            if "gpipe" in scheme:
                assert first_backward == 4, (scheme, first_backward)
            if "1f1b" in scheme:
                assert first_backward <= 2, (scheme, first_backward)

png = os.path.join(work, "timeline.png")
summary = subprocess.run([sys.executable, plot, timeline, "-o", png, "--summary"], check=True,
                         capture_output=True, text=True).stdout
assert os.path.getsize(png) > 0 and summary.count("| `pipe=") == 6, summary
print(f"pipeline_compare_check: {len(schemes)} schemes at {np} ranks, bytes equal the model, "
      f"timelines of {len(pipes)} schedules drawn")
