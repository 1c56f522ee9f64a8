#!/usr/bin/env python3
"""The summary of scripts/validate_time_model.sh: per model size and rank
count, the mean and worst |predicted - measured| / measured of compare_schemes
--predict and where the measured fastest scheme is in the predicted order.

    scripts/validate_summary.py DIR MACHINE      DIR/*.jsonl of a run; writes DIR/summary.md
    scripts/validate_summary.py --record FILE    a record of a run (validate_time_model.sh --record)
    scripts/validate_summary.py --write-record FILE DIR MACHINE
                                                 DIR's lines as a record (provenance first)
    scripts/validate_summary.py --where RECORD [RECORD ...]
                                                 where each record's error lies: by rank
                                                 count, the bias of each of the run's
                                                 repetitions, and the measured wait beyond the
                                                 predicted exposed communication

Exit status 1 when the validation fails (mean > 10 %, worst > 25 % or the
measured fastest below predicted place 3).
"""
import glob
import json
import os
import sys

ORDER = {"small": 0, "medium": 1, "large": 2, "gpu-small": 3, "gpu-large": 4}


def order(name):
    """A row's model first (validate_time_model.sh's order), then its element
    type ("large-bf16": the large model in bf16; a name alone is f32)."""
    for d in ("-f32", "-f64", "-bf16"):
        if name.endswith(d):
            return ORDER.get(name[:-len(d)], 9), name
    return ORDER.get(name, 9), name


def place(rows, r):
    below = []
    for o in rows:
        t = o["predicted_step_s"]
        if t < r["predicted_step_s"] and all(abs(t - b) > 1e-9 * r["predicted_step_s"]
                                             for b in below):
            below.append(t)
    return 1 + len(below)


