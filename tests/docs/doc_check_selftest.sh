#!/usr/bin/env bash
# The doc-check can fail: scripts/doc_check.py on small docs of its own, each
# expected to pass or to fail for one reason (an unmarked shell block, a run
# block that fails, a region that differs from its command, a tolerance, a
# CPU-keyed sample, a path or link that is not in the tree), and --update
# rewriting a region.
# Usage: doc_check_selftest.sh PYTHON SOURCE_DIR WORK_DIR
set -uo pipefail
python=$1 root=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
failures=0
check() {  # <name> <expected exit> <doc text> [doc_check args...]
  local name=$1 want=$2 text=$3
  shift 3
  printf '%s\n' "$text" >"$work/$name.md"
  "$python" "$root/scripts/doc_check.py" --only "$work/$name.md" "$@" >"$work/$name.log" 2>&1
  local rc=$?
  if [ "$rc" != "$want" ]; then
    echo "FAIL $name: exit $rc, expected $want"
    cat "$work/$name.log"
    failures=$((failures + 1))
  else
    echo "ok   $name (exit $rc)"
  fi
}
fence='```'
check unmarked 1 "$(printf 'Text.\n\n%ssh\necho hi\n%s' "$fence" "$fence")"
check unmarked_command 1 "$(printf '%s\nmpirun -np 2 build/x\n%s' "$fence" "$fence")"
check skip_without_reason 1 "$(printf '<!-- doc-check: skip -->\n%ssh\necho hi\n%s' "$fence" "$fence")"
check run_ok 0 "$(printf '<!-- doc-check: run -->\n%ssh\ntrue\n%s' "$fence" "$fence")"
check run_fails 1 "$(printf '<!-- doc-check: run -->\n%ssh\nfalse\necho never\n%s' "$fence" "$fence")"
check skipped 0 "$(printf '<!-- doc-check: skip needs a GPU -->\n%ssh\nfalse\n%s' "$fence" "$fence")"
check region_same 0 "$(printf '<!-- doc-check: begin: printf "a 1\\\\nb 2\\\\n" -->\na 1\nb 2\n<!-- doc-check: end -->')"
check region_differs 1 "$(printf '<!-- doc-check: begin: printf "a 1\\\\nb 3\\\\n" -->\na 1\nb 2\n<!-- doc-check: end -->')"
check region_no_end 1 "$(printf '<!-- doc-check: begin: echo x -->\nx\n')"
check output_same 0 "$(printf '<!-- doc-check: output: echo 42 -->\n%s\n42\n%s' "$fence" "$fence")"
check tolerance_within 0 "$(printf '<!-- doc-check: begin tolerance=0.05: echo loss 2.05 -->\nloss 2.00\n<!-- doc-check: end -->')"
check tolerance_beyond 1 "$(printf '<!-- doc-check: begin tolerance=0.01: echo loss 2.05 -->\nloss 2.00\n<!-- doc-check: end -->')"
check tolerance_text 1 "$(printf '<!-- doc-check: begin tolerance=0.5: echo gain 2.00 -->\nloss 2.00\n<!-- doc-check: end -->')"
# a sample recorded on another CPU: only the kept lines count
check other_cpu 0 "$(printf '<!-- doc-check: begin cpu=some-other-cpu keep=^loss: printf "loss 1\\\\nsampled xyz\\\\n" -->\nloss 1\nsampled abc\n<!-- doc-check: end -->')"
check other_cpu_kept_differs 1 "$(printf '<!-- doc-check: begin cpu=some-other-cpu keep=^loss: printf "loss 2\\\\nsampled xyz\\\\n" -->\nloss 1\nsampled abc\n<!-- doc-check: end -->')"
# sizes that follow the CPU's caches: exact on the recorded CPU, within
# cpu-tolerance elsewhere
check other_cpu_sizes 0 "$(printf '<!-- doc-check: begin cpu=some-other-cpu cpu-tolerance=0.1: echo total 1.05 -->\ntotal 1.00\n<!-- doc-check: end -->')"
check other_cpu_sizes_beyond 1 "$(printf '<!-- doc-check: begin cpu=some-other-cpu cpu-tolerance=0.01: echo total 1.05 -->\ntotal 1.00\n<!-- doc-check: end -->')"
# every path a doc names must exist in the tree (from the root, the doc's
# folder, src/ or include/summa/), link targets included
check path_exists 0 "See \`src/summa/engine.cpp\`, \`summa/engine.hpp\` and [the design](docs/design.md)."
check path_missing 1 "See \`src/summa/no_such_file.cpp\`."
check link_missing 1 "See [the design](docs/no_such_page.md)."
# --update writes the command's output in, and the doc then passes
check update 0 "$(printf '<!-- doc-check: begin: echo fresh -->\nstale\n<!-- doc-check: end -->')" --update
if ! grep -qx fresh "$work/update.md"; then
  echo "FAIL update: the region was not rewritten"; cat "$work/update.md"; failures=$((failures + 1))
fi
"$python" "$root/scripts/doc_check.py" --only "$work/update.md" >/dev/null 2>&1 ||
  { echo "FAIL update: the rewritten doc does not pass"; failures=$((failures + 1)); }
echo "doc_check_selftest: $failures failure(s)"
[ "$failures" = 0 ]
