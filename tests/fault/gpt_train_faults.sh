#!/usr/bin/env bash
# The gpt_train fault suite (docs/reliability.md): each case a careless or
# hostile user could make, run with a hard timeout. A case passes when the job
# ends (never hangs), with the expected outcome, an error printed once, and
# every checkpoint, export and log line saved before it left byte-identical.
#
#   tests/fault/gpt_train_faults.sh <mpiexec> "<mpiexec flags>" <gpt_train> <work dir> \
#       [<manifest_edit>]
set -uo pipefail
MPIEXEC=$1
# shellcheck source=tests/fault/common.sh
. "$(dirname "$0")/common.sh"  # FLAGS, fail, finish
EXE=$3
W=$4
EDIT=${5:-}  # tests/fault/manifest_edit.cpp: the manifest cases run with it
rm -rf "$W"
mkdir -p "$W"
DATA="$(cd "$(dirname "$0")/../../examples/data" && pwd)/corpus.txt"  # gpt_train's default --data
SMALL=(--layers 1 --hidden 32 --heads 4 --seq 16 --batch 8 --eval-every 0 --eval-batches 1
       --warmup 2 --progress lines --print-every 1 --export '')

# run <np> <args...>: sets $rc and $out (stdout + stderr); 60 s hard limit.
# With NOSHAPE set, SMALL's model shape flags are left out (a resume takes
# the saved model's; a shape flag given must match it); NOSHAPE=2 leaves out
# --seq and --batch too (the manifest's are read).
run() {
  local np=$1
  shift
  local base=("${SMALL[@]}")
  [ -n "${NOSHAPE:-}" ] && base=("${SMALL[@]:$((NOSHAPE == 2 ? 10 : 6))}")
  out=$(timeout -s KILL 60 "$MPIEXEC" -np "$np" "${FLAGS[@]}" "$EXE" "${base[@]}" "$@" 2>&1)
  rc=$?
  printf '%s\n' "$out" >"$W/last_$case.txt"
}
# expect_error <pattern> <np> <args...>: a clean failure everywhere, printed once.
expect_error() {
  local pattern=$1
  shift
  run "$@"
  if [ "$rc" = 137 ]; then fail "hung (killed after 60 s)"; return; fi
  if [ "$rc" = 0 ]; then fail "succeeded, expected an error matching '$pattern'"; return; fi
  if ! grep -qE -- "$pattern" <<<"$out"; then fail "error does not match '$pattern':"$'\n'"$out"; fi
  local n
  n=$(grep -c "error:" <<<"$out")
  if [ "$n" != 1 ]; then fail "the error was printed $n times (once expected):"$'\n'"$out"; fi
  if grep -q "MPI_ABORT" <<<"$out"; then fail "the job was aborted instead of ending cleanly"; fi
}
expect_ok() {
  run "$@"
  if [ "$rc" != 0 ]; then fail "failed ($rc):"$'\n'"$out"; fi
}
# A checksum of every file a run saved (checkpoints, export, log).
snapshot() { (cd "$1" && find . -type f ! -name '.*gpt_train.lock' -print0 | sort -z |
               xargs -0 sha256sum) 2>/dev/null; }
loss_lines() {  # "<step> <loss>" of every step line (lines that are not JSON are skipped)
  python3 -c '
import json, sys
for line in open(sys.argv[1]):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if "loss" in r:
        print(r["step"], r["loss"])' "$1"
}
# Every log line complete JSON; no step twice; steps 1..N in order.
check_log() {
  local log=$1 n=$2
  if ! python3 -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1])]' "$log"; then
    fail "$log has a line that is not complete JSON"
  fi
  local got
  got=$(loss_lines "$log" | cut -d' ' -f1 | tr '\n' ' ')
  local want
  want=$(seq 1 "$n" | tr '\n' ' ')
  [ "$got" = "$want" ] || fail "$log step lines are '$got', expected '$want'"
}

# ---- a reference run: 6 steps, checkpoints at 2, 4 and 6
case=reference
expect_ok 2 --steps 6 --checkpoint-every 2 --out "$W/ref"
check_log "$W/ref/log.jsonl" 6
fresh() {  # a copy of the reference run's output for a case to damage
  rm -rf "$W/$1"
  cp -a "$W/ref" "$W/$1"
}

# ---- agreement: damaged `latest` (was: rank 0 threw, the others hung)
for kind in garbage empty dotdot huge nul dangling loop; do
  case=latest_$kind
  fresh "$case"
  c="$W/$case/checkpoints"
  rm -f "$c/latest"
  case $kind in
    garbage) head -c 100 /dev/urandom >"$c/latest" ;;
    empty) : >"$c/latest" ;;
    huge) truncate -s 200M "$c/latest" ;;  # refused by its size, not read into memory
    dotdot) echo "../../etc" >"$c/latest" ;;
    nul) printf 'step_0000\0000006' >"$c/latest" ;;  # was: quoted cut off at the NUL
    directory) mkdir "$c/latest" ;;
    dangling) ln -s step_99999999 "$c/latest" ;;  # was: SIGSEGV in find_resume_point
    loop) ln -s latest "$c/latest" ;;  # was: SIGSEGV
  esac
  before=$(snapshot "$c")
  run 2 --steps 6 --resume --out "$W/$case"
  [ "$rc" = 0 ] || fail "--resume did not recover ($rc): $out"
  grep -q "resuming from the newest checkpoint with a valid manifest" <<<"$out" ||
    fail "no note on the damaged latest: $out"
  grep -q "step_00000006" <<<"$out" || fail "did not resume from the newest step: $out"
  case $kind in
    dangling) grep -q "is a dangling symbolic link (to 'step_99999999')" <<<"$out" ||
      fail "the dangling link is not named" ;;
    loop) grep -q "is a symbolic link loop" <<<"$out" || fail "the loop is not named" ;;
    nul) grep -qF "it holds 'step_0000\x00" <<<"$out" || fail "the NUL byte is not shown" ;;
    huge) grep -q "it has 209715200 bytes, more than such a file ever holds" <<<"$out" ||
      fail "the size is not named" ;;
  esac
  [ "$(snapshot "$c" | grep -v ' ./latest')" = "$(grep -v ' ./latest' <<<"$before")" ] ||
    fail "saved checkpoints changed"
done
# a directory as `latest`: every save would fail (a rename cannot replace
# it), so the run is refused at the start, nothing changed (was: resumed,
# then failed at its first save)
case=latest_directory
fresh "$case"
rm -f "$W/$case/checkpoints/latest" && mkdir "$W/$case/checkpoints/latest"
before=$(snapshot "$W/$case")
expect_error "checkpoints/latest is a directory, where the run's 'latest' file goes" 2 --steps 8 \
  --resume --out "$W/$case"
