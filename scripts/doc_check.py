#!/usr/bin/env python3
"""The doc-check: every shell block of README.md, bench/README.md and docs/*.md is run (or
marked skipped with a reason) and every generated figure is regenerated and
compared with the doc. First, and always (it takes a second): every path a
doc names (every tracked .md: a `path/with.ext` or `folder/` in backticks, a
link target) and every path a source file's comment names exists in the tree,
and every \\file names its own file (check_paths: how a path resolves, and
what is not in the tree by design).

    scripts/doc_check.py [--demo-log LOG] [--only README.md] [--update] [--no-run] [--list]

Markers are HTML comments (invisible on GitHub) on the line before a fenced
block, or around a generated region:

  <!-- doc-check: run [timeout=S] [needs=T1,T2] -->
        the next fenced block is run with bash (set -euo pipefail) from the
        repository's root, as a reader runs it (what it writes is in
        .gitignore); needs= builds those targets of build/ first
        (configuring it with the benchmarks on)
  <!-- doc-check: skip REASON -->
        the next fenced block is not run; the reason is printed (a block that
        needs a GPU or a cluster)
  <!-- doc-check: output [needs=T] [options]: COMMAND -->
        the next fenced block is COMMAND's output, compared with it
  <!-- doc-check: begin [needs=T] [options]: COMMAND --> ... <!-- doc-check: end -->
        the Markdown between is COMMAND's output, compared with it

COMMAND runs with bash from the root; {demo_log} is --demo-log (the
output of scripts/quickstart.sh demo: .ci/run passes the one it just ran;
without it the demo is run here first). Comparison options:

  tolerance=T       numbers may differ by a relative T (the rest exactly)
  cpu=SIG keep=RE   the text is exact only on a CPU of signature SIG (what
                    --list prints as "this CPU"); elsewhere only the lines
                    matching the regular expression RE are compared, with the
                    tolerance (floating-point sums differ between CPUs)
  cpu=SIG cpu-tolerance=T
                    elsewhere than on SIG, numbers within a relative T: sizes
                    that follow the CPU's caches (Eigen's GEMM packing
                    blocks, so the workspace, the totals and the largest batch)

Every ```sh / ```bash / ```console block, and every untagged block whose first
line is a command, must carry a run, skip or output marker: an unmarked one
fails the check. --update rewrites the generated regions and outputs from
the commands (on a machine whose CPU signature is the marker's, or it
changes the marker's cpu= too). Exit status 1 when anything fails.
"""
import argparse
import glob
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = re.compile(r"^<!--\s*doc-check:\s*(run|skip|output|begin|end)\b(.*?)-->\s*$")
FENCE = re.compile(r"^(```+|~~~+)\s*([\w+-]*)")
SHELL_TAGS = {"sh", "bash", "shell", "console"}
COMMAND_START = re.compile(r"^(\$ )?(mpirun|srun|build[-\w]*/|scripts/|cmake|ctest|ninja|\./|/usr/bin/python3|python3)\b")
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def cpu_signature():
    model, family, number = "unknown", "?", "?"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "model name" and model == "unknown":
                    model = value
                elif key == "cpu family" and family == "?":
                    family = value
                elif key == "model" and number == "?":
                    number = value
    except OSError:
        pass
    return re.sub(r"[^\w.-]+", "_", f"{model}-f{family}m{number}").strip("_")


def parse_options(text):
    """'a=1 b=2: command' -> ({a: 1, b: 2}, 'command')."""
    head, sep, command = text.partition(":")
    if not sep:
        head, command = text, ""
    options = {}
    for word in shlex.split(head):
        key, eq, value = word.partition("=")
        options[key] = value if eq else True
    return options, command.strip()


class Block:
    def __init__(self, doc, line, kind, options, command, start, end, tag, body):
        self.doc, self.line, self.kind = doc, line, kind
        self.options, self.command = options, command
        self.start, self.end = start, end  # body lines [start, end) of the doc
        self.tag, self.body = tag, body

    def where(self):
        return f"{os.path.relpath(self.doc, ROOT)}:{self.line}"


