#!/usr/bin/env bash
# scripts/validate_time_model.sh passes --calibrate-args to calibrate: a
# stand-in build directory whose calibrate prints the flags it was given
# (and fails, so the script stops there); the check wants them after the
# script's own, and a refusal of --calibrate-args without --calibrate.
set -uo pipefail
root=$1 work=$2
rm -rf "$work" && mkdir -p "$work/bench"
printf '#!/bin/sh\necho "stub calibrate: $*"\nexit 3\n' >"$work/bench/calibrate"
printf '#!/bin/sh\nexit 0\n' >"$work/bench/compare_schemes"
chmod +x "$work/bench/calibrate" "$work/bench/compare_schemes"
out=$(bash "$root/scripts/validate_time_model.sh" --build "$work" --calibrate "$work/m.json" \
  --calibrate-args "--passes 3 --reps 9" --out "$work/out" 2>&1)
rc=$?
grep -q -- "stub calibrate: --out $work/m.json .*--gpt layers=2,hidden=512[^ ]* --passes 3 --reps 9\$" <<<"$out" ||
  { echo "FAIL: calibrate did not get '--passes 3 --reps 9' last:"; echo "$out"; exit 1; }
((rc != 0)) || { echo "FAIL: a failed calibrate did not fail the script"; exit 1; }
out=$(bash "$root/scripts/validate_time_model.sh" --build "$work" --calibrate-args "--passes 3" 2>&1)
rc=$?
((rc == 2)) && grep -q "needs --calibrate FILE" <<<"$out" ||
  { echo "FAIL: --calibrate-args without --calibrate (exit $rc): $out"; exit 1; }
echo "validate_args_check: ok"
