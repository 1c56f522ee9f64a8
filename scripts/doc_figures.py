#!/usr/bin/env python3
"""The figures the docs quote, regenerated (scripts/doc_check.py compares
them with the docs; --update writes them in).

    scripts/doc_figures.py include FILE [LANG]   FILE as a fenced block
    scripts/doc_figures.py demo LOG              the demo's summary and generated text
    scripts/doc_figures.py training LOG          gpt_train's validation losses and summary
    scripts/doc_figures.py memory-scaling        docs/memory.md's activations at q = 1, 2, 3
    scripts/doc_figures.py memory-report         docs/memory.md's report of rank 0 at q = 2
    scripts/doc_figures.py optimus weak|strong   docs/scaling.md's Optimus Table 2 / 3 prediction
    scripts/doc_figures.py axonn                 docs/scaling.md's AxoNN Table III prediction
    scripts/doc_figures.py gpu RECORD WHAT       a GPU record's tables (bench/records/*.jsonl,
                                                 scripts/gpu_verify.sh's results.jsonl with a
                                                 provenance line first); WHAT: source, gemm,
                                                 check, q2, block
    scripts/doc_figures.py bench RECORD source   a CPU record's provenance (scripts/bench_record.py)
    scripts/doc_figures.py bench RECORD gemm N   the GEMM table of its N-th run (summa_gemm lines)
    scripts/doc_figures.py bench RECORD libraries N   its N-th run's CPU GEMM libraries side by side (summa_gemm --compare-libraries)
    scripts/doc_figures.py bench RECORD breakdown N   its N-th run's compare_schemes --breakdown
    scripts/doc_figures.py bench RECORD guard    summa_gemm --guard-overhead lines of every run
    scripts/doc_figures.py bench RECORD layer    gpt_layer lines of every run
    scripts/doc_figures.py bench RECORD steps N  compare_schemes step times of its N-th run
    scripts/doc_figures.py bench RECORD inference N  compare_schemes --pass inference times

LOG is the output of scripts/quickstart.sh demo. Timings of this machine
are left out: they are measurements of one machine at one moment, not
figures a doc can keep. Measurements a doc does quote come from a record
file committed beside the benchmarks (bench/records/), rendered here, so
every such figure traces to one run with its machine, date and command.
"""
import re
import subprocess
import sys

# docs/memory.md's model: layers hidden heads seq batch vocab
MEMORY_MODEL = ["4", "192", "6", "128", "6", "2304"]


def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read().split("\n")


def include(path, lang=""):
    text = "\n".join(read(path)).rstrip("\n")
    print(f"```{lang}\n{text}\n```")


def generated(lines):
    """gpt_generate's output of the demo: from the first '--- ' header to
    the rates line."""
    out, on = [], False
    for line in lines:
        if line.startswith("gpt_generate: prefill"):
            break
        if line.startswith("--- "):
            on = True
        if on:
            out.append(line)
    return out


def demo(log):
    lines = read(log)
    summary = [l for l in lines if l.startswith("validation loss: ")]
    if not summary:
        sys.exit(f"doc_figures: {log} has no 'validation loss:' summary line")
    model = next((l for l in lines if l.startswith("gpt_train: GPT-2")), None)
    head = next((l for l in lines if l.startswith("gpt_generate: GPT-2")), None)
    if model is None or head is None:
        sys.exit(f"doc_figures: {log} has no gpt_train or gpt_generate header")
    print("```")
    print(re.sub(r"^gpt_train: ", "", model.split(" | ")[0]))
    print(summary[-1])
    print(re.sub(r"^gpt_generate: ", "", head))
    print("\n".join(generated(lines)))
    print("```")


def training(log):
    lines = read(log)
    keep = [l for l in lines
            if re.match(r"^(before training|at step \d+|after training), step \d+: validation loss", l)
            or l.startswith("training loss: ") or l.startswith("validation loss: ")]
    if not keep:
        sys.exit(f"doc_figures: {log} has no validation losses")
    print("```")
    print("\n".join(keep))
    print("```")