[ "$(snapshot "$W/$case")" = "$before" ] || fail "the saved run changed"
# a FIFO or socket as `latest`: refused at the start the same way, before
# any read could block (was: a hang in open(); then: resumed, trained, and
# failed at every save, which will not replace a FIFO)
for kind in fifo socket; do
  case=latest_$kind
  fresh "$case"
  rm -f "$W/$case/checkpoints/latest"
  if [ "$kind" = fifo ]; then
    mkfifo "$W/$case/checkpoints/latest"
  else
    python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' \
      "$W/$case/checkpoints/latest"
  fi
  before=$(snapshot "$W/$case")
  expect_error "checkpoints/latest is a (FIFO \\(named pipe\\)|socket), where the run's 'latest' file goes" \
    2 --steps 8 --resume --out "$W/$case"
  [ "$(snapshot "$W/$case")" = "$before" ] || fail "the saved run changed"
done
case=latest_and_manifests_damaged
fresh "$case"
echo garbage >"$W/$case/checkpoints/latest"
for m in "$W/$case"/checkpoints/step_*/manifest*; do echo x >>"$m"; done
before=$(snapshot "$W/$case")
expect_error "no step directory has a valid manifest" 2 --steps 8 --resume --out "$W/$case"
grep -q "pass --resume-from <dir>" <<<"$out" || fail "no hint to --resume-from"
[ "$(snapshot "$W/$case")" = "$before" ] || fail "files changed"

# ---- a FIFO where a checkpoint file or an input belongs: refused on every
# rank, named, before any read can block (was: no output until killed, one
# rank blocked in open(), the others in MPI)
for kind in manifest shard; do
  case=${kind}_fifo
  fresh "$case"
  d="$W/$case/checkpoints/step_00000006"
  f=$(ls "$d"/$kind* | head -1)
  rm -f "$f"
  mkfifo "$f"
  expect_error "'$f' is a FIFO \(named pipe\), not a regular file" 2 --steps 8 \
    --resume-from "$d" --out "$W/$case"
done
case=log_fifo
rm -rf "$W/o_logfifo" && mkdir -p "$W/o_logfifo" && mkfifo "$W/o_logfifo/log.fifo"
expect_error "--log: '.*log.fifo' is a FIFO" 2 --steps 1 --out "$W/o_logfifo" \
  --log "$W/o_logfifo/log.fifo"
case=log_fifo_on_resume  # the log the run appends to, replaced by a FIFO
fresh "$case"
rm -f "$W/$case/log.jsonl" && mkfifo "$W/$case/log.jsonl"
expect_error "--log: '.*log.jsonl' is a FIFO" 2 --steps 8 --resume --out "$W/$case"
case=check_batch_fifo
mkfifo "$W/cb.fifo"
expect_error "--check-batch: '.*cb.fifo' is a FIFO" 2 --steps 1 --out "$W/o_cbfifo" \
  --check-batch "$W/cb.fifo"

# ---- agreement: outputs that cannot be created (was: rank 0 threw, the others hung)
case=out_is_file
: >"$W/a_file"
expect_error "--out .*a_file exists and is not a directory" 2 --steps 1 --out "$W/a_file"
case=out_under_file
expect_error "--out: cannot create the directory" 2 --steps 1 --out "$W/a_file/sub"
case=out_read_only
expect_error "--out: cannot create the directory /proc/summa_out" 2 --steps 1 --out /proc/summa_out
case=out_empty
expect_error "--out must name a directory" 2 --steps 1 --out ''
case=log_is_directory
mkdir -p "$W/logdir"
expect_error "--log: '.*logdir' is a directory, not a regular file" 2 --steps 1 \
  --out "$W/o_logdir" --log "$W/logdir"
case=log_under_file
expect_error "--log .*a_file exists and is not a directory" 2 --steps 1 --out "$W/o_logfile" \
  --log "$W/a_file/log.jsonl"
case=check_batch_unwritable
expect_error "--check-batch: cannot create the directory /proc/summa" 2 --steps 1 \
  --out "$W/o_cb" --check-batch /proc/summa/batch.bin

# ---- data loss
case=resume_latest_missing  # was: "starting from scratch" over the saved steps
fresh "$case"
rm "$W/$case/checkpoints/latest"
before=$(snapshot "$W/$case/checkpoints")
run 2 --steps 8 --checkpoint-every 2 --resume --out "$W/$case"
[ "$rc" = 0 ] || fail "failed: $out"
grep -q "resuming from .*step_00000006 (step 6" <<<"$out" || fail "did not resume from step 6: $out"
for s in 2 4 6; do
  [ "$(snapshot "$W/$case/checkpoints" | grep "step_0000000$s")" = \
    "$(grep "step_0000000$s" <<<"$before")" ] || fail "step_$s changed"
done
check_log "$W/$case/log.jsonl" 8
case=fresh_run_over_saved  # a run without --resume never replaces saved checkpoints
fresh "$case"
before=$(snapshot "$W/$case")
expect_error "already holds the checkpoints of a run.*--resume.*--overwrite" 2 --steps 2 \
  --out "$W/$case"
[ "$(snapshot "$W/$case")" = "$before" ] || fail "files changed"
case=overwrite
fresh "$case"
expect_ok 2 --steps 2 --out "$W/$case" --overwrite
[ -d "$W/$case/checkpoints/step_00000006" ] && fail "--overwrite kept the old run's step 6"
check_log "$W/$case/log.jsonl" 2
case=divergence  # --lr 1e30: stops before anything non-finite is saved
fresh "$case"
before=$(snapshot "$W/$case/checkpoints")
# (the hint names gpt_train's flag: TrainerOptions::skip_hint reaches the error)
expect_error "the loss is .* \(not finite\): training stopped before this step's update.*or skip such steps: --on-nonfinite skip" 2 \
  --steps 12 --checkpoint-every 2 --resume --lr 1e30 --out "$W/$case"
for s in 2 4 6; do
  [ "$(snapshot "$W/$case/checkpoints" | grep "step_0000000$s")" = \
    "$(grep "step_0000000$s" <<<"$before")" ] || fail "step_$s changed"
done
[ "$(cat "$W/$case/checkpoints/latest")" = step_00000006 ] ||
  [ "$(cat "$W/$case/checkpoints/latest")" = step_00000008 ] || fail "latest moved to a bad step"
