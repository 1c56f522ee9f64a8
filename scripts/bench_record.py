#!/usr/bin/env python3
"""bench_record: run benchmark commands and keep their JSON lines as a record.

    scripts/bench_record.py RECORD.jsonl [--append] -- COMMAND [ARGS...]

Writes (or, with --append, extends) RECORD.jsonl: a provenance line first
({"record": "bench", machine, date, commit, compilers and libraries}), then,
per command, a line {"record_run": COMMAND} followed by every JSON line the
command printed (other output passes through to stderr). The docs quote
measurements only through such records (bench/records/), rendered by
scripts/doc_figures.py and compared by scripts/doc_check.py, so every figure
traces to one run with its machine, date and command.

Exit status: the command's; the record is written only when it succeeds.
"""
import json
import os
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from doc_check import cpu_signature  # noqa: E402


def first_line(cmd):
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
        return out.strip().split("\n")[0]
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def provenance():
    model = "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")),
                         "unknown")
    except OSError:
        pass
    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            line = next((l for l in f if l.startswith("flags")), "")
            flags = " ".join(x for x in ("avx2", "avx512f", "fma") if f" {x}" in line)
    except OSError:
        pass
    return {
        "record": "bench",
        "signature": cpu_signature(),
        "cpu": f"{model}, {os.cpu_count()} cores ({flags})",
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "commit": first_line(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"]),
        "compiler": first_line(["c++", "--version"]),
        "mpi": first_line(["mpirun", "--version"]),
    }


def main():
    args = sys.argv[1:]
    if "--" not in args or args.index("--") < 1:
        sys.exit(__doc__)
    split = args.index("--")
    options, command = args[:split], args[split + 1:]
    path, append = options[0], "--append" in options[1:]
    if not command:
        sys.exit(__doc__)
    proc = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    lines = []
    for raw in proc.stdout.split("\n"):
        raw = raw.strip()
        if raw.startswith("{"):
            try:
                lines.append(json.loads(raw))
                continue
            except json.JSONDecodeError:
                pass
        if raw:
            print(raw, file=sys.stderr)
    if proc.returncode != 0:
        print(f"bench_record: the command failed (exit {proc.returncode}); {path} not written",
              file=sys.stderr)
        return proc.returncode
    if not lines:
        print("bench_record: the command printed no JSON line", file=sys.stderr)
        return 1
    shown = " ".join(shlex.quote(a) for a in command)
    shown = shown.replace(ROOT + "/", "")
    mode = "a" if append and os.path.exists(path) else "w"
    with open(path, mode, encoding="utf-8") as f:
        if mode == "w":
            f.write(json.dumps(provenance()) + "\n")
        head = provenance()  # each run's own date and commit (--append may come later)
        f.write(json.dumps({"record_run": shown, "date": head["date"],
                            "commit": head["commit"]}) + "\n")
        for r in lines:
            f.write(json.dumps(r) + "\n")
    print(f"bench_record: {len(lines)} line(s) of `{shown}` into {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
