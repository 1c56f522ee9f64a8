#!/usr/bin/env python3
"""Plot a gpt_train JSON-lines log: training loss (and validation loss) against step.

    python3 scripts/plot_loss.py gpt_train_out/log.jsonl [-o loss.png] [--title TEXT]

Uses Debian's python3-matplotlib (apt-get install python3-matplotlib); writes a
PNG (default: next to the log, loss.png) and prints its path.
"""
import argparse
import json
import math
import os
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", help="JSON-lines log written by examples/gpt_train")
    ap.add_argument("-o", "--output", help="PNG to write (default: <log dir>/loss.png)")
    ap.add_argument("--title", default=None, help="plot title")
    args = ap.parse_args()

    train, val = [], []
    try:
        with open(args.log, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    print(f"plot_loss: {args.log}:{n}: not JSON ({e})", file=sys.stderr)
                    return 1
                if "loss" in rec:
                    train.append((rec["step"], rec["loss"]))
                if "val_loss" in rec:
                    val.append((rec["step"], rec["val_loss"]))
    except OSError as e:
        print(f"plot_loss: cannot read {args.log}: {e}", file=sys.stderr)
        return 1
    if not train:
        print(f"plot_loss: {args.log} has no training steps", file=sys.stderr)
        return 1
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_loss: needs matplotlib (apt-get install python3-matplotlib)", file=sys.stderr)
        return 1

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    steps, losses = zip(*train)
    ax.plot(steps, losses, lw=0.8, alpha=0.45, color="tab:blue", label="training loss (per step)")
    # A running mean over ~2% of the run makes the trend readable.
    w = max(1, len(losses) // 50)
    if w > 1:
        smooth = [sum(losses[max(0, i - w + 1):i + 1]) / (i + 1 - max(0, i - w + 1))
                  for i in range(len(losses))]
        ax.plot(steps, smooth, lw=1.8, color="tab:blue", label=f"training loss (mean of {w})")
    if val:
        vs, vl = zip(*val)
        ax.plot(vs, vl, "o-", color="tab:orange", ms=4, label="validation loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(args.title or f"summa gpt_train: {os.path.basename(args.log)}")
    ax.grid(alpha=0.3)
    ax.legend()
    lo = min(min(losses), min((v for _, v in val), default=math.inf))
    ax.set_ylim(bottom=max(0.0, lo - 0.3))
    out = args.output or os.path.join(os.path.dirname(os.path.abspath(args.log)), "loss.png")
    fig.tight_layout()
    fig.savefig(out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