python3 - "$W/$case/checkpoints" <<'EOF' || fail "a saved checkpoint holds non-finite values"
import glob, struct, sys, math
for f in glob.glob(sys.argv[1] + "/step_*/shard_*.bin"):
    data = open(f, "rb").read()[64:]
    vals = struct.unpack("<%df" % (len(data) // 4), data[: len(data) // 4 * 4])
    assert all(math.isfinite(v) for v in vals), f
EOF
case=divergence_skip  # the documented alternative: skip, with a limit
expect_error "after 2 skipped steps in a row \(the limit\)" 2 --steps 12 --lr 1e30 \
  --on-nonfinite skip --max-skipped 2 --out "$W/$case"
case=nan_import  # an imported checkpoint holding NaN
expect_ok 2 --steps 1 --out "$W/exp" --export "$W/exp/export"
poison_safetensors "$W/exp/export/model.safetensors"
expect_error "not finite" 2 --steps 4 --checkpoint-every 1 --import "$W/exp/export" \
  --out "$W/$case"
[ -z "$(ls "$W/$case/checkpoints" 2>/dev/null)" ] || fail "a checkpoint was written"
# ---- a manifest edited by hand and signed again: fields in good text with
# bad values are refused whole, naming the field (were: `seq 1e20` read as 1,
# `batch abc` ended in `stoll` on every rank and MPI_ABORT, n_layer 2e9 grew
# memory for minutes)
if [ -n "$EDIT" ]; then
  # (--seq, --batch and --warmup are on the command line here: their
  # fields are not read; --lr, --clip and --weight-decay are not)
  for edit in "meta lr |meta lr nan|the manifest's lr 'nan' is not a finite number" \
    "meta clip |meta clip 1e999|the manifest's clip '1e999' is not a finite number" \
    "meta weight_decay |meta weight_decay abc|the manifest's weight_decay 'abc' is not a finite" \
    "meta data_seed |meta data_seed -1|the manifest's data_seed '-1' is not a non-negative" \
    "meta n_layer |meta n_layer 2000000000|this model \(n_layer=2000000000.* needs at least .* per rank"; do
    IFS='|' read -r prefix line pattern <<<"$edit"
    case=manifest_$(cut -d' ' -f2 <<<"$prefix")
    fresh "$case"
    "$EDIT" "$W/$case/checkpoints/step_00000006/manifest" "$prefix" "$line" || fail "edit failed"
    before=$(snapshot "$W/$case")
    NOSHAPE=1 expect_error "$pattern" 2 --steps 8 --resume --out "$W/$case"
    [ "$(snapshot "$W/$case")" = "$before" ] || fail "the saved run changed"
  done
  # values that parse but the run cannot take, named with the checkpoint
  # (were: "trainer: batch=0 ..." and "trainer: seq=16 exceeds
  # n_positions=1", naming no file); NOSHAPE=2: the manifest's batch is read
  for edit in "2|meta batch |meta batch 0|--resume: .*step_00000006: the manifest's batch '0' is not an integer >= 1" \
    "1|meta n_positions |meta n_positions 1|--resume: .*step_00000006: the sequence length 16 \(--seq\) is more than the saved model's n_positions=1" \
    "2|meta min_lr |meta min_lr 5|--resume: .*step_00000006: the final learning rate 5 \(the manifest's min_lr\) is more than the learning rate"; do
    IFS='|' read -r noshape prefix line pattern <<<"$edit"
    case=manifest_$(cut -d' ' -f2 <<<"$prefix")
    fresh "$case"
    "$EDIT" "$W/$case/checkpoints/step_00000006/manifest" "$prefix" "$line" || fail "edit failed"
    before=$(snapshot "$W/$case")
    NOSHAPE=$noshape expect_error "$pattern" 2 --steps 8 --resume --out "$W/$case"
    [ "$(snapshot "$W/$case")" = "$before" ] || fail "the saved run changed"
  done
  # gpt_generate names the checkpoint whose manifest holds a model no
  # GPT can be (was: "n_head=0 ...", no file)
  case=generate_manifest_n_head
  fresh "$case"
  "$EDIT" "$W/$case/checkpoints/step_00000006/manifest" "meta n_head " "meta n_head 0" ||
    fail "edit failed"
  out=$(timeout -s KILL 60 "$MPIEXEC" -np 2 "${FLAGS[@]}" "$(dirname "$EXE")/gpt_generate" \
    --checkpoint "$W/$case/checkpoints" --prompt hi 2>&1)
  rc=$?
  printf '%s\n' "$out" >"$W/last_$case.txt"
  echo "[$case] exit $rc: $(grep -m1 error: <<<"$out")"
  [ "$rc" != 0 ] && [ "$rc" != 137 ] || fail "gpt_generate ended with $rc"
  [ "$(grep -cE "gpt_generate: error: --checkpoint .*checkpoints: its manifest: .*n_head" <<<"$out")" = 1 ] ||
    fail "the manifest is not named, once:"$'\n'"$out"
fi
if [ -n "$EDIT" ]; then
  # a negative step (was: accepted, then every rank threw apart and MPI_ABORT):
  # that checkpoint is invalid, named, and the run resumes from the one before
  case=manifest_step_negative
  fresh "$case"
  "$EDIT" "$W/$case/checkpoints/step_00000006/manifest" "step " "step -7" || fail "edit failed"
  expect_ok 2 --steps 8 --resume --out "$W/$case"
  grep -q "step -7 is negative" <<<"$out" || fail "the bad step is not named: $out"
  grep -q "resuming from .*step 4" <<<"$out" || fail "did not resume from step 4: $out"
  # a step that is not its directory's (a copied or renamed step; was:
  # resumed from step 4 under the name step_00000006)
  case=manifest_step_mismatch
  fresh "$case"
  "$EDIT" "$W/$case/checkpoints/step_00000006/manifest" "step " "step 4" || fail "edit failed"
  expect_ok 2 --steps 8 --resume --out "$W/$case"
  grep -q "step 4, but its directory is named step_00000006" <<<"$out" ||
    fail "the mismatch is not named: $out"
  grep -q "resuming from .*step_00000004" <<<"$out" || fail "did not resume from step_00000004: $out"
fi
case=log_disk_full  # a failed log write is an error on every rank, and the
# log keeps whole lines: the disk fills mid-line (SUMMA_FAULT_LOG_LIMIT, as
# the log must be a regular file), the partial line is cut off again
SUMMA_FAULT_LOG_LIMIT=3000 expect_error "writing the log .*log.jsonl failed: No space left on device" \
  2 --steps 40 --out "$W/$case"
python3 -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1])]' "$W/$case/log.jsonl" ||
  fail "the full log ends with a partial line"
[ "$(stat -c %s "$W/$case/log.jsonl")" -le 3000 ] || fail "the log grew past the full disk"
case=log_device  # a device as --log: refused at start
expect_error "--log: '/dev/full' is a character device, not a regular file" 2 --steps 3 \
  --out "$W/$case" --log /dev/full
case=two_jobs_one_out
rm -rf "$W/$case"
timeout -s KILL 120 "$MPIEXEC" -np 2 "${FLAGS[@]}" "$EXE" "${SMALL[@]}" --steps 100000 \
  --out "$W/$case" >"$W/job_a.txt" 2>&1 &
a=$!
for _ in $(seq 100); do grep -q "step " "$W/job_a.txt" 2>/dev/null && break; sleep 0.2; done
expect_error "is in use by another gpt_train job \(host .*pid [0-9]+" 2 --steps 2 \
  --out "$W/$case" --resume
pkill -KILL -f -- "--out $W/$case" 2>/dev/null
kill -KILL $a 2>/dev/null
wait $a 2>/dev/null
case=stale_lock  # the killed job's lock is not held any more
expect_ok 2 --steps 2 --out "$W/two_jobs_one_out" --overwrite

# ---- --log is locked like --out: a second job with another --out but the
# same --log is refused and the first job's log keeps every line (was: the
# second job truncated it)
case=two_jobs_one_log
rm -rf "$W/$case" && mkdir -p "$W/$case"
timeout -s KILL 120 "$MPIEXEC" -np 2 "${FLAGS[@]}" "$EXE" "${SMALL[@]}" --steps 100000 \
  --out "$W/$case/a" --log "$W/$case/shared.jsonl" >"$W/job_l.txt" 2>&1 &