def median_run(rs):
    """The run of a scheme's repetitions whose step is the median (of an even
    count, the slower middle one)."""
    return sorted(rs, key=lambda r: r["median_s"])[len(rs) // 2]


def summarize(groups):
    """groups: [(name, ranks, [compare_schemes JSON objects])] -> (text, ok)."""
    lines = ["| model | ranks | schemes | mean abs error | worst | bias | measured fastest "
             "| its predicted place |",
             "|---|---|---|---|---|---|---|---|"]
    errors, worst_place = [], 0
    for name, np, objs in sorted(groups, key=lambda g: (order(g[0]), int(g[1]))):
        runs = {}
        for r in objs:
            if r.get("skipped") is None:
                runs.setdefault(r["scheme"], []).append(r)
        rows = []
        for rs in runs.values():  # the median run of each scheme
            r = dict(median_run(rs))
            r["prediction_error"] = (r["predicted_step_s"] - r["median_s"]) / r["median_s"]
            rows.append(r)
        if not rows:
            continue
        e = [r["prediction_error"] for r in rows]
        errors += e
        fast = min(rows, key=lambda r: r["median_s"])
        p = place(rows, fast)
        worst_place = max(worst_place, p)
        lines.append(f"| {name} | {np} | {len(rows)} | {100 * sum(map(abs, e)) / len(e):.1f} % | "
                     f"{100 * max(map(abs, e)):.1f} % | {100 * sum(e) / len(e):+.1f} % "
                     f"| {fast['scheme']} | {p} |")
    if not errors:
        return "validate_summary: no measured scheme", False
    mean = 100 * sum(map(abs, errors)) / len(errors)
    worst = 100 * max(map(abs, errors))
    lines.append(f"| **all** | | {len(errors)} | **{mean:.1f} %** | **{worst:.1f} %** | "
                 f"{100 * sum(errors) / len(errors):+.1f} % | | worst place {worst_place} |")
    ok = mean <= 10 and worst <= 25 and worst_place <= 3
    lines.append("")
    lines.append(f"`validate_time_model: mean {mean:.1f} % (<= 10), worst {worst:.1f} % (<= 25), "
                 f"measured fastest at predicted place <= {worst_place} (<= 3): "
                 f"{'PASS' if ok else 'FAIL'}`")
    return "\n".join(lines), ok


def from_dir(out):
    groups = []
    for f in glob.glob(os.path.join(out, "*-np*.jsonl")):
        name, np = os.path.basename(f)[:-6].rsplit("-np", 1)
        with open(f, encoding="utf-8") as fh:
            groups.append((name, np, [json.loads(l) for l in fh if l.strip()]))
    return groups


def from_record(path):
    head, groups = None, []
    with open(path, encoding="utf-8") as fh:
        for raw in fh:
            if not raw.strip():
                continue
            r = json.loads(raw)
            if r.get("record") == "bench":
                head = r
            elif "record_run" in r:
                name, np = r["record_run"].rsplit("-np", 1)
                groups.append((name, np, []))
            elif groups:
                groups[-1][2].append(r)
    if head is None or not groups:
        sys.exit(f"validate_summary: {path} is not a validation record")
    return head, groups


def quantiles(v):
    """p10 / median / p90 of v, in per cent, as 'a / b / c'."""
    v = sorted(v)
    at = lambda f: v[min(len(v) - 1, int(f * len(v)))]
    return f"{100 * at(0.1):+.0f} / {100 * at(0.5):+.0f} / {100 * at(0.9):+.0f}"


def where(paths):
    """By record and rank count: each repetition's mean signed error (the
    script runs every group --repeat times, interleaved: a drift of the
    machine shows as the repetitions' biases moving apart), and, over the
    schemes' median runs, the measured wait in collectives beyond the
    predicted exposed communication as a share of the measured rest of the
    step (compare_schemes' comm_wait_s is the largest over ranks: the time a
    rank waits for the others, skew included), and the rest of the step
    (compute) as predicted against measured."""
    lines = ["| record | ranks | points | bias of repetition 1, 2, ... | wait beyond the "
             "predicted exposed comm, % of compute (p10 / median / p90) | compute error "
             "(p10 / median / p90) |",
             "|---|---|---|---|---|---|"]
    for path in paths:
        head, groups = from_record(path)
        by_ranks = {}
        for _, np, objs in groups:
            by_ranks.setdefault(int(np), []).append(
                [r for r in objs if r.get("skipped") is None and r.get("median_s")])
        for np in sorted(by_ranks):
            biases, excess, compute = {}, [], []
            for objs in by_ranks[np]:
                runs = {}
                for r in objs:
                    runs.setdefault(r["scheme"], []).append(r)
                for rs in runs.values():
                    for k, r in enumerate(rs):  # in the order measured: repetition k
                        e = (r["predicted_step_s"] - r["median_s"]) / r["median_s"]
                        biases.setdefault(k, []).append(e)
                    r = median_run(rs)
                    rest = r["median_s"] - r["comm_wait_s"]
                    excess.append((r["comm_wait_s"] - r["predicted_exposed_comm_s"]) / rest)
                    compute.append((r["predicted_step_s"] - r["predicted_exposed_comm_s"]) / rest - 1)
            bias = ", ".join(f"{100 * sum(v) / len(v):+.0f} %" for _, v in sorted(biases.items()))
            lines.append(f"| `{os.path.basename(path)}` ({head['signature']}) | {np} | {len(excess)} "
                         f"| {bias} | {quantiles(excess)} | {quantiles(compute)} |")
    return "\n".join(lines)


def main():
    args = sys.argv[1:]
    if len(args) == 2 and args[0] == "--record":
        head, groups = from_record(args[1])
        text, ok = summarize(groups)
        devices = sorted({o.get("device", "cpu") for g in groups for o in g[2]} - {"cpu"})
        on = f" with {', '.join(devices)} (--backend cuda)" if devices else ""
        print(f"Record `{args[1]}`: {head['date']}, commit `{head['commit']}`, {head['cpu']} "
              f"(signature `{head['signature']}`){on}, machine file "
              f"`{head.get('machine_file')}`, {len([1 for g in groups for _ in g[2]])} measured "
              "lines.\n")
        print(text)
        return 0  # a record is shown as it is, PASS or FAIL
    if len(args) >= 2 and args[0] == "--where":
        print(where(args[1:]))
        return 0
    if len(args) == 4 and args[0] == "--write-record":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from bench_record import provenance
        path, out, machine = args[1:]
        head = dict(provenance(), machine_file=machine)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(head) + "\n")
            for name, np, objs in sorted(from_dir(out)):
                fh.write(json.dumps({"record_run": f"{name}-np{np}"}) + "\n")
                for o in objs:
                    fh.write(json.dumps(o) + "\n")
        print(f"validate_summary: record {path}", file=sys.stderr)
        return 0
    if len(args) == 2:
        out, machine = args
        text, ok = summarize(from_dir(out))
        print(text)
        with open(os.path.join(out, "summary.md"), "w", encoding="utf-8") as fh:
            fh.write(f"machine file: {machine}\n\n{text}\n")
        return 0 if ok else 1
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main())
