#!/usr/bin/env bash
# --watchdog reaches every communicator of every program that takes it
# (docs/reliability.md, section 2). Each program runs on 2 ranks (gpt_train
# also on 4, where one report is printed, not one per waiting rank) with
# --watchdog 3 and SUMMA_FAULT_STOP=1:<n>: rank 1 stops itself (SIGSTOP) just
# before its n-th collective (src/comm/communicator.cpp), inside the main
# work, so rank 0 waits for a rank that never arrives. A case passes when the
# job ends within 40 s of its start (a hard limit of 90 s: killed = the flag
# did not reach the communicator, or a raw MPI call of the program waited
# unguarded), non-zero, with rank 0's report naming rank 1.
#
# The cases run four at a time (SUMMA_FAULT_JOBS; each mostly waits out its
# watchdog), each under a marker of its own, and their outputs are printed in
# order at the end.
#
#   tests/fault/watchdog_programs.sh <mpiexec> "<mpiexec flags>" <gpt_train> <gpt_generate> \
#       <custom_model> <compare_schemes> <scaling_study> <work dir>
# shellcheck disable=SC2030,SC2031  # case and failures: each spawned case's own
set -uo pipefail
MPIEXEC=$1
# shellcheck source=tests/fault/common.sh
. "$(dirname "$0")/common.sh"  # FLAGS, fail, finish
TRAIN=$3
GENERATE=$4
CUSTOM=$5
COMPARE=$6
STUDY=$7
W=$8
MACHINE="$(cd "$(dirname "$0")/../../machines" && pwd)/dev-2core.json"
rm -rf "$W"
mkdir -p "$W"
# Every process of a case's job carries the case's marker, so that a
# stopped rank left behind can be found and killed (by its environment: not
# every program takes a path argument to match), and only that case's.
export SUMMA_WATCHDOG_PROGRAMS_TEST="$W/setup"
# Kills what a case left: a rank still stopped, or a job the timeout missed.
kill_leftovers() {
  local pid
  for pid in $(pgrep -f -- "$1"); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null |
      grep -qxF "SUMMA_WATCHDOG_PROGRAMS_TEST=$SUMMA_WATCHDOG_PROGRAMS_TEST"; then
      kill -KILL "$pid" 2>/dev/null
    fi
  done
}

# spawn <case> <command...>: runs the case in the background (at most
# SUMMA_FAULT_JOBS at once, default 4), its output in $W/<case>.log and its
# failure count in $W/<case>.failures; collect prints them in order.
spawned=()
spawn() {
  local name=$1
  shift
  while (($(jobs -rp | wc -l) >= ${SUMMA_FAULT_JOBS:-4})); do wait -n || true; done
  (
    case=$name
    failures=0
    SUMMA_WATCHDOG_PROGRAMS_TEST="$W/$name"
    "$@"
    echo "$failures" >"$W/$name.failures"
  ) >"$W/$name.log" 2>&1 &
  spawned+=("$name")
}
collect() {
  wait
  local name n
  for name in "${spawned[@]}"; do
    cat "$W/$name.log"
    n=$(cat "$W/$name.failures" 2>/dev/null || echo 1)
    failures=$((failures + n))
  done
}

