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
# --backend cuda: calibrate at one rank on the GPU with its sweep and the GPU
# models' shapes, every compare_schemes run on it in each --dtype (stubs that
# print their flags, calibrate succeeding this time)
printf '#!/bin/sh\necho "stub calibrate on ${OMPI_COMM_WORLD_SIZE:-?} rank(s): $*"\n' >"$work/bench/calibrate"
printf '#!/bin/sh\necho "stub compare_schemes: $*" >&2\n' >"$work/bench/compare_schemes"
out=$(bash "$root/scripts/validate_time_model.sh" --build "$work" --calibrate "$work/m.json" \
  --backend cuda --dtype "f32 bf16" --repeat 1 --out "$work/out" 2>&1)
grep -q -- "stub calibrate on 1 rank(s): --out $work/m.json --dtype f32,bf16 --ranks 1 --max-size 2048 .*--backend cuda .*--gpt layers=2,hidden=512,.* --gpt layers=2,hidden=2048," <<<"$out" ||
  { echo "FAIL: --backend cuda did not reach calibrate as expected:"; echo "$out"; exit 1; }
for f in "$work"/out/gpu-small-bf16-np1.log "$work"/out/gpu-large-f32-np1.log; do
  grep -q -- "stub compare_schemes: --layers 2 --hidden .*--dtype $(basename "$f" | sed 's/.*-\(b\?f[0-9]*\)-np1.log/\1/') --backend cuda" "$f" ||
    { echo "FAIL: $f: compare_schemes did not get the dtype and --backend cuda:"; cat "$f"; exit 1; }
done
n=$(ls "$work"/out/*-np*.log | wc -l)
((n == 4)) || { echo "FAIL: --backend cuda ran $n model x dtype x rank groups, expected 4 (2 models, 2 types, 1 rank):"; ls "$work/out"; exit 1; }
for bad in "--backend rocm" "--dtype f16"; do
  # shellcheck disable=SC2086
  out=$(bash "$root/scripts/validate_time_model.sh" --build "$work" $bad 2>&1)
  rc=$?
  ((rc == 2)) && grep -q "expected" <<<"$out" ||
    { echo "FAIL: '$bad' (exit $rc): $out"; exit 1; }
done
echo "validate_args_check: ok"