a=$!
for _ in $(seq 150); do
  [ "$(cat "$W/$case/shared.jsonl" 2>/dev/null | grep -c '"loss"')" -ge 3 ] && break
  sleep 0.2
done
before=$(grep -c '"loss"' "$W/$case/shared.jsonl")
expect_error "--log .*shared.jsonl is in use by another gpt_train job \(host .*pid [0-9]+" 2 --steps 2 \
  --out "$W/$case/b" --log "$W/$case/shared.jsonl"
# the same log through a symbolic link (its lock file is found through the
# link) and through a hard link in another directory, --overwrite given (the
# log itself is locked while a job writes it): refused, no line lost
d=$W/$case
ln -sf "$d/shared.jsonl" "$d/link.jsonl"
mkdir -p "$d/other" && ln -f "$d/shared.jsonl" "$d/other/hard.jsonl"
case=two_jobs_one_log_symlink
expect_error "--log .*link.jsonl is in use by another gpt_train job \(host .*pid [0-9]+" 2 \
  --steps 2 --out "$d/c" --log "$d/link.jsonl"
case=two_jobs_one_log_hardlink
expect_error "--log .*hard.jsonl is in use by another gpt_train job \(the same file" 2 \
  --steps 2 --out "$d/e" --log "$d/other/hard.jsonl" --overwrite
after=$(grep -c '"loss"' "$d/shared.jsonl")
[ "$after" -ge "$before" ] || fail "the first job's log lost lines ($before -> $after)"
pkill -KILL -f -- "--out $d/a" 2>/dev/null
wait $a 2>/dev/null

# ---- a fresh run does not cut a log with lines in it (a run that saved no
# checkpoint, or another --out's log) unless told: refused, the log kept;
# --overwrite replaces it
case=fresh_over_log
rm -rf "$W/$case" && mkdir -p "$W/$case"
printf '{"step":1,"loss":5.5}\n' >"$W/$case/log.jsonl"
expect_error "--log .*log.jsonl already holds the log of a run; pass --overwrite" 2 --steps 2 \
  --out "$W/$case"
[ "$(cat "$W/$case/log.jsonl")" = '{"step":1,"loss":5.5}' ] || fail "the refused run changed the log"
expect_ok 2 --steps 2 --out "$W/$case" --overwrite
check_log "$W/$case/log.jsonl" 2

# ---- the --out lock removed by hand mid-run: the next save is refused with
# the reason, and the last checkpoint stays as it was (was: a second job got
# in and the first died in a save with invalid log lines)
case=lock_removed
rm -rf "$W/$case"
timeout -s KILL 120 "$MPIEXEC" -np 2 "${FLAGS[@]}" "$EXE" "${SMALL[@]}" --steps 100000 \
  --checkpoint-every 4 --out "$W/$case" >"$W/job_r.txt" 2>&1 &
r=$!
for _ in $(seq 150); do [ -e "$W/$case/checkpoints/latest" ] && break; sleep 0.2; done
rm -f "$W/$case/.gpt_train.lock"
kept=$(cat "$W/$case/checkpoints/latest" 2>/dev/null)
wait $r
rc=$?
[ "$rc" != 0 ] && [ "$rc" != 137 ] || fail "exit $rc, expected a clean failure: $(tail -3 "$W/job_r.txt")"
n=$(grep -c "the lock file .*.gpt_train.lock was removed while this job ran" "$W/job_r.txt")
[ "$n" = 1 ] || fail "the reason was printed $n times: $(tail -5 "$W/job_r.txt")"
latest=$(cat "$W/$case/checkpoints/latest" 2>/dev/null)
# at most the save under way when the file went, none after it
[ -n "$kept" ] && [ $((10#${latest#step_})) -le $((10#${kept#step_} + 4)) ] ||
  fail "saves went on after the lock was removed ($kept -> $latest)"

# ---- kill -9 of one rank in the middle of a save, then --resume: the
# losses equal the uninterrupted run's, the log has each step once
case=kill_in_save
rm -rf "$W/$case"
SUMMA_FAULT_KILL_IN_SAVE=4:1 run 2 --steps 6 --checkpoint-every 2 --out "$W/$case"
[ "$rc" != 0 ] || fail "the injected kill did not happen"
[ -d "$W/$case/checkpoints/step_00000004" ] && fail "the killed save left a step directory"
[ "$(cat "$W/$case/checkpoints/latest")" = step_00000002 ] || fail "latest is not step 2"
expect_ok 2 --steps 6 --checkpoint-every 2 --resume --out "$W/$case"
grep -q "resuming from .*step 2" <<<"$out" || fail "did not resume from step 2: $out"
check_log "$W/$case/log.jsonl" 6
[ "$(loss_lines "$W/$case/log.jsonl")" = "$(loss_lines "$W/ref/log.jsonl")" ] ||
  fail "resumed losses differ from the uninterrupted run"
# the same with a sharded data axis, where every data group writes its own
# chunk's shard: rank 1 (data group 1) killed after writing it
case=kill_in_sharded_save
ZERO=(--scheme data=2:zero=1,1d:p=1)
rm -rf "$W/$case" "$W/ref_zero"
expect_ok 2 "${ZERO[@]}" --steps 6 --checkpoint-every 2 --out "$W/ref_zero"
SUMMA_FAULT_KILL_IN_SAVE=4:1 run 2 "${ZERO[@]}" --steps 6 --checkpoint-every 2 --out "$W/$case"
[ "$rc" != 0 ] || fail "the injected kill did not happen"
[ -d "$W/$case/checkpoints/step_00000004" ] && fail "the killed save left a step directory"
[ "$(cat "$W/$case/checkpoints/latest")" = step_00000002 ] || fail "latest is not step 2"
[ "$(find "$W/$case/checkpoints/step_00000002" -name 'shard_*.bin' | wc -l)" = 2 ] ||
  fail "step 2 does not hold one shard per data group"
expect_ok 2 "${ZERO[@]}" --steps 6 --checkpoint-every 2 --resume --out "$W/$case"
grep -q "resuming from .*step 2" <<<"$out" || fail "did not resume from step 2: $out"
check_log "$W/$case/log.jsonl" 6
[ "$(loss_lines "$W/$case/log.jsonl")" = "$(loss_lines "$W/ref_zero/log.jsonl")" ] ||
  fail "resumed losses differ from the uninterrupted sharded run"
case=kill_mid_run  # kill -9 between saves: whole log lines, none repeated after resume
rm -rf "$W/$case"
timeout -s KILL 120 "$MPIEXEC" -np 2 "${FLAGS[@]}" "$EXE" "${SMALL[@]}" --steps 100000 \
  --checkpoint-every 3 --out "$W/$case" >"$W/job_k.txt" 2>&1 &
k=$!
for _ in $(seq 150); do
  n=$(grep -c '"loss"' "$W/$case/log.jsonl" 2>/dev/null)
  [ "${n:-0}" -ge 8 ] && break
  sleep 0.2
done
pkill -KILL -f -- "--out $W/$case" 2>/dev/null
wait $k 2>/dev/null
python3 -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1])]' "$W/$case/log.jsonl" ||
  fail "the killed run's log has a partial line"