def scan(doc):
    """The doc's marked blocks, and the unmarked shell blocks (errors)."""
    with open(doc, encoding="utf-8") as f:
        lines = f.read().split("\n")
    blocks, errors = [], []
    pending = None  # a marker waiting for its fenced block
    i = 0
    while i < len(lines):
        line = lines[i]
        m = MARKER.match(line.strip())
        if m:
            kind, rest = m.group(1), m.group(2).strip()
            if kind == "begin":
                options, command = parse_options(rest)
                j = i + 1
                while j < len(lines) and not (MARKER.match(lines[j].strip()) and
                                              MARKER.match(lines[j].strip()).group(1) == "end"):
                    j += 1
                if j == len(lines):
                    errors.append(f"{os.path.relpath(doc, ROOT)}:{i + 1}: begin without end")
                    break
                blocks.append(Block(doc, i + 1, "begin", options, command, i + 1, j, "",
                                    "\n".join(lines[i + 1:j])))
                i = j + 1
                continue
            if kind == "end":
                errors.append(f"{os.path.relpath(doc, ROOT)}:{i + 1}: end without begin")
            else:
                if kind == "skip":
                    options, command = {}, rest
                    if not rest:
                        errors.append(f"{os.path.relpath(doc, ROOT)}:{i + 1}: skip without a reason")
                else:
                    options, command = parse_options(rest)
                pending = (kind, options, command, i + 1)
            i += 1
            continue
        fence = FENCE.match(line)
        if fence:
            marker, tag = fence.group(1), fence.group(2).lower()
            j = i + 1
            while j < len(lines) and not lines[j].startswith(marker):
                j += 1
            body = "\n".join(lines[i + 1:j])
            first = next((b for b in lines[i + 1:j] if b.strip()), "")
            shell = tag in SHELL_TAGS or (tag == "" and COMMAND_START.match(first.strip()))
            if pending:
                kind, options, command, at = pending
                blocks.append(Block(doc, at, kind, options, command, i + 1, j, tag, body))
                pending = None
            elif shell:
                errors.append(f"{os.path.relpath(doc, ROOT)}:{i + 1}: a shell block without a "
                              "doc-check marker (run, skip REASON or output)")
            i = j + 1
            continue
        if pending and line.strip():
            errors.append(f"{os.path.relpath(doc, ROOT)}:{pending[3]}: a {pending[0]} marker "
                          "not followed by a fenced block")
            pending = None
        i += 1
    return blocks, errors


def normalise(text):
    return "\n".join(l.rstrip() for l in text.strip("\n").split("\n"))


def same_with_tolerance(want, got, tolerance):
    """Text equal outside numbers, numbers within the relative tolerance."""
    a, b = NUMBER.split(want), NUMBER.split(got)
    if [" ".join(x.split()) for x in a] != [" ".join(x.split()) for x in b]:
        return False
    for x, y in zip(NUMBER.findall(want), NUMBER.findall(got)):
        fx, fy = float(x), float(y)
        if abs(fx - fy) > tolerance * max(abs(fx), abs(fy), 1e-300):
            return False
    return True


def compare(block, got, signature):
    """(ok, note): the block's text against the command's output."""
    want = normalise(block.body)
    got = normalise(got)
    tolerance = float(block.options.get("tolerance", 0))
    note = ""
    if "cpu" in block.options and block.options["cpu"] != signature:
        note = f" (recorded on {block.options['cpu']}, this is {signature}"
        if "keep" in block.options:
            keep = re.compile(block.options["keep"])
            want = "\n".join(l for l in want.split("\n") if keep.search(l))
            got = "\n".join(l for l in got.split("\n") if keep.search(l))
            note += f": lines /{keep.pattern}/ only"
        if "cpu-tolerance" in block.options:
            tolerance = max(tolerance, float(block.options["cpu-tolerance"]))
            note += f": numbers within {tolerance:g}"
        note += ")"
    if want == got:
        return True, note
    if tolerance > 0 and same_with_tolerance(want, got, tolerance):
        return True, note + f" (numbers within {tolerance:g})"
    return False, note


def diff(want, got):
    import difflib
    return "\n".join(difflib.unified_diff(normalise(want).split("\n"), normalise(got).split("\n"),
                                          "doc", "regenerated", lineterm="", n=1))


def run_bash(script, cwd, timeout, env):
    start = time.monotonic()
    try:
        p = subprocess.run(["bash", "-c", "set -euo pipefail\n" + script], cwd=cwd, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout,
                           text=True, errors="replace")
        return p.returncode, p.stdout, time.monotonic() - start
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return 124, out + f"\n(timed out after {timeout} s)", time.monotonic() - start