def gpt_memory(ranks, checkpoint):
    """build/examples/gpt_memory's output on `ranks` ranks."""
    return subprocess.run(["mpirun", "-np", str(ranks), "build/examples/gpt_memory", *MEMORY_MODEL,
                           "full" if checkpoint else "none"], check=True, capture_output=True,
                          text=True).stdout.split("\n")


def max_activations(lines):
    for l in lines:
        m = re.match(r"max activations per rank: (\d+) B; serial reference keeps (\d+) B", l)
        if m:
            return int(m.group(1)), int(m.group(2))
    sys.exit("doc_figures: gpt_memory printed no 'max activations per rank'")


def spaced(n):
    return f"{n:,}".replace(",", " ")


def memory_scaling():
    rows, serial = [], None
    base = {}
    for q in (1, 2, 3):
        cells = []
        for checkpoint in (True, False):
            act, serial = max_activations(gpt_memory(q * q, checkpoint))
            base.setdefault(checkpoint, act)
            ratio = "1" if q == 1 else f"{act / base[checkpoint]:.4f}"
            cells += [f"{spaced(act)} B", ratio]
        inverse = "1" if q == 1 else f"{1 / q**2:.4g}"
        rows.append(f"| {q} | {q * q} | " + " | ".join(cells) + f" | {inverse} |")
    print("| q | ranks | activations / rank, checkpointing on | ratio to q = 1 "
          "| activations / rank, off | ratio to q = 1 | 1/q² |")
    print("|---|---|--:|--:|--:|--:|--:|")
    print("\n".join(rows))
    print(f"\nThe serial reference (`summa::reference::Gpt`, which keeps every activation, "
          f"no\ncheckpointing) holds {spaced(serial)} B for this batch.")


def memory_report():
    lines = gpt_memory(4, True)
    start = next(i for i, l in enumerate(lines) if l.startswith("buffer "))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("total "))
    print("```text")
    print("\n".join(lines[start:end + 1]))
    print("```")


def scaling_study(*args):
    """build/bench/scaling_study's JSON lines."""
    import json
    out = subprocess.run(["build/bench/scaling_study", *args, "--json"], check=True,
                         capture_output=True, text=True).stdout
    return [json.loads(l) for l in out.split("\n") if l.startswith("{")]


def percent(pred, paper):
    e = round(100 * (pred - paper) / paper)
    return ("+" if e >= 0 else "\u2212") + f"{abs(e)} %"


def optimus(kind):
    points = scaling_study("--preset", f"optimus-{kind}", "--predict", "machines/frontera-rtx.json")
    print("| GPUs | scheme | priced as | row | fwd/sample | paper | err | bwd/sample | paper | err "
          "| step err | 2D/1D predicted | 2D/1D paper | GiB/gpu | summa fwd+bwd | summa speedup |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    paper_time = {(p["gpus"], p["scheme"][:2]): p["paper_fwd_per_sample_s"] +
                  p["paper_bwd_per_sample_s"] for p in points}
    for p in points:
        fwd, bwd = p["predicted_fwd_s"] / p["batch"], p["predicted_bwd_s"] / p["batch"]
        pf, pb = p["paper_fwd_per_sample_s"], p["paper_bwd_per_sample_s"]
        step = percent(fwd + bwd, pf + pb)
        ratio = paper = ""
        if p["scheme"].startswith("1d"):
            ratio = f"{p['speedup_2d_1d']:.2f}"
            paper = f"{paper_time[(p['gpus'], '1d')] / paper_time[(p['gpus'], '2d')]:.2f}"
        gib = p["memory_per_gpu_bytes"] / 2**30
        ours = p["summa_step_s"] / p["batch"]
        print(f"| {p['gpus']} | {p['scheme']} | {p['implementation']} | {p['validation_role']} | "
              f"{fwd:.4f} | {pf:.4f} | {percent(fwd, pf)} | {bwd:.4f} | {pb:.4f} | "
              f"{percent(bwd, pb)} | {step} | {ratio} | {paper} | "
              f"{gib:.1f}{'' if p['memory_fits'] else ' !'} | {ours:.4f} | "
              f"{(fwd + bwd) / ours:.2f}x |")


