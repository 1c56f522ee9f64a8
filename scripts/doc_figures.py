#!/usr/bin/env python3
"""The figures the docs quote, regenerated (scripts/doc_check.py compares
them with the docs; --update writes them in).

    scripts/doc_figures.py include FILE [LANG]   FILE as a fenced block
    scripts/doc_figures.py demo LOG              the demo's summary and generated text
    scripts/doc_figures.py training LOG          gpt_train's validation losses and summary
    scripts/doc_figures.py memory-scaling        docs/memory.md's activations at q = 1, 2, 3
    scripts/doc_figures.py memory-report         docs/memory.md's report of rank 0 at q = 2

LOG is the output of scripts/quickstart.sh demo. Timings are left out: they
are measurements of one machine at one moment, not figures a doc can keep.
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
                           "1" if checkpoint else "0"], check=True, capture_output=True,
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
    else:
        sys.exit(f"doc_figures: unknown figure '{what}'\n{__doc__}")


if __name__ == "__main__":
    main()
