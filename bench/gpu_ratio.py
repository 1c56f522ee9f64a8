#!/usr/bin/env python3
"""gpu_ratio: the issue-6 GPU acceptance tables from the benchmarks' JSON lines.

Reads any number of files holding JSON lines from bench/summa_gemm
(--backend cuda), bench/gpt_layer (--backend cuda) and bench/torch_block.py
(other lines, e.g. mpirun's or CMake's, are ignored) and prints

  1. GEMM: summa's time against the plain cublasGemmEx of the same run
     (`vs_cublas` = cuBLAS seconds / summa seconds, so 1.0 = as fast as
     cuBLAS); at q = 1 each timing line is PASS when vs_cublas >= --threshold
     (0.85, issue 6), FAIL otherwise; a --check line (a small product run
     twice to prove the result) is judged by its check alone;
  2. block: gpt_layer's block (summa) against torch_block.py (PyTorch eager)
     for the same pass, dtype, hidden, heads, seq, batch and TF32 setting;
     `torch/summa` = PyTorch's median / summa's median (> 1: summa faster),
     one column per PyTorch attention variant found (explicit, sdpa).

    python3 bench/gpu_ratio.py gpu_verify_out/*.jsonl [--markdown] [--threshold 0.85]

Exit status: 0; 1 when a q = 1 GEMM line is below the threshold or a summa
line has no finite time; 2 when no input line was usable.
"""

import argparse
import json
import math
import sys


def read_lines(paths):
    rows = []
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                for raw in f:
                    raw = raw.strip()
                    if raw.startswith("json: "):
                        raw = raw[len("json: "):]
                    if not raw.startswith("{"):
                        continue
                    try:
                        row = json.loads(raw)
                    except json.JSONDecodeError:
                        continue
                    if isinstance(row, dict):
                        row["_file"] = path
                        rows.append(row)
        except OSError as e:
            print(f"gpu_ratio: cannot read {path}: {e}", file=sys.stderr)
    return rows


def num(x):
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def fmt(x, spec=".3f", scale=1.0):
    x = num(x)
    return "-" if x is None else format(x * scale, spec)


def table(headers, rows, markdown):
    if markdown:
        out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
        return "\n".join(out)
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(str(c).rjust(w) for c, w in zip(cells, widths))
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


def gemm_table(rows, threshold, markdown):
    gemm = [r for r in rows if "op" in r and r.get("backend") == "cuda"]
    failed = []
    out_rows = []
    for r in gemm:
        ratio = num(r.get("vs_cublas"))
        verdict = "-"
        if "check_ok" in r:
            # A --check run (two repetitions of a small, odd-sized product)
            # proves the result, not the speed: judged by its check alone.
            verdict = "check ok" if r.get("check_ok") else "CHECK FAILED"
            if not r.get("check_ok"):
                failed.append(r)
        elif r.get("q") == 1 and "cublas_seconds" in r:
            verdict = "PASS" if ratio is not None and ratio >= threshold else "FAIL"
            if verdict == "FAIL":
                failed.append(r)
        if num(r.get("seconds")) is None:
            failed.append(r)
        tflops = lambda s: (2.0 * r["m"] * r["n"] * r["k"] / s * 1e-12) if num(s) else None
        out_rows.append([
            r.get("op"), r.get("dtype"), f'{r.get("m")}x{r.get("n")}x{r.get("k")}', r.get("q"),
            r.get("ranks"), r.get("comm", "-"), r.get("panel"), "on" if r.get("tf32") else "off",
            fmt(r.get("seconds"), ".3f", 1e3), fmt(tflops(r.get("seconds")), ".1f"),
            fmt(r.get("cublas_seconds"), ".3f", 1e3), fmt(tflops(r.get("cublas_seconds")), ".1f"),
            fmt(ratio, ".3f"), fmt(r.get("vs_cublas_events"), ".3f"),
            fmt(r.get("cublas_max_rel_diff"), ".1e"), verdict,
        ])
    headers = ["op", "dtype", "m x n x k", "q", "ranks", "comm", "panel", "tf32", "summa ms",
               "summa TF/s", "cuBLAS ms", "cuBLAS TF/s", "vs_cublas", "vs_cublas (events)",
               "max rel diff", f">= {threshold}"]
    return (table(headers, out_rows, markdown) if out_rows else None), failed, len(out_rows)


def block_key(r):
    return (r.get("pass"), r.get("dtype"), r.get("hidden"), r.get("heads"), r.get("seq"),
            r.get("batch"), bool(r.get("tf32", False)))