# AxoNN (Singh et al., SC'24) Table III: % of peak on Perlmutter, and the
# models of its Table II by GPU count (the paper's figures, cited).
AXONN_PAPER = {512: ("GPT-5B", "50.6 %"), 1024: ("GPT-10B", "61.9 %"),
               2048: ("GPT-20B", "55.2 %"), 4096: ("GPT-40B", "48.5 %")}


def axonn():
    points = scaling_study("--preset", "axonn-weak", "--predict", "machines/perlmutter.json")
    print("| GPUs | model | predicted best | next two | memory | predicted % of 312 TFLOP/s "
          "| paper (Table III) |")
    print("|---|---|---|---|---|---|---|")
    for p in points:
        model, paper = AXONN_PAPER.get(p["gpus"], ("?", "?"))
        top = p.get("top", [])
        nxt = ", ".join(f"{t['scheme']} ({t['predicted_step_s']:.3f})" for t in top[1:3])
        gib = p["memory_per_gpu_bytes"] / 2**30
        print(f"| {p['gpus']} | {model} | {p['scheme']} ({p['predicted_step_s']:.3f} s) | {nxt} | "
              f"{gib:.1f} GiB | {100 * p['tflops_per_gpu'] / 312:.1f} % | {paper} |")


def gpu_record(path, what):
    import importlib.util
    import json
    import os
    spec = importlib.util.spec_from_file_location(
        "gpu_ratio", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench",
                                  "gpu_ratio.py"))
    ratio = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ratio)
    rows = [json.loads(l) for l in read(path) if l.strip().startswith("{")]
    head = next((r for r in rows if r.get("record") == "gpu_verify"), None)
    if head is None:
        sys.exit(f"doc_figures: {path} has no provenance line (\"record\": \"gpu_verify\")")
    gemm = [r for r in rows if "op" in r and r.get("backend") == "cuda"]
    num = ratio.num

    def tflops(r, key):
        t = num(r.get(key))
        return f"{2.0 * r['m'] * r['n'] * r['k'] / t * 1e-12:.1f}" if t else "-"

    def three(x):
        x = num(x)
        return "-" if x is None else f"{x:.3f}"

    def size(r):
        return f"{r['m']}³" if r["m"] == r["n"] == r["k"] else f"{r['m']}×{r['n']}×{r['k']}"
    if what == "source":
        print(f"Record `{path}`: {head['date']}, commit `{head['commit']}`, {head['device']}, "
              f"driver {head['driver']}, CUDA {head['cuda']}, {head['compiler']}, {head['mpi']}, "
              f"PyTorch {head['torch']}, {head['os']}; `{head['command']}`.")
    elif what == "gemm":
        print("| op | dtype | m × n × k | TF32 | summa TFLOP/s | cuBLAS TFLOP/s | `vs_cublas` "
              "| by events | ≥ 0.85 |")
        print("|---|---|---|---|---:|---:|---:|---:|---|")
        for r in gemm:
            if r.get("q") != 1 or "check_ok" in r:
                continue
            v = num(r.get("vs_cublas"))
            verdict = "-" if v is None else ("PASS" if v >= 0.85 else "FAIL")
            print(f"| {r['op']} | {r['dtype']} | {size(r)} | {'on' if r.get('tf32') else 'off'} "
                  f"| {tflops(r, 'seconds')} | {tflops(r, 'cublas_seconds')} "
                  f"| {three(v)} | {three(r.get('vs_cublas_events'))} | {verdict} |")
    elif what == "check":
        print("| q | ranks | dtype | runs | all within tolerance | largest error | tolerance |")
        print("|---|---|---|---:|---|---:|---:|")
        groups = {}
        for r in gemm:
            if "check_ok" in r:
                groups.setdefault((r["q"], r["ranks"], r["dtype"]), []).append(r)
        for (q, ranks, dtype), g in sorted(groups.items()):
            print(f"| {q} | {ranks} | {dtype} | {len(g)} "
                  f"| {'yes' if all(x['check_ok'] for x in g) else 'NO'} "
                  f"| {max(x['max_rel_error'] for x in g):.1e} | {g[0]['tolerance']:.1e} |")
    elif what == "q2":
        print("| m × n × k | dtype | panel | overlap | summa TFLOP/s (4 ranks) "
              "| one cuBLAS call TFLOP/s | ratio |")
        print("|---|---|---:|---|---:|---:|---:|")
        for r in gemm:
            if r.get("q") == 2 and "check_ok" not in r:
                v = num(r.get("vs_cublas"))
                print(f"| {size(r)} | {r['dtype']} | {r['panel']} "
                      f"| {'on' if r.get('overlap') else 'off'} | {tflops(r, 'seconds')} "
                      f"| {tflops(r, 'cublas_seconds')} | {'-' if v is None else f'{v:.2f}'} |")
    elif what == "block":
        text, _, _, _ = ratio.block_table(rows, True)
        print(text or "(no block lines in the record)")
    else:
        sys.exit(f"doc_figures: gpu: unknown table '{what}' (source, gemm, check, q2, block)")


