#!/usr/bin/env python3
"""block_vs_torch: one GPT-2 block, summa (gpt_layer) against PyTorch eager, side by side.

On the CPU (issue 25's acceptance: the block's forward + backward at least as
fast as PyTorch eager with one thread): for every shape, --rounds rounds, each
running `gpt_layer --what block` and then `torch_block.py` (explicit
attention, the same block; bench/README.md, "GPU", says what each times) with
--reps timed steps; the two run back to back in every round so that both see
the same machine conditions. Each round gives a median per side; the line
reports the median over rounds and torch/summa (> 1: summa faster).

    bench/block_vs_torch.py --gpt-layer build-bench/bench/gpt_layer \\
        --shapes 512,8,128,8 128,4,64,16 --rounds 3 --reps 7

One JSON object per shape and pass ("fwd", "fwd_bwd"), for
scripts/bench_record.py; exit status 0, 1 when a run fails, 77 when PyTorch
is missing (CTest's skip code).
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def json_lines(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.stderr.write(out.stderr)
        sys.exit(f"block_vs_torch: {' '.join(cmd)} exited {out.returncode}")
    return [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")], out.stderr


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpt-layer", required=True, help="path of bench/gpt_layer")
    p.add_argument("--python", default=sys.executable, help="the Python with torch")
    p.add_argument("--shapes", nargs="+", default=["512,8,128,8", "128,4,64,16"],
                   help="hidden,heads,seq,batch per shape")
    p.add_argument("--dtype", default="f32", choices=["f32", "f64"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="threads of each side")
    p.add_argument("--cpu-gemm", default=None, help="gpt_layer's --cpu-gemm")
    args = p.parse_args()

    probe = subprocess.run([args.python, "-c", "import torch; print(torch.__version__)"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        print(f"block_vs_torch: no PyTorch in {args.python}: skipped", file=sys.stderr)
        sys.exit(77)
    torch_version = probe.stdout.strip()

    for shape in args.shapes:
        try:
            hidden, heads, seq, batch = (int(x) for x in shape.split(","))
        except ValueError:
            sys.exit(f"block_vs_torch: shape '{shape}' is not hidden,heads,seq,batch")
        common = ["--hidden", str(hidden), "--heads", str(heads), "--seq", str(seq),
                  "--batch", str(batch), "--reps", str(args.reps), "--warmup", str(args.warmup)]
        summa_cmd = [args.gpt_layer, "--what", "block", "--dtype", args.dtype,
                     "--threads", str(args.threads)] + common
        if args.cpu_gemm:
            summa_cmd += ["--cpu-gemm", args.cpu_gemm]
        torch_cmd = [args.python, os.path.join(HERE, "torch_block.py"), "--device", "cpu",
                     "--dtype", args.dtype, "--threads", str(args.threads)] + common
        times = {}  # pass -> {"summa": [...], "torch": [...]}
        backend = "unknown"
        for _ in range(args.rounds):
            for side, cmd in (("summa", summa_cmd), ("torch", torch_cmd)):
                lines, err = json_lines(cmd)
                m = re.search(r"backend (\S+) on", err)
                if side == "summa" and m:
                    backend = m.group(1)  # gpt_layer's banner: cpu-<GEMM library>
                for l in lines:
                    if l.get("what", "block") == "block" and "pass" in l:
                        times.setdefault(l["pass"], {"summa": [], "torch": []})[side].append(
                            l["median_s"])
        for pass_, t in times.items():
            s, q = statistics.median(t["summa"]), statistics.median(t["torch"])
            print(json.dumps({
                "bench": "block_vs_torch", "pass": pass_, "dtype": args.dtype,
                "hidden": hidden, "heads": heads, "seq": seq, "batch": batch,
                "threads": args.threads, "rounds": args.rounds, "reps": args.reps,
                "summa_backend": backend, "torch_version": torch_version,
                "summa_s": s, "torch_s": q, "torch_over_summa": q / s,
                "summa_rounds_s": t["summa"], "torch_rounds_s": t["torch"],
            }), flush=True)


if __name__ == "__main__":
    main()