# stopped <n> <exe> <args...>: rank 1 stops before its n-th collective
# (STOP_AT=agree: before its n-th agreement, agree_on: during the set-up;
# STOP_AT=guarded: before its n-th summa::wait_guarded, a program's or the
# library's own MPI request). STOP_RANK=r: rank r stops instead, and the
# report must name it alone, as the likely cause (a pipeline's other stages
# wait on messages, which is no lag of theirs).
stopped() {
  local n=$1 exe=$2 var=SUMMA_FAULT_STOP r=${STOP_RANK:-1}
  [ "${STOP_AT:-}" = agree ] && var=SUMMA_FAULT_STOP_AGREE
  [ "${STOP_AT:-}" = guarded ] && var=SUMMA_FAULT_STOP_GUARDED
  shift 2
  local t0=$SECONDS
  out=$(env "$var=$r:$n" timeout -s KILL 90 "$MPIEXEC" -np "${NP:-2}" "${FLAGS[@]}" "$exe" \
    --watchdog 3 "$@" 2>&1)
  rc=$?
  local took=$((SECONDS - t0))
  printf '%s\n' "$out" >"$W/$case.txt"
  kill_leftovers "$exe"
  echo "[$case] $var=$r:$n: exit $rc after $took s"
  grep -E "summa watchdog:|lagging ranks:|likely cause:" <<<"$out" | sed 's/^/    /'
  if [ "$rc" = 137 ]; then
    fail "hung: killed after 90 s (--watchdog did not reach the collective rank 0 waited in):"$'\n'"$(tail -5 <<<"$out")"
    return
  fi
  [ "$rc" != 0 ] || fail "exited 0: the stop did not land in the work (n=$n too large?)"
  grep -q "summa watchdog: rank 0 has waited" <<<"$out" ||
    fail "no watchdog report from rank 0:"$'\n'"$(tail -5 <<<"$out")"
  grep -q "lagging ranks: $r" <<<"$out" || fail "the report does not name rank $r"
  if [ -n "${STOP_RANK:-}" ]; then
    grep -qx "lagging ranks: $r" <<<"$out" || fail "the report names other ranks than $r as lagging"
    grep -qF "likely cause: rank(s) $r:" <<<"$out" || fail "the report's likely cause is not rank $r"
  fi
  # one report per job, not one per waiting rank (was: 3 at 4 ranks)
  [ "$(grep -c "summa watchdog:" <<<"$out")" = 1 ] ||
    fail "$(grep -c "summa watchdog:" <<<"$out") reports (one expected):"$'\n'"$out"
  [ "$took" -le 40 ] || fail "the job ended $took s after it started (limit 3 s + report)"
}

# with VAR=value... -- <command...>: the command with those variables set
# (in the case's own subshell).
with() {
  while [ "$1" != -- ]; do
    export "${1?}"
    shift
  done
  shift
  "$@"
}

# A checkpoint for gpt_generate (2 steps of a tiny model).
case=checkpoint
out=$(timeout -s KILL 90 "$MPIEXEC" -np 2 "${FLAGS[@]}" "$TRAIN" --steps 2 --layers 1 \
  --hidden 32 --heads 4 --seq 32 --batch 8 --eval-every 0 --progress none --export '' \
  --out "$W/model" 2>&1) || fail "gpt_train could not make the checkpoint:"$'\n'"$out"

spawn scaling_study_run stopped 40 "$STUDY" --preset local-strong --gpus 2 --run --reps 1 --json \
  --predict "$MACHINE"  # the longest first
spawn gpt_train stopped 60 "$TRAIN" --steps 50 --layers 1 --hidden 32 --heads 4 --seq 16 --batch 8 \
  --eval-every 0 --progress none --export '' --out "$W/train"
# 2D on 4 ranks: ranks 0, 2 and 3 wait, rank 0 alone reports
spawn gpt_train_np4 with NP=4 -- stopped 60 "$TRAIN" --steps 50 --layers 1 --hidden 32 --heads 4 \
  --seq 16 --batch 8 --eval-every 0 --progress none --export '' --out "$W/train_np4"
# every guarded wait of gpt_train: the memory checks' reductions, the memory
# all-reduce, the stop-signal all-reduce, the checkpoint's collectives
for n in 1 4 5 8; do  # available memory, memory all-reduce, checkpoint, stop signal
  spawn "gpt_train_guarded_$n" with STOP_AT=guarded -- stopped "$n" "$TRAIN" --steps 4 \
    --checkpoint-every 2 --layers 1 --hidden 32 --heads 4 --seq 16 --batch 8 --eval-every 0 \
    --progress none --export '' --out "$W/train_g$n"
done
# Pipelines: a stage stopped within a step (rank 2, the last of three
# stages, under the message-driven schedule, whose middle stage polls both
# neighbours; rank 1, the middle, under 1F1B); the other stages wait on
# their messages and the report names the stopped stage alone.
spawn gpt_train_pipeline with NP=3 STOP_RANK=2 -- stopped 5 "$TRAIN" --scheme pipe=3:micro=4,2d:q=1 \
  --steps 50 --layers 3 --hidden 32 --heads 4 --seq 16 --batch 8 --eval-every 0 --progress none \
  --export '' --out "$W/train_pipe"
spawn gpt_train_pipeline_1f1b with NP=3 STOP_RANK=1 -- stopped 6 "$TRAIN" \
  --scheme pipe=3:micro=4:schedule=1f1b,2d:q=1 --steps 50 --layers 3 --hidden 32 --heads 4 \
  --seq 16 --batch 8 --eval-every 0 --progress none --export '' --out "$W/train_pipe_1f1b"