def study_run(path, machine):
    """A measured scaling_study --run --plot PREFIX.jsonl: each point measured against
    its prediction, with the machine file it was priced on."""
    import json
    rows = [json.loads(l) for l in read(path) if l.strip().startswith("{")]
    rows = [r for r in rows if "measured_step_s" in r]
    if not rows:
        sys.exit(f"doc_figures: {path} has no measured points (scaling_study --run)")
    with open(machine, encoding="utf-8") as f:
        m = json.load(f)
    lib = m.get("device", {}).get("gemm_library", "unrecorded")
    print(f"`{path}`, priced on `{machine}` ({m.get('name', '')}, its GEMM figures from "
          f"`{lib}`):\n")
    print("| devices | scheme | batch | measured step (s) | predicted (s) | error |")
    print("|---:|---|---:|---:|---:|---:|")
    errors = []
    for r in rows:
        err = 100 * r["prediction_error"]
        errors.append(abs(err))
        print(f"| {r['gpus']} | `{r['scheme']}` | {r['batch']} | {r['measured_step_s']:.4f} "
              f"| {r['predicted_whole_step_s']:.4f} | {err:+.1f} % |")
    print(f"\nMean absolute error {sum(errors) / len(errors):.1f} %, worst {max(errors):.1f} % "
          f"over {len(errors)} points.")


def bench_runs(path):
    """A bench record: (provenance, [(command, [lines])])."""
    import json
    head, runs = None, []
    for raw in read(path):
        raw = raw.strip()
        if not raw.startswith("{"):
            continue
        r = json.loads(raw)
        if r.get("record") == "bench":
            head = r
        elif "record_run" in r:
            runs.append((r["record_run"], []))
        elif runs:
            runs[-1][1].append(r)
    if head is None or not runs:
        sys.exit(f"doc_figures: {path} is not a bench record (scripts/bench_record.py)")
    return head, runs


def nth_run(path, runs, n):
    """The N-th (1-based) run of a bench record: (command, lines)."""
    n = int(n)
    if not 1 <= n <= len(runs):
        sys.exit(f"doc_figures: {path} has {len(runs)} runs, not {n}")
    return runs[n - 1]


def bench_lines(path, runs, n, bench):
    """The N-th run's command and its lines of one bench (exits when it has none)."""
    command, lines = nth_run(path, runs, n)
    lines = [l for l in lines if l.get("bench") == bench]
    if not lines:
        sys.exit(f"doc_figures: run {n} of {path} has no {bench} lines")
    return command, lines


