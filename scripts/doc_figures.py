#!/usr/bin/env python3
"""The figures the docs quote, regenerated (scripts/doc_check.py compares
them with the docs; --update writes them in).

    scripts/doc_figures.py include FILE [LANG]   FILE as a fenced block
    scripts/doc_figures.py demo LOG              the demo's summary and generated text
    scripts/doc_figures.py training LOG          gpt_train's validation losses and summary

LOG is the output of scripts/quickstart.sh demo. Timings are left out: they
are measurements of one machine at one moment, not figures a doc can keep.
"""
import re
import sys


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


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    what, args = sys.argv[1], sys.argv[2:]
    if what == "include":
        include(*args)
    elif what == "demo":
        demo(args[0])
    elif what == "training":
        training(args[0])
    else:
        sys.exit(f"doc_figures: unknown figure '{what}'\n{__doc__}")


if __name__ == "__main__":
    main()