saved=$(sed 's/step_0*//' "$W/$case/checkpoints/latest")
expect_ok 2 --steps $((saved + 3)) --checkpoint-every 3 --resume --out "$W/$case"
check_log "$W/$case/log.jsonl" $((saved + 3))

rank_pid() {  # the process of world rank $2 of the job writing to --out $1
  local pid
  for pid in $(pgrep -f -- "--out $1"); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
      echo "$pid"
      return
    fi
  done
}

# ---- --watchdog reaches the communicators: one rank stopped (kill -STOP)
# mid-run; the other's wait expires after the limit and the job ends with
# the report naming the stopped rank (was: the flag was replaced by the
# device's grid options, and the job hung)
case=watchdog_stopped_rank
rm -rf "$W/$case"
timeout -s KILL 240 "$MPIEXEC" -np 2 "${FLAGS[@]}" "$EXE" "${SMALL[@]}" --steps 100000 \
  --watchdog 5 --out "$W/$case" >"$W/job_w.txt" 2>&1 &
w=$!
# the first step, then rank 1's process; up to 120 s (the checked build on
# a loaded 2-core machine starts slowly: 30 s once did not reach a step)
stopped=""
for _ in $(seq 600); do
  if grep -q "^step " "$W/job_w.txt" 2>/dev/null; then
    stopped=$(rank_pid "$W/$case" 1)
    [ -n "$stopped" ] && break
  fi
  sleep 0.2
done
if [ -z "$stopped" ]; then
  fail "no rank 1 process found to stop:"$'\n'"$(tail -5 "$W/job_w.txt")"
else
  kill -STOP "$stopped"
  stop_time=$SECONDS
  wait $w 2>/dev/null
  waited=$((SECONDS - stop_time))
  kill -CONT "$stopped" 2>/dev/null
  grep -q "summa watchdog: rank 0 has waited" "$W/job_w.txt" ||
    fail "no watchdog report after rank 1 stopped ($waited s):"$'\n'"$(tail -5 "$W/job_w.txt")"
  grep -q "lagging ranks: 1" "$W/job_w.txt" || fail "the report does not name rank 1"
  [ "$waited" -le 60 ] || fail "the job ended $waited s after rank 1 stopped (limit 5 s)"
fi
pkill -KILL -f -- "--out $W/$case" 2>/dev/null
wait $w 2>/dev/null

# ---- SIGTERM / SIGINT (a scheduler's time limit, Ctrl-C), sent to one rank
# as Slurm sends it to each: the ranks finish the step, save a checkpoint,
# log why and exit 128 + signal; --resume goes on from that step
for sig in TERM INT; do
  case=sig${sig}_mid_run
  rm -rf "$W/$case"
  timeout -s KILL 240 "$MPIEXEC" -np 2 "${FLAGS[@]}" "$EXE" "${SMALL[@]}" --steps 100000 \
    --checkpoint-every 1000 --out "$W/$case" >"$W/job_s.txt" 2>&1 &
  j=$!
  pid=""
  for _ in $(seq 600); do  # up to 120 s, as above
    if [ "$(grep -c '^step ' "$W/job_s.txt")" -ge 3 ]; then
      pid=$(rank_pid "$W/$case" 1)
      [ -n "$pid" ] && break
    fi
    sleep 0.2
  done
  if [ -z "$pid" ]; then fail "no rank 1 process found"; kill -KILL $j; continue; fi
  kill -$sig "$pid"
  wait $j
  rc=$?
  want=$([ $sig = TERM ] && echo 143 || echo 130)
  [ "$rc" = "$want" ] || fail "exit code $rc, expected $want: $(tail -3 "$W/job_s.txt")"
  grep -q "SIG$sig received: stopping after step [0-9]*; saving a checkpoint" "$W/job_s.txt" ||
    fail "no stop message: $(tail -3 "$W/job_s.txt")"
  stopped=$(sed -n "s/.*SIG$sig received: stopping after step \([0-9]*\).*/\1/p" "$W/job_s.txt")
  [ "$(cat "$W/$case/checkpoints/latest" 2>/dev/null)" = "$(printf 'step_%08d' "$stopped")" ] ||
    fail "latest is not step $stopped"
  grep -q "\"stopped\":\"SIG$sig\"" "$W/$case/log.jsonl" || fail "the log does not say why it stopped"
  expect_ok 2 --steps $((stopped + 2)) --resume --out "$W/$case"
  grep -q "resuming from .*step $stopped" <<<"$out" || fail "did not resume from step $stopped"
  check_log "$W/$case/log.jsonl" $((stopped + 2))
done
case=sigterm_in_save  # during a save: the save completes, no second one
rm -rf "$W/$case"
SUMMA_FAULT_KILL_IN_SAVE=4:1:15 run 2 --steps 8 --checkpoint-every 2 --out "$W/$case"
[ "$rc" = 143 ] || fail "exit code $rc, expected 143: $out"
grep -q "SIGTERM received: stopping after step 4 (its checkpoint is saved)" <<<"$out" ||
  fail "no stop message after the save: $out"
[ "$(cat "$W/$case/checkpoints/latest")" = step_00000004 ] || fail "latest is not step 4"
case=sigterm_twice  # a second signal ends the rank at once
rm -rf "$W/$case"
timeout -s KILL 120 "$MPIEXEC" -np 2 "${FLAGS[@]}" "$EXE" "${SMALL[@]}" --steps 100000 \
  --checkpoint-every 1000 --out "$W/$case" >"$W/job_t.txt" 2>&1 &
j=$!
for _ in $(seq 150); do grep -q '^step ' "$W/job_t.txt" && break; sleep 0.2; done
pid=$(rank_pid "$W/$case" 0)
start=$SECONDS
kill -TERM "$pid"; sleep 0.05; kill -TERM "$pid"
wait $j
rc=$?
[ "$rc" != 0 ] && [ "$rc" != 137 ] || fail "exit code $rc after two signals"
[ $((SECONDS - start)) -le 30 ] || fail "the job took $((SECONDS - start)) s to end"
# a signal during the first validation stops the run before its first step,
# reported and logged (was: the rank ended at once, unreported)
case=sigterm_in_first_eval  # a fresh run: nothing trained, nothing saved
SUMMA_FAULT_TERM_IN_FIRST_EVAL=1 run 2 --steps 8 --eval-every 0 --out "$W/$case"
[ "$rc" = 143 ] || fail "exit code $rc, expected 143:"$'\n'"$out"
[ "$(grep -c "SIGTERM received before the first step: nothing trained, nothing saved" <<<"$out")" = 1 ] ||
  fail "no stop message (once):"$'\n'"$out"