def bench_record(path, what, *args):
    head, runs = bench_runs(path)
    if what == "source":
        blas = next((l.get("blas") for _, lines in runs for l in lines if l.get("blas")), None)
        arch = next((l.get("blas_arch") for _, lines in runs for l in lines if l.get("blas_arch")),
                    None)
        print(f"Record `{path}`: {head['date']}, commit `{head['commit']}`, {head['cpu']} "
              f"(signature `{head['signature']}`); "
              f"{head['compiler']}; {head['mpi']}"
              + (f"; BLAS for the baselines `{blas}` ({arch})" if blas else "") + ".")
        return
    if what == "guard":
        print("| ranks | form | m = n = k | time with checks | consensus overhead "
              "| watchdog overhead |")
        print("|---|---|---|---:|---:|---:|")
        pct = lambda x: f"{x * 100:+.1f} %".replace("-", "−")
        for _, lines in runs:
            for l in lines:
                if "consensus_overhead" not in l:
                    continue
                ms = l["seconds"] * 1e3
                print(f"| {l['ranks']} | {l['op']} | {l['m']} "
                      f"| {ms:.3g} ms | {pct(l['consensus_overhead'])} "
                      f"| {pct(l['watchdog_overhead'])} |")
        return
    if what == "layer":
        vs_serial = lambda l: f"{l['vs_serial']:.2f}" if "vs_serial" in l else "–"
        mib = lambda b: f"{b / 2**20:.2f} MiB" if b else "0"
        print("| q | ranks | what | pass | ckpt | median | tokens/s | model GFLOP/s "
              "| hw GFLOP/s | bytes sent/rank | peak buffers/rank | activations/rank "
              "| serial | `vs_serial` |")
        print("|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for _, lines in runs:
            for l in lines:
                if l.get("bench") != "gpt_layer":
                    continue
                ck = "–" if l.get("checkpoint") is None else ("on" if l["checkpoint"] else "off")
                serial = l.get("serial_median_s")
                print(f"| {l['q']} | {l['ranks']} | {l['what']} | {l['pass']} | {ck} "
                      f"| {l['median_s'] * 1e3:.1f} ms | {l['tokens_per_s']:.0f} "
                      f"| {l['model_flops_per_s'] / 1e9:.1f} "
                      f"| {l['hardware_flops_per_s'] / 1e9:.1f} "
                      f"| {mib(l['bytes_sent_per_rank'])} "
                      f"| {mib(l['peak_buffer_bytes_per_rank'])} "
                      f"| {mib(l['activation_bytes_per_rank']) if 'activation_bytes_per_rank' in l else '–'} "
                      f"| {f'{serial * 1e3:.1f} ms' if serial else '–'} "
                      f"| {vs_serial(l)} |")
        return
    if what in ("steps", "inference") and args:
        command, lines = nth_run(path, runs, args[0])
        lines = [l for l in lines if "scheme" in l and not l.get("skipped")]
        print(f"`{command}`:\n")
        if what == "steps":
            print("| scheme | step (s) | tokens/s |")
            print("|---|--:|--:|")
            for l in lines:
                print(f"| `{l['scheme']}` | {l['median_s']:.3f} | {l['tokens_per_s']:.0f} |")
        else:
            print("| scheme | forward s | inference seq/s | prefill tokens/s | decode tokens/s |")
            print("|---|--:|--:|--:|--:|")
            for l in lines:
                print(f"| `{l['scheme']}` | {l['forward_s']:.4f} "
                      f"| {l['inference_sequences_per_s']:.1f} "
                      f"| {l['prefill_tokens_per_s']:.0f} | {l['decode_tokens_per_s']:.0f} |")
        return
    if what == "breakdown" and args:
        command, lines = nth_run(path, runs, args[0])
        lines = [l for l in lines if l.get("breakdown") and not l.get("skipped")]
        if not lines:
            sys.exit(f"doc_figures: run {args[0]} of {path} has no --breakdown lines")
        predicted = "predicted_step_s" in lines[0]
        print(f"`{command}` printed (as compare_schemes prints it; measured seconds per step, "
              "mean over the timed steps, largest over ranks"
              + (", beside the prediction" if predicted else "") + "):\n")
        print("```text")
        print("breakdown: seconds per step of each part, measured"
              + (" and predicted" if predicted else "") + " (largest over ranks)")
        for l in lines:
            print(f"  {l['scheme']}")
            for p in l["breakdown"]:
                name = ("  " if p["op"].startswith("block.") else "") + p["op"] + "." + p["phase"]
                if predicted:
                    m, q = p["measured_s"], p["predicted_s"]
                    err = 100 * (q - m) / m if m > 0 else 0.0
                    print(f"    {name:<32} {m:9.5f} {q:9.5f} {err:+7.1f}%")
                else:
                    print(f"    {name:<32} {p['measured_s']:9.5f}")
        print("```")
        return
    if what == "libraries" and args:
        command, lines = nth_run(path, runs, args[0])
        cases = [l for l in lines if "libraries_gflops" in l]
        summary = next((l for l in lines if l.get("summary") == "libraries"), None)
        if not cases or summary is None:
            sys.exit(f"doc_figures: run {args[0]} of {path} has no --compare-libraries lines")
        libs = list(cases[0]["libraries_gflops"])
        details = next((l["libraries"] for l in cases if "libraries" in l), {})
        print(f"`{command}`:\n")
        for lib in libs:
            if details.get(lib):
                print(f"- `{lib}`: {details[lib]}")
        print()
        print("| dtype | m × n × k | form | " + " | ".join(f"{x} GFLOP/s" for x in libs)
              + f" | fastest | summa q = 1 on `{summary['summa_cpu_gemm']}` GFLOP/s | `vs_fastest` |")
        print("|---|---|---|" + "---:|" * len(libs) + "---|---:|---:|")
        for l in cases:
            size = (f"{l['m']}³" if l["m"] == l["n"] == l["k"] else f"{l['m']}×{l['n']}×{l['k']}")
            print(f"| {l['dtype']} | {size} | {l['op']} | "
                  + " | ".join(f"{l['libraries_gflops'][x]:.1f}" for x in libs)
                  + f" | {l['fastest_library']} | {l['gflops']:.1f} | {l['vs_fastest']:.2f} |")
        g = summary["geomean_vs_fastest"]
        print(f"\nGeometric mean over the {summary['cases']} cases of each library's rate over "
              "the fastest's: " + ", ".join(f"{x} {g[x]:.2f}" for x in libs)
              + f"; fastest here: **{summary['fastest_library']}**. summa at q = 1 on "
              f"`{summary['summa_cpu_gemm']}`: {summary['summa_geomean_vs_fastest']:.2f} of the "
              f"fastest (worst case {summary['summa_worst_vs_fastest']:.2f}).")
        return
    if what == "torch" and args:
        command, lines = bench_lines(path, runs, args[0], "block_vs_torch")
        print(f"`{command}` (summa on `{lines[0]['summa_backend']}`, PyTorch "
              f"{lines[0]['torch_version']}; medians over {lines[0]['rounds']} rounds of "
              f"{lines[0]['reps']} steps, {lines[0]['threads']} thread each):\n")
        print("| hidden | heads | seq | batch | pass | summa ms | PyTorch ms | PyTorch / summa |")
        print("|---:|---:|---:|---:|---|---:|---:|---:|")
        for l in lines:
            print(f"| {l['hidden']} | {l['heads']} | {l['seq']} | {l['batch']} | {l['pass']} "
                  f"| {l['summa_s'] * 1e3:.1f} | {l['torch_s'] * 1e3:.1f} "
                  f"| {l['torch_over_summa']:.2f} |")
        return
    if what == "threads":
        import re
        print("| ranks | threads per rank | scheme | step (s) | tokens/s | vs 1 rank × 1 thread |")
        print("|---:|---:|---|---:|---:|---:|")
        rows = []
        for command, lines in runs:
            th = re.search(r"--threads[ =](\d+)", command)
            for l in lines:
                if "scheme" not in l or l.get("skipped") or "median_s" not in l:
                    continue
                rows.append((l["ranks"], int(th.group(1)) if th else 1, l))
        base = next((l["median_s"] for r, t, l in rows if r == 1 and t == 1), None)
        if base is None:
            sys.exit(f"doc_figures: {path} has no run of 1 rank x 1 thread (the baseline)")
        for ranks, threads, l in rows:
            print(f"| {ranks} | {threads} "
                  f"| `{l['scheme']}` | {l['median_s']:.3f} | {l['tokens_per_s']:.0f} "
                  f"| {base / l['median_s']:.2f} |")
        return
    if what == "decode" and args:
        command, lines = bench_lines(path, runs, args[0], "decode_vs_torch")
        l0 = lines[0]
        print(f"`{command}` (the model: {l0['n_layer']} layers, hidden {l0['n_embd']}, "
              f"{l0['n_head']} heads, vocabulary {l0['vocab']}; prompt {l0['prompt']} tokens, "
              f"{l0['new']} new; medians over {l0['rounds']} rounds; PyTorch "
              f"{l0['torch_version']}, {l0['threads']} thread):\n")
        print("| ranks | scheme | batch | summa decode tokens/s | PyTorch decode tokens/s "
              "| PyTorch / summa | greedy tokens agreeing |")
        print("|---:|---|---:|---:|---:|---:|---:|")
        for l in lines:
            if l["ranks"] == 1:
                agree = f"{l['greedy_agree']} of {l['new']}" if "greedy_agree" in l else "–"
                print(f"| 1 | – | {l['batch']} | {l['summa_decode_tokens_per_s']:.0f} "
                      f"| {l['torch_decode_tokens_per_s']:.0f} "
                      f"| {l['torch_over_summa']:.2f} | {agree} |")
            else:
                print(f"| {l['ranks']} | `{l['scheme']}` | {l['batch']} "
                      f"| {l['summa_decode_tokens_per_s']:.0f} | (1 rank: "
                      f"{l['torch_decode_tokens_per_s_1rank']:.0f}) | – | – |")
        return
    if what != "gemm" or not args:
        sys.exit(f"doc_figures: bench: unknown table '{what}' "
                 "(source, gemm N, libraries N, breakdown N, guard, layer, steps N, inference N, "
                 "torch N, decode N, threads)")
    command, lines = nth_run(path, runs, args[0])
    lines = [l for l in lines if "op" in l]
    varies = lambda key: len({str(l.get(key)) for l in lines}) > 1
    cols = [("dtype", lambda l: l["dtype"]),
            ("m × n × k", lambda l: f"{l['m']}³" if l["m"] == l["n"] == l["k"]
             else f"{l['m']}×{l['n']}×{l['k']}"),
            ("form", lambda l: l["op"])]
    if varies("panel"):
        cols.append(("panel", lambda l: str(l["panel"])))
    if varies("overlap") or varies("progress_slices"):
        cols.append(("overlap (slices)", lambda l: f"on ({l['progress_slices']})"
                     if l.get("overlap") else "off"))
    cols.append(("SUMMA GFLOP/s", lambda l: f"{l['gflops']:.1f}"))
    if any("eigen_gflops" in l for l in lines):
        cols += [("Eigen GFLOP/s (1 rank)", lambda l: f"{l['eigen_gflops']:.1f}"),
                 ("`vs_eigen`", lambda l: f"{l['vs_eigen']:.2f}")]
    if any("pdgemm_gflops" in l for l in lines):
        cols += [("PDGEMM GFLOP/s", lambda l: f"{l['pdgemm_gflops']:.1f}"),
                 ("`vs_pdgemm`", lambda l: f"{l['vs_pdgemm']:.2f}")]
    ranks = sorted({l["ranks"] for l in lines})
    nb = sorted({l.get("pdgemm_nb") for l in lines if "pdgemm_nb" in l})
    print(f"`{command}`: {', '.join(map(str, ranks))} rank(s)"
          + (f", PDGEMM panel {', '.join(map(str, nb))}" if nb else "") + "\n")
    print("| " + " | ".join(c for c, _ in cols) + " |")
    print("|" + "|".join("---:" if "GFLOP" in c or "vs_" in c else "---" for c, _ in cols) + "|")
    for l in lines:
        print("| " + " | ".join(f(l) for _, f in cols) + " |")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    what, args = sys.argv[1], sys.argv[2:]
    if what == "include":
        include(*args)
    elif what == "demo":
        demo(args[0])
    elif what == "training":
        training(args[0])
    elif what == "memory-scaling":
        memory_scaling()
    elif what == "memory-report":
        memory_report()
    elif what == "optimus":
        optimus(args[0])
    elif what == "axonn":
        axonn()
    elif what == "gpu":
        gpu_record(args[0], args[1])
    elif what == "study-run":
        study_run(args[0], args[1])
    elif what == "bench":
        bench_record(args[0], *args[1:])
    else:
        sys.exit(f"doc_figures: unknown figure '{what}'\n{__doc__}")


if __name__ == "__main__":
    main()