spawn gpt_generate stopped 40 "$GENERATE" --checkpoint "$W/model/checkpoints" \
  --prompt "The cat" --greedy --max-new-tokens 24
spawn custom_model stopped 40 "$CUSTOM" --steps 20 --batch 16 --hidden 32
spawn compare_schemes stopped 40 "$COMPARE" --schemes "1d:p=2" --layers 1 --hidden 32 \
  --heads 4 --seq 8 --batch 8 --vocab 64 --reps 2 --warmup 1 --max-batch 8 --format table
# Stopped during the set-up, before any grid exists (agreement 1 builds the
# set-up watchdog itself; 2 is the first on files: --out and its locks, the
# checkpoint and prompts): the programs' set-up watchdog on MPI_COMM_WORLD
# ends the job the same way.
spawn gpt_train_setup with STOP_AT=agree -- stopped 2 "$TRAIN" --steps 50 --layers 1 \
  --hidden 32 --heads 4 --seq 16 --batch 8 --eval-every 0 --progress none --export '' \
  --out "$W/train_setup"
spawn gpt_generate_setup with STOP_AT=agree -- stopped 2 "$GENERATE" \
  --checkpoint "$W/model/checkpoints" --prompt "The cat" --greedy --max-new-tokens 24
spawn custom_model_setup with STOP_AT=agree -- stopped 3 "$CUSTOM" --steps 20 --batch 16 --hidden 32
# blocked_stop <variable> <case> <report pattern> <exe> <args...>: rank 1
# stops at the first point <variable> names (SUMMA_FAULT_STOP_AGREE / _GRID /
# _SPLIT / _FINALIZE=1:1), with --watchdog 3 and $EXTRA_ENV (e.g.
# SUMMA_INIT_TIMEOUT=4, finalize_mpi's limit); rank 0 must report (the
# pattern) once and the job end, non-zero, within 40 s.
blocked_stop() {
  local var=$1 pattern=$3 exe=$4 t0 took
  case=$2
  shift 4
  t0=$SECONDS
  # shellcheck disable=SC2086  # EXTRA_ENV: assignments, split on purpose
  out=$(env "$var=1:1" ${EXTRA_ENV:-} timeout -s KILL 90 "$MPIEXEC" -np 2 "${FLAGS[@]}" "$exe" \
    --watchdog 3 "$@" 2>&1)
  rc=$?
  took=$((SECONDS - t0))
  printf '%s\n' "$out" >"$W/$case.txt"
  kill_leftovers "$exe"
  echo "[$case] $var=1:1: exit $rc after $took s"
  grep -E "summa watchdog:" <<<"$out" | sed 's/^/    /'
  [ "$rc" != 137 ] || fail "hung: killed after 90 s"
  [ "$rc" != 0 ] || fail "exited 0: the stop did not land"
  grep -q "$pattern" <<<"$out" || fail "no report from rank 0:"$'\n'"$(tail -5 <<<"$out")"
  [ "$(grep -c "summa watchdog:" <<<"$out")" = 1 ] ||
    fail "the report is not printed once:"$'\n'"$out"
  [ "$took" -le 40 ] || fail "the job ended $took s after it started (limit 3 s)"
}
# set_up_stop <variable> <case suffix> <report pattern>: blocked_stop in each
# program's set-up.
set_up_stop() {
  local exe
  for exe in "$TRAIN" "$GENERATE" "$CUSTOM" "$COMPARE"; do
    args=()
    case $(basename "$exe") in
    gpt_train) args=(--steps 20 --layers 1 --hidden 32 --heads 4 --seq 16 --batch 8
      --eval-every 0 --progress none --export '' --out "$W/$2") ;;
    gpt_generate) args=(--checkpoint "$W/model/checkpoints" --prompt "The cat" --greedy
      --max-new-tokens 4) ;;
    custom_model) args=(--steps 3) ;;
    compare_schemes) args=(--schemes "1d:p=2" --layers 1 --hidden 32 --heads 4 --seq 8
      --batch 8 --vocab 64 --reps 1 --warmup 1 --max-batch 8 --format table) ;;
    esac
    spawn "$(basename "$exe")_$2" blocked_stop "$1" "$(basename "$exe")_$2" "$3" "$exe" \
      "${args[@]}"
  done
}
# Stopped before the first agreement, the set-up watchdog's own (on its
# limit, before any watchdog exists): it waits under the rank's own limit
# (was: a hang in gpt_train, gpt_generate, compare_schemes, scaling_study,
# custom_model).
set_up_stop SUMMA_FAULT_STOP_AGREE first_agreement \
  "summa watchdog: rank 0 has waited .* before any watchdog exists"