def ensure_targets(build, targets, env):
    """Build the targets the blocks need (the benchmarks turned on if off)."""
    if not targets:
        return
    cache = os.path.join(build, "CMakeCache.txt")
    text = open(cache, encoding="utf-8").read() if os.path.exists(cache) else ""
    if "SUMMA_BUILD_BENCH:BOOL=ON" not in text:
        subprocess.run(["cmake", "-S", ROOT, "-B", build, "-DSUMMA_BUILD_BENCH=ON"], check=True,
                       env=env, stdout=subprocess.DEVNULL)
    print(f"doc-check: building {' '.join(sorted(targets))} in {build}", flush=True)
    subprocess.run(["cmake", "--build", build, "--target", *sorted(targets)], check=True, env=env,
                   stdout=subprocess.DEVNULL)


# Paths the docs and the sources' comments name: every one must exist.
PATH_IN_DOC = re.compile(r"`([A-Za-z0-9_.*/-]*[A-Za-z0-9_*-]/[A-Za-z0-9_.*/-]*)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
PATH_IN_COMMENT = re.compile(
    r"(?<![\w./$-])((?:[A-Za-z0-9_.-]+/)+[A-Za-z0-9_-]+\.(?:hpp|cpp|cu|md|py|sh|cmake|json|jsonl))\b")
PATH_LIKE = re.compile(r"\.(hpp|cpp|h|cu|md|py|sh|cmake|txt|json|jsonl|png|svg|csv)$|/$")
# Not in the tree by design: build folders, absolute and home paths,
# placeholders (<dir>, $OUT), install destinations (share/...), and what a run
# writes (gpt_train's --out folder and its checkpoints/ and export/,
# gpu_verify's .gpu_deps/).
NOT_IN_TREE = ("build", "/", "~", "$", "<", "gpt_train_out", "http", "mailto:", "OUT/", "out/",
               "share/", "checkpoints/", "export/", ".gpu_deps/")


def resolves(path, base):
    """True when `path` names a file or folder of the tree: from the root, from
    the naming file's folder, from src/ or include/summa/ (how the docs and
    comments abbreviate), or a header CMake writes from a .in template."""
    path = path.split("#")[0]
    if not path:
        return True
    for cand in (path, os.path.join(base, path), os.path.join("src", path),
                 os.path.join("include", "summa", path), os.path.join("include", path)):
        if glob.glob(cand) or os.path.exists(cand + ".in"):
            return True
    return False


def check_paths(docs=()):
    """Every path a doc (every tracked .md, and `docs`) or a source comment
    names exists, and every \\file names its own file. Returns the failures."""
    tracked = subprocess.run(["git", "ls-files"], capture_output=True, text=True,
                             check=True).stdout.split()
    errors = []
    for f in tracked + [d for d in docs if d not in tracked]:
        if not os.path.isfile(f):
            continue
        base = os.path.dirname(f)
        if f.endswith(".md"):
            text = open(f, encoding="utf-8", errors="replace").read()
            lines = text.split("\n")
            for i, line in enumerate(lines, 1):
                names = [m.group(1) for m in PATH_IN_DOC.finditer(line)
                         if PATH_LIKE.search(m.group(1))]
                names += [m.group(1) for m in LINK.finditer(line)]
                for p in names:
                    if p.startswith(NOT_IN_TREE) or "{" in p or "://" in p:
                        continue
                    if not resolves(p, base):
                        errors.append(f"{f}:{i}: names '{p}', which is not in the tree")
        elif f.endswith((".hpp", ".cpp", ".h", ".cu", ".cuh", ".cmake", ".sh", ".py")) or \
                os.path.basename(f) == "CMakeLists.txt":
            for i, line in enumerate(open(f, encoding="utf-8", errors="replace"), 1):
                s = line.strip()
                if not s.startswith(("//", "#", "*", "/*")) or s.startswith("#include"):
                    continue
                m = re.match(r"(?:///|//!|\*)\s*\\file\s+(\S+)", s)
                if m and m.group(1) != os.path.basename(f):
                    errors.append(f"{f}:{i}: \\file {m.group(1)} in {os.path.basename(f)}")
                for m in PATH_IN_COMMENT.finditer(line):
                    p = m.group(1)
                    if not p.startswith(NOT_IN_TREE) and not resolves(p, base):
                        errors.append(f"{f}:{i}: names '{p}', which is not in the tree")
    return errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--demo-log", help="the output of scripts/quickstart.sh demo ({demo_log})")
    ap.add_argument("--only", nargs="*", help="these docs only (paths from the repository root)")
    ap.add_argument("--update", action="store_true", help="rewrite generated regions and outputs")
    ap.add_argument("--list", action="store_true", help="list the blocks and markers, run nothing")
    ap.add_argument("--no-run", action="store_true",
                    help="regenerate and compare the figures only, run no block")
    args = ap.parse_args()
    os.chdir(ROOT)
    docs = args.only or (["README.md", "bench/README.md"] +
                         sorted(os.path.join("docs", d)
                                for d in os.listdir("docs") if d.endswith(".md")))
    signature = cpu_signature()
    all_blocks, errors = [], check_paths(docs)
    for doc in docs:
        b, e = scan(os.path.join(ROOT, doc))
        all_blocks += b
        errors += e
    if args.list:
        print(f"this CPU: {signature}")
        for b in all_blocks:
            print(f"{b.where()}: {b.kind} {b.options or ''} {b.command[:70]}")
        for e in errors:
            print(f"ERROR {e}")
        return 1 if errors else 0
    for e in errors:
        print(f"doc-check: FAIL {e}")
    # The blocks and commands run with this Python (the build's SUMMA_PYTHON,
    # as .ci/run starts it): first on PATH, and SUMMA_PYTHON for the scripts.
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", SUMMA_PYTHON=sys.executable,
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    build = os.path.join(ROOT, "build")  # the Release build the blocks name
    needs = set()
    for b in all_blocks:
        if "needs" in b.options and not (args.no_run and b.kind == "run"):
            needs.update(t for t in b.options["needs"].split(",") if t)
    ensure_targets(build, needs, env)
    demo_log = args.demo_log
    if any("{demo_log}" in b.command for b in all_blocks) and not demo_log:
        demo_log = os.path.join(tempfile.mkdtemp(prefix="summa-demo-"), "demo.log")
        print("doc-check: no --demo-log: running scripts/quickstart.sh demo", flush=True)
        with open(demo_log, "w", encoding="utf-8") as f:
            subprocess.run(["scripts/quickstart.sh", "demo"], stdout=f, stderr=subprocess.STDOUT,
                           check=True, env=dict(env, BUILD_DIR=build))
    scratch = ROOT
    failures = len(errors)
    updates = {}  # doc -> [(start, end, new lines)]
    total_start = time.monotonic()
    for b in all_blocks:
        if b.kind == "skip":
            print(f"doc-check: {b.where()}: skipped: {b.command}")
            continue
        timeout = int(b.options.get("timeout", 600))
        if b.kind == "run" and args.no_run:
            print(f"doc-check: {b.where()}: not run (--no-run)")
            continue
        if b.kind == "run":
            rc, out, dt = run_bash(b.body, scratch, timeout, env)
            if rc == 0:
                print(f"doc-check: {b.where()}: ran ({dt:.1f} s)", flush=True)
            else:
                failures += 1
                tail = "\n".join(out.rstrip().split("\n")[-25:])
                print(f"doc-check: FAIL {b.where()}: exit {rc} ({dt:.1f} s)\n{tail}", flush=True)
            continue
        command = b.command.replace("{demo_log}", shlex.quote(demo_log or ""))
        rc, out, dt = run_bash(command, scratch, timeout, env)
        if rc != 0:
            failures += 1
            tail = "\n".join(out.rstrip().split("\n")[-25:])
            print(f"doc-check: FAIL {b.where()}: '{b.command}' exit {rc}\n{tail}", flush=True)
            continue
        ok, note = compare(b, out, signature)
        if ok:
            print(f"doc-check: {b.where()}: regenerated, the same{note} ({dt:.1f} s)", flush=True)
        elif args.update:
            updates.setdefault(b.doc, []).append((b, normalise(out)))
            print(f"doc-check: {b.where()}: updated{note}", flush=True)
        else:
            failures += 1
            print(f"doc-check: FAIL {b.where()}: the doc differs from '{b.command}'{note}:\n"
                  f"{diff(b.body, out)}\n(scripts/doc_check.py --update rewrites it)", flush=True)
    for doc, changes in updates.items():
        with open(doc, encoding="utf-8") as f:
            lines = f.read().split("\n")
        for b, text in sorted(changes, key=lambda c: -c[0].start):
            lines[b.start:b.end] = text.split("\n")
            if "cpu" in b.options and b.options["cpu"] != signature:
                marker = b.line - 1
                lines[marker] = lines[marker].replace(f"cpu={b.options['cpu']}", f"cpu={signature}")
        with open(doc, "w", encoding="utf-8") as f:
            f.write("\n".join(lines))
    print(f"doc-check: {len(all_blocks)} blocks in {len(docs)} docs, {failures} failed "
          f"({time.monotonic() - total_start:.0f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