[ -e "$W/$case/checkpoints/latest" ] && fail "a checkpoint was saved for a run that trained nothing"
grep -q '"step":0,.*"stopped":"SIGTERM"' "$W/$case/log.jsonl" || fail "the log does not say why it stopped"
case=sigterm_in_first_eval_resume  # a resume: its checkpoint kept, the log cut to it
fresh "$case"
SUMMA_FAULT_TERM_IN_FIRST_EVAL=1 run 2 --steps 8 --resume --out "$W/$case"
[ "$rc" = 143 ] || fail "exit code $rc, expected 143:"$'\n'"$out"
grep -q "SIGTERM received: stopping after step 6 (its checkpoint is saved)" <<<"$out" ||
  fail "no stop message:"$'\n'"$out"
[ "$(cat "$W/$case/checkpoints/latest")" = step_00000006 ] || fail "latest is not step 6"
check_log "$W/$case/log.jsonl" 6

# ---- flags: no crash, no silent clamping or wrap-around, the flag named
case=print_every_0  # was: SIGFPE with stdout not a terminal
expect_ok 2 --steps 2 --print-every 0 --out "$W/$case"
grep -q "^step " <<<"$out" && fail "--print-every 0 printed progress lines"
case=progress_file  # under mpirun with output to a file: lines, no \r or escapes
expect_ok 2 --steps 4 --print-every 2 --progress auto --out "$W/$case"
grep -q $'\r\|\033' <<<"$out" && fail "carriage returns or escape codes in redirected output"
[ "$(grep -c '^step ' <<<"$out")" = 3 ] || fail "expected lines for steps 1, 2, 4: $out"
for bad in "--steps -5:--steps" "--steps 1e20:--steps" "--seed -1:--seed" "--seq 0:--seq" \
           "--min-lr nan:--min-lr" "--min-lr -1:--min-lr" "--lr inf:--lr" \
           "--batch 99999999999:--batch" "--min-lr 1:--min-lr 1.* exceeds --lr"; do
  case="flag ${bad%%:*}"
  read -r -a args <<<"${bad%%:*}"
  expect_error "${bad#*:}" 2 "${args[@]}" --out "$W/flags"
done
case=scheme_overflow
expect_error "--scheme: .*more than an MPI communicator holds" 2 \
  --scheme data=1073741825,1d:p=4 --out "$W/flags"
case=memory  # too large for memory: its size, the budget and a hint
expect_error "needs about .* per rank .* more than the .* of --memory-budget; the largest --batch that fits is [0-9]+" \
  2 --steps 1 --batch 4096 --memory-budget 0.002 --out "$W/mem"
case=bin_upper  # a token file named .BIN is a token file
python3 -c 'import struct,sys; open(sys.argv[1],"wb").write(struct.pack("<4000H",*[i%200 for i in range(4000)]))' \
  "$W/tokens.BIN"
expect_ok 2 --steps 1 --data "$W/tokens.BIN" --out "$W/$case"
grep -q "4000 tokens" <<<"$out" || fail "the .BIN file was not read as 4000 tokens: $out"
case=text_named_bin
head -c 5000 "$(dirname "$0")/../../examples/data/corpus.txt" >"$W/text.bin"
expect_error "holds text; rename it" 2 --steps 1 --data "$W/text.bin" --out "$W/$case"

# what a run writes, named before it trains (were: "Invalid argument" for a
# FIFO lock file, "File exists" for a dangling --out, and a FIFO config.json
# failing the export after the run)
case=lock_fifo
rm -rf "$W/$case" && mkdir -p "$W/$case" && mkfifo "$W/$case/.gpt_train.lock"
expect_error "the lock file .*gpt_train.lock is a FIFO \\(named pipe\\), not a regular file" 2 \
  --steps 1 --out "$W/$case"
case=out_dangling
rm -rf "$W/$case" && ln -s nowhere "$W/$case"
expect_error "--out '.*out_dangling' is a dangling symbolic link \\(to 'nowhere'\\)" 2 --steps 1 \
  --out "$W/$case"
case=export_config_fifo
rm -rf "$W/$case" && mkdir -p "$W/$case/ex" && mkfifo "$W/$case/ex/config.json"
expect_error "--export: '.*config.json' is a FIFO" 2 --steps 1 --out "$W/$case" \
  --export "$W/$case/ex"
[ ! -e "$W/$case/ex/model.safetensors" ] || fail "an export was written beside the FIFO"

# a temporary an export killed mid-write left (kill -9, MPI_Abort) goes with
# the next export of that file; a young one (a live writer's, maybe) stays
# (was: a model-sized model.safetensors.tmp-* left for good)
case=export_stale_temporary
rm -rf "$W/$case" && mkdir -p "$W/$case/ex"
head -c 4096 /dev/urandom >"$W/$case/ex/model.safetensors.tmp-0123456789abcdef"
touch -d '2 hours ago' "$W/$case/ex/model.safetensors.tmp-0123456789abcdef"
: >"$W/$case/ex/model.safetensors.tmp-00000000000000aa"
expect_ok 2 --steps 1 --out "$W/$case/out" --export "$W/$case/ex"
[ ! -e "$W/$case/ex/model.safetensors.tmp-0123456789abcdef" ] || fail "the stale temporary is still there"
[ -e "$W/$case/ex/model.safetensors.tmp-00000000000000aa" ] || fail "a young temporary was removed"
[ -s "$W/$case/ex/model.safetensors" ] || fail "no export written"