# Stopped in a process grid's set-up, before its communicators are split:
# the other rank waits in MPI_Comm_split_type / MPI_Comm_split, blocking calls
# no watchdog can poll; the grid's running-time limit (--watchdog plus the
# report time) ends the job with status 3 and one line naming the call
# (was: a hang).
set_up_stop SUMMA_FAULT_STOP_GRID grid_setup \
  "summa watchdog: world rank 0 has waited .* in the process grid's set-up"

# Stopped after the work, before MPI_Finalize: the other rank waits in
# MPI_Finalize, which finalize_mpi runs under init_mpi's limit
# (SUMMA_INIT_TIMEOUT here): one line, status 3 (was: a hang).
spawn gpt_train_finalize with EXTRA_ENV=SUMMA_INIT_TIMEOUT=4 -- blocked_stop \
  SUMMA_FAULT_STOP_FINALIZE gpt_train_finalize \
  "summa watchdog: world rank 0 has waited 4 s in MPI_Finalize" "$TRAIN" --steps 2 --layers 1 \
  --hidden 32 --heads 4 --seq 16 --batch 8 --eval-every 0 --progress none --export '' \
  --out "$W/finalize"
spawn custom_model_finalize with EXTRA_ENV=SUMMA_INIT_TIMEOUT=4 -- blocked_stop \
  SUMMA_FAULT_STOP_FINALIZE custom_model_finalize \
  "summa watchdog: world rank 0 has waited 4 s in MPI_Finalize" "$CUSTOM" --steps 3
# scaling_study --run splits the launch for each point (a blocking
# MPI_Comm_split): under --watchdog's limit (was: a hang).
spawn scaling_study_split blocked_stop SUMMA_FAULT_STOP_SPLIT scaling_study_split \
  "summa watchdog: world rank 0 has waited 5 s in scaling_study's MPI_Comm_split" "$STUDY" \
  --preset local-strong --gpus 2 --run --reps 1 --json --predict "$MACHINE"

# Stopped inside MPI_Init, before any summa communicator exists: the other
# rank waits in Open MPI's start-up, and init_mpi's timer (SUMMA_INIT_TIMEOUT,
# else --watchdog at least 30 s) ends it with status 4 and one line.
init_case() {
  local exe=$1 t0 took
  t0=$SECONDS
  out=$(SUMMA_FAULT_STOP_INIT=1 SUMMA_INIT_TIMEOUT=4 timeout -s KILL 90 "$MPIEXEC" -np 2 \
    "${FLAGS[@]}" "$exe" --watchdog 3 --help 2>&1)
  rc=$?
  took=$((SECONDS - t0))
  printf '%s\n' "$out" >"$W/$case.txt"
  kill_leftovers "$exe"
  echo "[$case] SUMMA_FAULT_STOP_INIT=1: exit $rc after $took s"
  grep -E "MPI_Init did not finish" <<<"$out" | sed 's/^/    /'
  [ "$rc" != 137 ] || fail "hung in MPI_Init: killed after 90 s"
  [ "$rc" != 0 ] || fail "exited 0: rank 1 did not stop in MPI_Init"
  grep -q "summa: rank 0: MPI_Init did not finish within 4 s" <<<"$out" ||
    fail "no report from rank 0:"$'\n'"$(tail -5 <<<"$out")"
  # once: the stopped rank, continued by the launcher as it ends the job,
  # counts only the time it ran (was: it blamed "another rank" too)
  [ "$(grep -c "MPI_Init did not finish" <<<"$out")" = 1 ] ||
    fail "the report is not printed once:"$'\n'"$out"
  [ "$took" -le 40 ] || fail "the job ended $took s after it started (limit 4 s)"
}
for exe in "$TRAIN" "$GENERATE" "$CUSTOM" "$COMPARE" "$STUDY"; do
  spawn "$(basename "$exe")_init" init_case "$exe"
done
collect

[ "$failures" = 0 ] || echo "outputs in $W"
finish "every program's --watchdog ended its stopped job"