def block_table(rows, markdown):
    summa = [r for r in rows if r.get("bench") == "gpt_layer" and r.get("what") == "block"
             and r.get("backend") == "cuda"]
    torch_rows = [r for r in rows if r.get("bench") == "torch_block"]
    torch_by = {}
    for r in torch_rows:
        variant = "sdpa" if r.get("sdpa") else "explicit"
        torch_by[(block_key(r), variant)] = r
    variants = sorted({v for (_, v) in torch_by})
    failed = [r for r in summa if num(r.get("median_s")) is None or not r.get("finite", True)]
    out_rows = []
    for r in summa:
        k = block_key(r)
        cells = [r.get("pass"), r.get("dtype"), r.get("hidden"), r.get("heads"), r.get("seq"),
                 r.get("batch"), "on" if k[-1] else "off", r.get("q"),
                 fmt(r.get("median_s"), ".3f", 1e3),
                 fmt(r.get("model_flops_per_s"), ".1f", 1e-12)]
        for v in variants:
            t = torch_by.get((k, v))
            ratio = (t["median_s"] / r["median_s"]
                     if t and num(t.get("median_s")) and num(r.get("median_s")) else None)
            cells += [fmt(t.get("median_s") if t else None, ".3f", 1e3), fmt(ratio, ".2f")]
        out_rows.append(cells)
    headers = ["pass", "dtype", "hidden", "heads", "seq", "batch", "tf32", "q", "summa ms",
               "summa TF/s"]
    for v in variants:
        headers += [f"torch {v} ms", f"torch {v}/summa"]
    unmatched = [r for r in torch_rows
                 if not any(block_key(r) == block_key(s) for s in summa)]
    return (table(headers, out_rows, markdown) if out_rows else None), failed, unmatched, len(out_rows)


def optimizer_table(rows, markdown):
    """gpt_layer --what optimizer lines: AdamW on the device and offloaded."""
    mine = [r for r in rows if r.get("bench") == "gpt_layer" and r.get("what") == "optimizer"]
    out_rows = [[r.get("dtype"), r.get("backend"), r.get("elements_per_rank"),
                 r.get("offload_bucket"), fmt(r.get("median_s"), ".2f", 1e3),
                 fmt(r.get("offload_median_s"), ".2f", 1e3),
                 fmt(r.get("offload_vs_on_backend"), ".2f"),
                 fmt(r.get("offload_copy_bytes_per_s"), ".1f", 1e-9),
                 fmt(r.get("state_bytes_per_rank"), ".1f", 1 / 2**20),
                 fmt(r.get("offload_staging_bytes_per_rank"), ".1f", 1 / 2**20)] for r in mine]
    headers = ["dtype", "backend", "elements", "bucket", "on device ms", "offloaded ms",
               "offloaded/on device", "host link GB/s", "state MiB", "staging MiB"]
    failed = [r for r in mine if not r.get("finite", True)]
    return (table(headers, out_rows, markdown) if out_rows else None), failed


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", help="files of JSON lines")
    p.add_argument("--threshold", type=float, default=0.85,
                   help="least vs_cublas at q = 1 (issue 6: 0.85)")
    p.add_argument("--markdown", action="store_true", help="Markdown tables")
    args = p.parse_args()

    rows = read_lines(args.files)
    gemm_text, gemm_failed, n_gemm = gemm_table(rows, args.threshold, args.markdown)
    block_text, block_failed, unmatched, n_block = block_table(rows, args.markdown)
    optimizer_text, optimizer_failed = optimizer_table(rows, args.markdown)
    if n_gemm == 0 and n_block == 0 and not optimizer_text:
        print("gpu_ratio: no usable cuda lines of summa_gemm or gpt_layer in "
              + ", ".join(args.files), file=sys.stderr)
        return 2
    if gemm_text:
        print(f"GEMM on one GPU: summa vs plain cublasGemmEx (acceptance: vs_cublas >= "
              f"{args.threshold} at q = 1)\n")
        print(gemm_text + "\n")
    if block_text:
        print("GPT block forward(+backward): summa (gpt_layer --backend cuda) vs PyTorch eager "
              "(torch_block.py); torch/summa > 1 means summa is faster\n")
        print(block_text + "\n")
    if unmatched:
        print(f"({len(unmatched)} torch_block line(s) without a matching gpt_layer line)\n")
    if optimizer_text:
        print("AdamW step (gpt_layer --what optimizer): the state on the device against offloaded "
              "to pinned host memory (--offload-bucket), paired\n")
        print(optimizer_text + "\n")
    block_failed = block_failed + optimizer_failed
    if gemm_failed or block_failed:
        print(f"gpu_ratio: {len(gemm_failed)} GEMM line(s) below {args.threshold} of cuBLAS at "
              f"q = 1 or without a time; {len(block_failed)} block line(s) without a finite "
              "result", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