# --check-batch never over what a run keeps (was: a checkpoint shard, the
# log or `latest` replaced in place, and the next --resume failed)
for target in checkpoints/latest log.jsonl; do
  case=check_batch_${target//\//_}
  fresh "$case"
  before=$(snapshot "$W/$case")
  last=$(python3 -c 'import json,sys; print(max(json.loads(l)["step"] for l in open(sys.argv[1])))' \
    "$W/$case/log.jsonl")
  expect_error "--check-batch .* (would overwrite what this run keeps|is among the checkpoints of a run)" \
    2 --steps "$((last + 2))" --resume --out "$W/$case" --check-batch "$W/$case/$target"
  [ "$(snapshot "$W/$case")" = "$before" ] || fail "the run's files changed"
done

# --log never among a run's checkpoints, another run's included (was: a
# fresh job with --log naming a run's checkpoints/latest trained, writing its
# log over `latest`), and never over a file that is not a log (was:
# --overwrite cut any file)
for target in checkpoints/latest checkpoints/new.jsonl checkpoints/step_00000002/log.jsonl \
  checkpoints/step_00000099/log.jsonl; do  # the last: a step directory a later save makes
  case=log_among_checkpoints_${target//\//_}
  fresh "$case"
  before=$(snapshot "$W/$case")
  expect_error "--log .* is among the checkpoints of a run \(.*$case/checkpoints" 2 --steps 1 \
    --out "$W/${case}_other" --overwrite --log "$W/$case/$target"
  [ "$(snapshot "$W/$case")" = "$before" ] || fail "the run's files changed"
  # refused before any directory is made (was: step_00000099/ left behind)
  [ -e "$W/$case/checkpoints/step_00000099" ] && fail "a step directory was made"
done
case=log_not_a_log
rm -rf "$W/$case" && mkdir -p "$W/$case" && printf 'my notes\n' >"$W/$case/notes.txt"
expect_error "--log .*notes.txt is a file that is not a gpt_train log" 2 --steps 1 \
  --out "$W/$case/out" --overwrite --log "$W/$case/notes.txt"
[ "$(cat "$W/$case/notes.txt")" = "my notes" ] || fail "notes.txt changed"
# --check-batch never over what the run reads, nor over a file that is not a
# check batch; --export never among a run's checkpoints (was: the run's own
# --data replaced by the batch; an export written into another run's step)
case=check_batch_is_data
rm -rf "$W/$case" && mkdir -p "$W/$case" && cp "$DATA" "$W/$case/corpus.txt"
expect_error "--check-batch .*corpus.txt is a file this run reads" 2 --steps 1 \
  --out "$W/$case/out" --data "$W/$case/corpus.txt" --check-batch "$W/$case/corpus.txt"
cmp -s "$DATA" "$W/$case/corpus.txt" || fail "the corpus changed"
case=check_batch_over_text
rm -rf "$W/$case" && mkdir -p "$W/$case" && printf 'my notes\n' >"$W/$case/notes.txt"
expect_error "--check-batch .*notes.txt \(9 bytes\) is not a check batch of this run" 2 --steps 1 \
  --out "$W/$case/out" --check-batch "$W/$case/notes.txt"
[ "$(cat "$W/$case/notes.txt")" = "my notes" ] || fail "notes.txt changed"
# An existing file is replaced only when it is this run's check batch: 8 x
# batch x seq bytes (1024 here) of int32 ids below the vocabulary (was: a
# UTF-32 text, a character-level uint16 token file, a zero-filled file of
# another size replaced, as they passed a test of int32-looking words)
for kind in utf32 uint16 zeros above_vocab; do
  case=check_batch_over_$kind
  rm -rf "$W/$case" && mkdir -p "$W/$case"
  python3 - "$kind" "$W/$case/file.bin" <<'PY'
import sys
kind, path = sys.argv[1], sys.argv[2]
text = "my notes, kept\n" * 100
data = {"utf32": text.encode("utf-32-le"),
        "uint16": bytes(b for c in text.encode() for b in (c, 0)),
        "zeros": bytes(4096),
        "above_vocab": (100000).to_bytes(4, "little") * 256}[kind]  # 1024 bytes
open(path, "wb").write(data)
PY
  before=$(sha256sum <"$W/$case/file.bin")
  expect_error "--check-batch .*file.bin \([0-9]+ bytes\) is not a check batch of this run" 2 \
    --steps 1 --out "$W/$case/out" --check-batch "$W/$case/file.bin"
  [ "$(sha256sum <"$W/$case/file.bin")" = "$before" ] || fail "file.bin changed"
done
# ... and this run's check batch is: written again by the same run, the same bytes
case=check_batch_again
rm -rf "$W/$case"
expect_ok 2 --steps 1 --out "$W/$case/out" --check-batch "$W/$case/batch.bin"
first=$(sha256sum <"$W/$case/batch.bin")
[ "$(stat -c %s "$W/$case/batch.bin")" = 1024 ] || fail "batch.bin is not 8 x 8 x 16 bytes"
expect_ok 2 --steps 1 --resume --out "$W/$case/out" --check-batch "$W/$case/batch.bin"
[ "$(sha256sum <"$W/$case/batch.bin")" = "$first" ] || fail "the same run wrote another batch"
# An empty file is no check batch either, and a refused run leaves no file
# behind (was: a 0-byte placeholder made at the start, and any 0-byte file
# taken for one)
case=check_batch_empty_file
rm -rf "$W/$case" && mkdir -p "$W/$case" && : >"$W/$case/__init__.py"
expect_error "--check-batch .*__init__.py \(0 bytes\) is not a check batch of this run" 2 \
  --steps 1 --out "$W/$case/out" --check-batch "$W/$case/__init__.py"
case=check_batch_refused_run
rm -rf "$W/$case"
expect_error "--memory-budget" 2 --steps 1 --out "$W/$case/out" --memory-budget 1e-7 \
  --check-batch "$W/$case/cb.bin"
[ -e "$W/$case/cb.bin" ] && fail "a refused run left its --check-batch file"
# a hard link to the run's --data is the file it reads (was: replaced, the
# link broken: the test compared paths only)
case=check_batch_hard_link_to_data
rm -rf "$W/$case" && mkdir -p "$W/$case" && cp "$DATA" "$W/$case/corpus.txt" &&
  ln "$W/$case/corpus.txt" "$W/$case/cb.bin"
expect_error "--check-batch .*cb.bin is a file this run reads" 2 --steps 1 --out "$W/$case/out" \
  --data "$W/$case/corpus.txt" --check-batch "$W/$case/cb.bin"
cmp -s "$DATA" "$W/$case/corpus.txt" || fail "the corpus changed"
# checked again right before the write: the path turned into a link to the
# run's log during training is refused, the log kept (was: the log replaced)
case=check_batch_swapped_for_log
rm -rf "$W/$case" && mkdir -p "$W/$case"
timeout -s KILL 60 "$MPIEXEC" -np 2 "${FLAGS[@]}" "$EXE" "${SMALL[@]}" --steps 300 \
  --print-every 0 --out "$W/$case/out" --check-batch "$W/$case/cb.bin" >"$W/$case/run.txt" 2>&1 &
job=$!
for _ in $(seq 600); do [ -s "$W/$case/out/log.jsonl" ] && break; sleep 0.05; done
ln -s "$W/$case/out/log.jsonl" "$W/$case/cb.bin"
wait "$job"
rc=$?
out=$(cat "$W/$case/run.txt")
if [ "$rc" = 0 ]; then
  fail "succeeded with --check-batch a link to its log"
elif ! grep -q "cb.bin would overwrite what this run keeps" <<<"$out"; then
  fail "not refused at the write:"$'\n'"$out"
fi
check_log "$W/$case/out/log.jsonl" 300
# --export never over the model the run reads, nor over a model that is
# not an earlier export (was: --import replaced; a user's model replaced)
case=export_is_import
expect_error "--export .*exp/export is the model this run reads" 2 --steps 1 \
  --out "$W/${case}_out" --import "$W/exp/export" --export "$W/exp/export"
case=export_over_other_model
rm -rf "$W/$case" && mkdir -p "$W/$case/model" &&
  printf '{"model_type": "gpt2", "n_layer": 1, "transformers_version": "4.40.0"}\n' \
    >"$W/$case/model/config.json" && printf 'weights' >"$W/$case/model/model.safetensors"
before=$(snapshot "$W/$case/model")
expect_error "--export .*model holds a model that is not an earlier export of summa's" 2 \
  --steps 1 --out "$W/$case/out" --export "$W/$case/model"
[ "$(snapshot "$W/$case/model")" = "$before" ] || fail "the model changed"
case=export_among_checkpoints
fresh "$case"
before=$(snapshot "$W/$case")
expect_error "--export .* is among the checkpoints of a run" 2 --steps 1 --out "$W/${case}_other" \
  --export "$W/$case/checkpoints/step_00000002"
[ "$(snapshot "$W/$case")" = "$before" ] || fail "the run's files changed"
# --resume with nothing saved starts afresh: it may not cut another run's log
# (was: cut back to step 0 without --overwrite)
case=resume_nothing_saved_other_log
fresh "$case"
before=$(snapshot "$W/$case")
expect_error "--log .*log.jsonl already holds the log of a run and --out has no checkpoint to resume" \
  2 --steps 2 --resume --out "$W/${case}_other" --log "$W/$case/log.jsonl"
[ "$(snapshot "$W/$case")" = "$before" ] || fail "the run's files changed"
# A resume cuts its log back only when every line is a record of a log or
# the damage a crash leaves (was: a text file whose first line was a record
# lost its other lines)
case=resume_log_other_lines
fresh "$case"
{ head -n 1 "$W/$case/log.jsonl" && printf 'my notes\n'; } >"$W/$case/notes.txt"
before=$(snapshot "$W/$case")
expect_error "--log .*notes.txt: line 2 is not a record of a gpt_train log" 2 --steps 8 \
  --checkpoint-every 2 --resume --out "$W/$case" --log "$W/$case/notes.txt"
[ "$(snapshot "$W/$case")" = "$before" ] || fail "the run's files changed"
# Every record names its run; a resume never cuts another run's log, though
# its every line is a record (was: a copy of another run's log given as
# --log was cut to the checkpoint's step)
case=resume_log_of_another_run
fresh "$case"
grep -q '"run":"[0-9a-f]\{16\}"' "$W/$case/log.jsonl" || fail "the log's records name no run"
sed 's/"run":"[0-9a-f]*"/"run":"0123456789abcdef"/' "$W/$case/log.jsonl" >"$W/$case/other.jsonl"
before=$(snapshot "$W/$case")
expect_error "--log .*other.jsonl: line 1 is a record of another run \(run id .0123456789abcdef." 2 \
  --steps 8 --checkpoint-every 2 --resume --out "$W/$case" --log "$W/$case/other.jsonl"
[ "$(snapshot "$W/$case")" = "$before" ] || fail "the run's files changed"
case=overwrite_log_other_lines  # --overwrite too cuts a log, never notes (was: wiped)
rm -rf "$W/$case" && mkdir -p "$W/$case"
{ head -n 1 "$W/ref/log.jsonl" && printf 'my notes\n'; } >"$W/$case/notes.txt"
before=$(sha256sum <"$W/$case/notes.txt")
expect_error "--log .*notes.txt: line 2 is not a record of a gpt_train log" 2 --steps 1 \
  --out "$W/$case/out" --overwrite --log "$W/$case/notes.txt"
[ "$(sha256sum <"$W/$case/notes.txt")" = "$before" ] || fail "notes.txt changed"
case=resume_log_nul_in_line  # a NUL ends what the parser reads: no record
fresh "$case"
printf '{"step": 9}\0 my notes\n' >>"$W/$case/log.jsonl"
before=$(snapshot "$W/$case")
expect_error "--log .*log.jsonl: line [0-9]+ is not a record of a gpt_train log" 2 --steps 8 \
  --checkpoint-every 2 --resume --out "$W/$case"
[ "$(snapshot "$W/$case")" = "$before" ] || fail "the run's files changed"
case=resume_latest_link_to_device  # refused at the start (was: at the first save)
fresh "$case"
ln -sfn /dev/zero "$W/$case/checkpoints/latest"
expect_error "latest.* (is|where the run's 'latest' file goes)" 2 --steps 8 --checkpoint-every 2 \
  --resume --out "$W/$case"
[ -e "$W/$case/checkpoints/step_00000008" ] && fail "trained before refusing"
case=resume_other_shape  # a shape flag other than the saved model's (was: ignored)
fresh "$case"
before=$(snapshot "$W/$case")
expect_error "the saved model has n_layer=1, not the --layers 2 given" 2 --steps 8 --resume \
  --out "$W/$case" --layers 2
[ "$(snapshot "$W/$case")" = "$before" ] || fail "the run's files changed"
case=resume_log_nul_first_line  # crash damage first: dropped (was: refused as no log)
fresh "$case"
{ head -c 100 /dev/zero && printf '\n' && cat "$W/ref/log.jsonl"; } >"$W/$case/log.jsonl"
expect_ok 2 --steps 8 --checkpoint-every 2 --resume --out "$W/$case"
check_log "$W/$case/log.jsonl" 8
for flag in --import --resume-from; do  # named, not "no such file" or "(missing)"
  case=fifo_${flag#--}
  rm -rf "$W/$case" && mkdir -p "$W/$case" && mkfifo "$W/$case/dir"
  expect_error "$flag .*dir'? is a FIFO.*, not a directory" 2 --steps 1 --out "$W/$case/out" \
    "$flag" "$W/$case/dir"
done
case=resume_log_damaged_tail  # NUL bytes and a record cut short: dropped, the resume goes on
fresh "$case"
{ head -c 3000 /dev/zero && printf '\n{"step": 7, "lo'; } >>"$W/$case/log.jsonl"
expect_ok 2 --steps 8 --checkpoint-every 2 --resume --out "$W/$case"
check_log "$W/$case/log.jsonl" 8
case=log_is_a_json_file  # starts with '{' like a log, but is a pretty-printed JSON file
rm -rf "$W/$case" && mkdir -p "$W/$case" && printf '{\n  "name": "a machine"\n}\n' >"$W/$case/m.json"
expect_error "--log .*m.json is a file that is not a gpt_train log" 2 --steps 1 \
  --out "$W/$case/out" --overwrite --log "$W/$case/m.json"
grep -q '"name": "a machine"' "$W/$case/m.json" || fail "m.json changed"

# a finished run resumed: nothing to train, and its log gains no second
# identical validation line (was: the final val_loss line twice)
case=resume_finished
fresh "$case"
last=$(python3 -c 'import json,sys; print(max(json.loads(l)["step"] for l in open(sys.argv[1])))' \
  "$W/$case/log.jsonl")
expect_ok 2 --steps "$last" --resume --out "$W/$case"
grep -q "nothing to train" <<<"$out" || fail "expected 'nothing to train':"$'\n'"$out"
n=$(grep -cE "\"step\":$last,\"run\":\"[0-9a-f]{16}\",\"val_loss\"" "$W/$case/log.jsonl")
[ "$n" = 1 ] || fail "the log holds $n validation lines at step $last (one expected)"

case=resume_keeps_val  # tenth pass; was: the validation at the checkpoint's step cut and
# re-logged by the resume, so a resume with another --batch lost the value the run logged
fresh "$case"
NOSHAPE=2 expect_ok 2 --steps 8 --batch 4 --seq 16 --resume --out "$W/$case"
want=$(grep -E '"step":6,.*"val_loss"' "$W/ref/log.jsonl")
got=$(grep -E '"step":6,.*"val_loss"' "$W/$case/log.jsonl")
[ -n "$want" ] && [ "$got" = "$want" ] ||
  fail "the validation at step 6 is '$got' (the run logged '$want')"
grep -qE '"step":8,.*"val_loss"' "$W/$case/log.jsonl" || fail "no validation at step 8"

finish "gpt_train fault suite: every case held"
