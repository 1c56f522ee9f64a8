#!/usr/bin/env bash
# Sizes are checked before memory (docs/reliability.md, section 3): every
# program given sizes no node holds (flags, an HF config.json) ends at once
# with one message naming the bytes it needs per rank and what the node has
# (summa/parallel/memory_check.hpp), never with bad_alloc, an abort or minutes
# of growing memory. Each case runs on 2 ranks under a 60 s hard limit and
# must end within 30 s, non-zero, the message printed once.
#
#   tests/fault/sizes_programs.sh <mpiexec> "<mpiexec flags>" <gpt_train> <gpt_generate> \
#       <custom_model> <compare_schemes> <calibrate> <scaling_study> <work dir> \
#       <gpt_memory> <summa_demo>
set -uo pipefail
MPIEXEC=$1
# shellcheck source=tests/fault/common.sh
. "$(dirname "$0")/common.sh"  # FLAGS, fail, finish
TRAIN=$3
GENERATE=$4
CUSTOM=$5
COMPARE=$6
CALIBRATE=$7
STUDY=$8
W=$9
MEMORY=${10}
DEMO=${11}
rm -rf "$W"
mkdir -p "$W"

# refused <pattern> <exe> <args...> (on NP ranks, default 2)
refused() {
  local pattern=$1
  shift
  local t0=$SECONDS
  out=$(timeout -s KILL 60 "$MPIEXEC" -np "${NP:-2}" "${FLAGS[@]}" "$@" 2>&1)
  rc=$?
  local took=$((SECONDS - t0))
  printf '%s\n' "$out" >"$W/$case.txt"
  echo "[$case] exit $rc after $took s: $(grep -m1 -E -- "$pattern" <<<"$out" | cut -c1-160)"
  if [ "$rc" = 137 ]; then fail "killed after 60 s"; return; fi
  [ "$rc" != 0 ] || fail "succeeded"
  [ "$took" -le 30 ] || fail "took $took s"
  local n
  n=$(grep -cE -- "$pattern" <<<"$out")
  [ "$n" = 1 ] || fail "'$pattern' printed $n times (once expected):"$'\n'"$out"
  if grep -qE "bad_alloc|MPI_ABORT|Killed|signal" <<<"$out"; then
    fail "ended in bad_alloc, an abort or a signal:"$'\n'"$out"
  fi
}

case=gpt_train_batch  # was: bad_alloc in the planner (batch-sized position ids)
refused "gpt_train: error: this configuration needs about .* per rank .*the largest --batch that fits is [0-9]+" \
  "$TRAIN" --layers 1 --hidden 32 --heads 4 --seq 16 --batch 1073741824 --steps 1 --export '' \
  --out "$W/train"

case=gpt_train_budget_above_node  # was: passed the check, then bad_alloc on one rank and MPI_Abort
refused "gpt_train: error: --memory-budget 1000000 GiB per rank is more than the .* GiB per rank available on this node" \
  "$TRAIN" --layers 1 --hidden 32 --heads 4 --seq 16 --batch 1073741824 --steps 1 --export '' \
  --memory-budget 1000000 --out "$W/train"

case=compare_schemes_plan_overflow  # was: signed overflow while planning (UBSan abort)
refused "1d:p=2.*beyond 2\^62: no machine holds it" \
  "$COMPARE" --pass plan --seq 16777216 --positions 16777216 --hidden 65536 --heads 65536 \
  --batch 16777216 --layers 1 --vocab 256 --schemes 1d:p=2

hf() {  # an HF directory whose config.json has these fields
  mkdir -p "$W/$case"
  printf '{"model_type": "gpt2", %s}\n' "$1" >"$W/$case/config.json"
}
for v in layers embd vocab positions; do
  case=gpt_generate_hf_$v  # was: minutes of growing memory, or bad_alloc
  case $v in
    layers) hf '"n_layer": 1000000, "n_head": 4, "n_embd": 1024, "n_positions": 16, "vocab_size": 256' ;;
    embd) hf '"n_layer": 1, "n_head": 4, "n_embd": 1048576, "n_positions": 16, "vocab_size": 256' ;;
    vocab) hf '"n_layer": 1, "n_head": 4, "n_embd": 1024, "n_positions": 16, "vocab_size": 2147483646' ;;
    positions) hf '"n_layer": 1, "n_head": 4, "n_embd": 1024, "n_positions": 2147483646, "vocab_size": 256' ;;
  esac
  refused "gpt_generate: error: this model .* needs at least .* per rank .* available on this node" \
    "$GENERATE" --hf "$W/$case" --prompt hi
done

case=compare_schemes_vocab  # was: bad_alloc on every rank
refused "skipped: this model .*vocab=67108864.* needs at least .* per rank" \
  "$COMPARE" --schemes 1d:p=2 --vocab 67108864 --hidden 1024 --heads 4 --reps 1 --warmup 0
case=compare_schemes_tokens
refused "needs .* per rank for its token ids alone" \
  "$COMPARE" --schemes 1d:p=2 --batch 16777216 --seq 16777216
case=calibrate_gpt  # was: killed by the kernel after growing to the node's memory
refused "calibrate: error: --gpt: its f32 GEMM .* needs .* per rank for its operands" \
  "$CALIBRATE" --gpt hidden=1048576,heads=16 --dtype f32 --out "$W/machine.json"
case=calibrate_gpt_unbuildable  # no scheme builds it: refused with the reason (not left out)
refused "calibrate: error: --gpt 'hidden=1048576': no scheme of the rank counts builds it \(1d:p=[0-9]+: .*not divisible by n_head=24\)" \
  "$CALIBRATE" --gpt hidden=1048576 --dtype f32 --out "$W/machine.json"
case=custom_model  # was: uncaught bad_alloc (terminate, SIGABRT)
refused "custom_model: error: --hidden 1048576 --batch 16777216 under 1d:p=2 needs about .* per rank" \
  "$CUSTOM" --hidden 1048576 --batch 16777216

# ---- inputs every rank refuses alike, printed once (were: one copy per
# rank and MPI_ABORT, a silent wrap-around, or NaN weights run to exit 0)
case=generate_nan_weights  # was: token 0 (NUL bytes) generated, exit 0
out=$(timeout -s KILL 60 "$MPIEXEC" -np 2 "${FLAGS[@]}" "$TRAIN" --layers 1 --hidden 32 --heads 4 \
  --seq 16 --batch 8 --steps 1 --out "$W/nan" --export "$W/nan/export" 2>&1) ||
  fail "the export to damage was not written: $out"
poison_safetensors "$W/nan/export/model.safetensors"
refused "gpt_generate: error: --hf .* holds a non-finite value" "$GENERATE" --hf "$W/nan/export" \
  --prompt hi
case=generate_seed_negative  # was: run as 18446744073709551615
refused "--seed: '-1' is not an integer in \[0, " "$GENERATE" --hf "$W/nan/export" --prompt hi --seed -1
case=generate_seed_23_digits
refused "--seed: '12345678901234567890123' is not an integer" "$GENERATE" --hf "$W/nan/export" \
  --prompt hi --seed 12345678901234567890123
case=generate_zero  # was: a sharding level accepted and ignored
refused "gpt_generate: error: --scheme data=2:zero=3,1d:p=1: zero=3 shards training state" \
  "$GENERATE" --hf "$W/nan/export" --prompt hi --scheme data=2:zero=3,1d:p=1
case=generate_pipe  # a pipeline: why not, and the scheme that runs instead
refused "gpt_generate: error: --scheme pipe=2:micro=2,2d:q=1: gpt_generate runs no pipeline.*--scheme data=2,2d:q=1" \
  "$GENERATE" --hf "$W/nan/export" --prompt hi --scheme pipe=2:micro=2,2d:q=1
case=generate_comm  # was: one error per rank, then MPI_ABORT
refused "--comm: carrier-pigeon not in" "$GENERATE" --hf "$W/nan/export" --prompt hi \
  --comm carrier-pigeon
case=train_auto_machine_missing  # was: one error per rank, then MPI_ABORT
refused "gpt_train: error: --scheme auto: machine file .*no-such.json" "$TRAIN" --layers 1 \
  --hidden 32 --heads 4 --seq 16 --batch 8 --steps 1 --export '' --out "$W/auto" \
  --scheme auto --machine "$W/no-such.json"
case=scaling_study_run  # was: bad_alloc building the point's model
printf '{"kind": "weak", "points": [{"gpus": 2, "scheme": "1d:p=2", "batch": 8, "seq": 64, "layers": 2, "hidden": 65536, "heads": 16, "vocab": 1000}]}\n' >"$W/big_study.json"
out=$(timeout -s KILL 60 "$MPIEXEC" -np 2 "${FLAGS[@]}" "$STUDY" --study "$W/big_study.json" --run \
  --predict "$(dirname "$0")/../../machines/dev-2core.json" 2>&1)
rc=$?
echo "[$case] exit $rc: $(grep -m1 "not run" <<<"$out" | cut -c1-160)"
[ "$rc" != 137 ] || fail "killed after 60 s"
[ "$(grep -c "1d:p=2 on 2 device(s) not run: this model .* needs at least .* per rank" <<<"$out")" = 1 ] ||
  fail "the point was not refused once with its bytes:"$'\n'"$out"
! grep -qE "bad_alloc|MPI_ABORT" <<<"$out" || fail "ended in bad_alloc or an abort:"$'\n'"$out"
for flag in "--max-size|0|--max-size: '0' is not an integer in \\[32, " \
  "--dtype|f8|--dtype: 'f8' in 'f8' is not f32, f64 or bf16" \
  "--min-seconds|nan|--min-seconds: 'nan' is not a finite number" \
  "--ranks|65537|--ranks: Value 65537 not in range 1 to 65536"; do
  IFS='|' read -r name value pattern <<<"$flag"
  case=calibrate_$value  # was: a machine file written, and refused when read
  refused "$pattern" "$CALIBRATE" "$name" "$value" --out "$W/machine_$value.json"
  [ ! -e "$W/machine_$value.json" ] || fail "a machine file was written"
done
for value in nan 1e300; do
  case=compare_schemes_budget_$value  # was: accepted (a largest batch of 4096* or 0)
  refused "--budget-mib: '$value' is not a finite number in" "$COMPARE" --schemes 1d:p=2 \
    --pass plan --budget-mib "$value"
done

# ---- the second hostile pass (issue 24)
case=calibrate_out_fifo  # was: the FIFO (as root: /dev/full too) replaced by the machine file
mkfifo "$W/out.fifo"
refused "calibrate: error: --out: '.*out.fifo' is a FIFO \(named pipe\), not a regular file: refusing to replace it" \
  "$CALIBRATE" --out "$W/out.fifo" --max-size 32 --min-seconds 0.01
[ -p "$W/out.fifo" ] || fail "the FIFO was replaced"
case=calibrate_out_directory  # was: refused only after the whole measurement
mkdir -p "$W/out.dir"
refused "calibrate: error: --out: '.*out.dir' is a directory, not a regular file" \
  "$CALIBRATE" --out "$W/out.dir" --max-size 32 --min-seconds 0.01
case=calibrate_out_missing_folder  # was: refused only after the whole measurement
refused "calibrate: error: --out: cannot create the temporary file .*no-such-dir" \
  "$CALIBRATE" --out "$W/no-such-dir/m.json" --max-size 32 --min-seconds 0.01
# ---- the third hostile pass (issue 24)
case=calibrate_out_dangling  # was: the link silently replaced by the machine file
ln -sf nowhere.json "$W/dangling.json"
refused "calibrate: error: --out: '.*dangling.json' is a dangling symbolic link" \
  "$CALIBRATE" --out "$W/dangling.json" --max-size 32 --min-seconds 0.01
[ -L "$W/dangling.json" ] || fail "the link was replaced"
case=calibrate_out_link  # was: the link replaced by a file, its target left stale
echo '{"device": {}, "source": "calibrate (bench/calibrate.cpp) on 2 rank(s)", "old": 1}' >"$W/real.json"  # an earlier calibration
ln -sf real.json "$W/link.json"
out=$(timeout -s KILL 60 "$MPIEXEC" -np 2 "${FLAGS[@]}" "$CALIBRATE" --out "$W/link.json" \
  --max-size 32 --min-seconds 0.001 --dtype f32 2>&1) || fail "calibrate failed: $out"
[ -L "$W/link.json" ] || fail "the link was replaced by a file"
grep -q '"old"' "$W/real.json" && fail "the link's target was not written"
case=calibrate_out_other_file  # was: replaced by the machine file
printf 'my notes\n' >"$W/notes.txt"
refused "calibrate: error: --out: '.*notes.txt' holds something other than a machine file" \
  "$CALIBRATE" --out "$W/notes.txt" --max-size 32 --min-seconds 0.01
[ "$(cat "$W/notes.txt")" = "my notes" ] || fail "the notes were replaced"
case=calibrate_out_hand_written  # eleventh pass; was: a copy of perlmutter.json (published figures) replaced
cp "$(dirname "$0")/../../machines/perlmutter.json" "$W/pm.json"
refused "calibrate: error: --out: '.*pm.json' is a machine file calibrate did not write" \
  "$CALIBRATE" --out "$W/pm.json" --max-size 32 --min-seconds 0.01
cmp -s "$W/pm.json" "$(dirname "$0")/../../machines/perlmutter.json" || fail "pm.json was replaced"
case=calibrate_max_spread_drift  # issue 29: a machine that moves refuses, naming the drift
# --max-spread below any figure's spread: every figure is past it, the drift
# probe's start-to-end change among them; nothing is written
refused "calibrate: error: the figures moved between repetitions \(.*drift \(start to end\) [0-9.]+ %\).*not written \(--max-spread 1e-09\)" \
  "$CALIBRATE" --out "$W/spread.json" --max-size 32 --min-seconds 0.001 --dtype f32 --max-spread 1e-9
[ ! -e "$W/spread.json" ] || fail "a machine file was written"
case=calibrate_ranks_beyond_mesh  # was: SIGFPE in step_gemm_shapes (a 64x64 mesh over hidden 32)
# no scheme of 4096 ranks splits hidden 32: refused, naming the point
out=$(timeout -s KILL 120 "$MPIEXEC" -np 1 "${FLAGS[@]}" "$CALIBRATE" --out "$W/ranks.json" \
  --max-size 32 --min-seconds 0.001 --dtype f32 --ranks 4096 \
  --gpt "layers=1,hidden=32,heads=4,seq=16,batch=8,vocab=256" 2>&1)
rc=$?
echo "[$case] exit $rc"
[ "$rc" != 0 ] && [ "$rc" != 137 ] &&
  grep -q -- "--gpt 'layers=1,hidden=32,heads=4,seq=16,batch=8,vocab=256': no scheme of the rank counts builds it" <<<"$out" ||
  fail "calibrate --ranks 4096 ended with $rc:"$'\n'"$(tail -5 <<<"$out")"
case=generate_hf_link_loop  # was: a raw filesystem_error on every rank, then MPI_ABORT
ln -sf hf_loop_b "$W/hf_loop_a"
ln -sf hf_loop_a "$W/hf_loop_b"
refused "gpt_generate: error: --hf '.*hf_loop_a' is a symbolic link loop" "$GENERATE" \
  --hf "$W/hf_loop_a" --prompt hi
case=compare_schemes_budget_beyond_node  # was: an allocation failure per rank, MPI_ABORT
refused "FAILED 1d:p=2: largest batch not confirmed \(not confirmed by a step \(the budget is more than the node has\): this configuration needs about" \
  "$COMPARE" --reps 1 --layers 1 --hidden 32 --heads 4 --seq 16 --vocab 256 --schemes 1d:p=2 \
  --batch 8 --budget-mib 200000 --max-batch 16777216
case=gpt_memory_overflow  # was: read as -1 ("n_layer=-1 must be positive"), per rank, MPI_ABORT
refused "gpt_memory: error: layers: '99999999999999999999' is not an integer in \[1, 100000\]" \
  "$MEMORY" 99999999999999999999 32 4 16 8 256
case=gpt_memory_size  # was: an allocation of 1.3 EB per rank after 10 s, MPI_ABORT
NP=1 refused "gpt_memory: error: this model .* needs at least .* per rank" "$MEMORY" 100000 1048576 4 16 8 256
case=summa_demo_not_square  # was: printed by every rank
refused "summa_demo: error: mesh2d: 2 ranks per mesh .* is not a square q\*q" "$DEMO"
case=summa_demo_text  # was: run with n=0 to "max relative error -nan -> FAIL"
refused "summa_demo: error: n: 'abc' is not an integer in" "$DEMO" abc
case=summa_demo_size  # was: "cannot create std::vector larger than max_size()"
NP=1 refused "summa_demo: error: n=1048576 on a 1x1 mesh needs about .* per rank" "$DEMO" 1048576
case=study_no_scheme  # was: nlohmann's "key 'scheme' not found"
printf '{"points": [{"gpus": 2, "batch": 8, "hidden": 32, "heads": 4}]}' >"$W/noscheme.json"
refused "study file .*noscheme.json: point 0 has no scheme" "$STUDY" --study "$W/noscheme.json" \
  --predict "$(dirname "$0")/../../machines/dev-2core.json"
case=study_batch_data  # was: predict_step_time's message, naming no point or file
printf '{"points": [{"gpus": 2, "scheme": "data=2,1d:p=1", "batch": 7, "hidden": 32, "heads": 4}]}' \
  >"$W/batchdata.json"
refused "study file .*batchdata.json: point 0: batch=7 must be divisible by the scheme's data=2" \
  "$STUDY" --study "$W/batchdata.json" --predict "$(dirname "$0")/../../machines/dev-2core.json"
case=machine_devices_int  # was: wrapped, then "incomplete description"
sed 's/"devices_per_node": *[0-9]*/"devices_per_node": 2147483648/' \
  "$(dirname "$0")/../../machines/dev-2core.json" >"$W/devices.json"
refused "devices_per_node\" is number 2147483648, expected a positive integer up to 2147483647" "$STUDY" \
  --preset local-weak --predict "$W/devices.json"
case=plot_png_fifo  # was: a Python traceback and a hint about matplotlib
mkfifo "$W/plot-throughput.png"
refused "scaling_study: error: --plot: '.*plot-throughput.png' is a FIFO" "$STUDY" --preset local-weak \
  --predict "$(dirname "$0")/../../machines/dev-2core.json" --plot "$W/plot"
case=generate_checkpoint_file  # was: "no checkpoint at … (missing …)"
refused "gpt_generate: error: checkpoint: '.*devices.json' is a file, not a checkpoint directory" \
  "$GENERATE" --checkpoint "$W/devices.json" --prompt hi
case=generate_checkpoint_fifo  # was: "no checkpoint at … (missing …)"
mkfifo "$W/checkpoint.fifo"
refused "gpt_generate: error: checkpoint: '.*checkpoint.fifo' is a FIFO \(named pipe\), not a checkpoint directory" \
  "$GENERATE" --checkpoint "$W/checkpoint.fifo" --prompt hi
case=machine_number_overflow  # was: one nlohmann out_of_range per rank, then MPI_ABORT
sed 's/"devices_per_node": *[0-9]*/"devices_per_node": 1e400/' \
  "$(dirname "$0")/../../machines/dev-2core.json" >"$W/overflow.json"
grep -q 1e400 "$W/overflow.json" || fail "the machine file was not damaged"
refused "machine file .*overflow.json: not valid JSON: number overflow parsing '1e400'" \
  "$COMPARE" --schemes 1d:p=2 --pass plan --predict "$W/overflow.json"
case=machine_file_huge  # was: read whole (630 MB per rank) before "not valid JSON"
truncate -s 300M "$W/huge.json"
refused "machine file '.*huge.json': 314572800 bytes is larger than the limit of 16777216 bytes" \
  "$COMPARE" --schemes 1d:p=2 --pass plan --predict "$W/huge.json"
rm -f "$W/huge.json"
case=tokenizer_number_overflow  # was: one nlohmann out_of_range per rank, then MPI_ABORT
mkdir -p "$W/tok"
printf '{"a": 1e400}\n' >"$W/tok/vocab.json"
printf '#version: 0.2\n' >"$W/tok/merges.txt"
refused "vocabulary .*vocab.json.*: not valid JSON: number overflow parsing '1e400'" \
  "$GENERATE" --hf "$W/nan/export" --prompt hi --tokenizer "$W/tok"
case=custom_model_block_heads  # was: "hidden=48 must be divisible by heads=7" for --hidden 64
refused "custom_model: error: --block: --heads 7 must divide the block's width 48" \
  "$CUSTOM" --block --heads 7 --hidden 64
case=custom_model_block_seq  # --seq reaches the block's check
refused "custom_model: error: --block: --batch 144 must be whole sequences of --seq 5" \
  "$CUSTOM" --block --seq 5
case=custom_model_block_buffers  # was: 8 TB asked of the backend on every rank, MPI_ABORT
refused "custom_model: error: --batch 1048576 --seq 1048576 --hidden 32 under 1d:p=2: the step buffers need about .* per rank" \
  "$CUSTOM" --block --seq 1048576 --batch 1048576 --hidden 32 --heads 4
case=study_gpus_huge  # was: memory for every rank, then std::bad_alloc
printf '{"kind": "weak", "points": [{"gpus": 2147483647, "scheme": "1d:p=2147483647", "batch": 2147483647, "seq": 64, "layers": 2, "hidden": 64, "heads": 16, "vocab": 1000}]}\n' >"$W/huge_gpus.json"
refused "point 0: gpus=2147483647 is more than this study tool prices \\(1048576\\)" "$STUDY" \
  --study "$W/huge_gpus.json" --predict "$(dirname "$0")/../../machines/dev-2core.json"
for exe in "$TRAIN" "$CUSTOM"; do
  case=$(basename "$exe")_watchdog_tiny  # was: accepted, the job ended in its own set-up
  refused "--watchdog: '0.001' is not 0 \\(off\\) or a number of seconds in \\[0.1, 1e\\+07\\]" \
    "$exe" --watchdog 0.001
done
case=train_data_ids  # was: "TokenLoader: token id …", naming no file
python3 -c 'import sys; sys.stdout.buffer.write(bytes([0x60, 0xea, 0, 0]) * 4096)' >"$W/bad_ids.bin"
refused "gpt_train: error: --data .*bad_ids.bin: token id 60000 at position 0 is outside the vocabulary" \
  "$TRAIN" --layers 1 --hidden 32 --heads 4 --seq 16 --batch 8 --steps 1 --export '' \
  --out "$W/bad_ids" --data "$W/bad_ids.bin"
for gpt in "layers=+2" "hidden= 64" "layers=2,"; do
  case="calibrate_gpt_${gpt//[^a-z0-9]/_}"  # was: accepted
  refused "--gpt '.*': '.*' is not key=positive integer" "$CALIBRATE" --gpt "$gpt" \
    --out "$W/gpt.json"
done
case=study_checkpoint_text  # was: nlohmann's "type must be boolean, but is string"
printf '{"checkpoint": "yes", "points": [{"gpus": 2, "scheme": "1d:p=2", "batch": 8, "hidden": 64, "heads": 4}]}\n' >"$W/checkpoint_text.json"
refused "scaling_study: error: study file .*checkpoint_text.json: \"checkpoint\" is \"yes\", not true or false" \
  "$STUDY" --study "$W/checkpoint_text.json" --predict "$(dirname "$0")/../../machines/dev-2core.json"
case=study_recompute_text
printf '{"recompute": "partial", "points": [{"gpus": 2, "scheme": "1d:p=2", "batch": 8, "hidden": 64, "heads": 4}]}\n' >"$W/recompute_text.json"
refused "scaling_study: error: study file .*recompute_text.json: \"recompute\" 'partial': expected none, full or selective" \
  "$STUDY" --study "$W/recompute_text.json" --predict "$(dirname "$0")/../../machines/dev-2core.json"
case=study_recompute_and_checkpoint
printf '{"recompute": "none", "checkpoint": true, "points": [{"gpus": 2, "scheme": "1d:p=2", "batch": 8, "hidden": 64, "heads": 4}]}\n' >"$W/recompute_twice.json"
refused "scaling_study: error: study file .*recompute_twice.json: \"checkpoint\" and \"recompute\" both given" \
  "$STUDY" --study "$W/recompute_twice.json" --predict "$(dirname "$0")/../../machines/dev-2core.json"
case=study_csv_no_folder  # was: "cannot be written", no reason
refused "scaling_study: error: --csv .*no-such-dir/x.csv: cannot be written: No such file or directory" \
  "$STUDY" --preset local-weak --predict "$(dirname "$0")/../../machines/dev-2core.json" \
  --csv "$W/no-such-dir/x.csv"
case=compare_schemes_flag  # was: CLI11's own text, no "error:", exit 105
refused "compare_schemes: error: --layers: .* \(see --help\)" "$COMPARE" --layers abc
[ "$rc" = 2 ] || fail "exit $rc, expected 2"
case=train_beta2_one  # was: accepted by the flag, then "OptimizerOptions: beta2=1 ..."
refused "gpt_train: error: --beta2: '1' is not a finite number in \[0, 1\)" "$TRAIN" --beta2 1
case=train_offload_negative  # the optimizer offload's bucket (elements) is refused by the flag
refused "gpt_train: error: --offload-bucket: '-5' is not an integer in \[0, 1000000000000000\]" \
  "$TRAIN" --offload-bucket -5
case=train_vocab_scheme  # was: "GPT (1D): vocab_size=1 ...", naming neither flag nor scheme
refused "gpt_train: error: the scheme 1d:p=2 \(the default for 2 ranks; see --scheme\) cannot split this model: vocab_size=1 must be divisible by p=2 \(--vocab\)" \
  "$TRAIN" --vocab 1 --steps 1 --export '' --out "$W/vocab1"
# ---- the ninth hostile pass (issue 24)
case=study_csv_other_file  # was: a user's CSV replaced by the table
printf 'precious csv\n' >"$W/precious.csv"
refused "scaling_study: error: --csv: '.*precious.csv' holds something other than a table \(--csv\) of scaling_study" \
  "$STUDY" --preset local-weak --predict "$(dirname "$0")/../../machines/dev-2core.json" \
  --csv "$W/precious.csv"
[ "$(cat "$W/precious.csv")" = "precious csv" ] || fail "the CSV was replaced"
case=study_plot_other_file  # was: PREFIX.jsonl and the PNGs replaced whatever they held
printf 'my notes\n' >"$W/notes_plot.jsonl"
refused "scaling_study: error: --plot: '.*notes_plot.jsonl' holds something other than the points" \
  "$STUDY" --preset local-weak --predict "$(dirname "$0")/../../machines/dev-2core.json" \
  --plot "$W/notes_plot"
[ "$(cat "$W/notes_plot.jsonl")" = "my notes" ] || fail "the notes were replaced"
printf 'precious\n' >"$W/pic-efficiency.png"
refused "scaling_study: error: --plot: '.*pic-efficiency.png' holds something other than a plot" \
  "$STUDY" --preset local-weak --predict "$(dirname "$0")/../../machines/dev-2core.json" \
  --plot "$W/pic"
[ "$(cat "$W/pic-efficiency.png")" = "precious" ] || fail "the picture was replaced"
case=study_plot_other_png  # tenth pass; was: any PNG replaced (a photo, another matplotlib figure)
rm -f "$W"/fig*
# a PNG's signature, then a tEXt chunk "Software" of matplotlib (CRC not checked)
printf '\211PNG\r\n\032\n\000\000\000\040tEXtSoftware\000Matplotlib version3.6.3\000\000\000\000' \
  >"$W/fig-throughput.png"
cp "$W/fig-throughput.png" "$W/fig-keep.png"
refused "scaling_study: error: --plot: '.*fig-throughput.png' holds something other than a plot \(a PNG\) of scaling_study" \
  "$STUDY" --preset local-weak --predict "$(dirname "$0")/../../machines/dev-2core.json" \
  --plot "$W/fig"
cmp -s "$W/fig-throughput.png" "$W/fig-keep.png" || fail "the PNG was replaced"
case=study_csv_is_plot  # eleventh pass; was: the table written over the start of the plot, exit 0
refused "scaling_study: error: --csv .*same-throughput.png is also a file --plot .*same writes" \
  "$STUDY" --preset local-weak --predict "$(dirname "$0")/../../machines/dev-2core.json" \
  --csv "$W/same-throughput.png" --plot "$W/same"
[ ! -e "$W/same-throughput.png" ] && [ ! -e "$W/same.jsonl" ] || fail "a file was written"
case=study_json_overflow  # was: nlohmann's "[json.exception.out_of_range.406] ..."
printf '{"points": [{"gpus": 1e400, "scheme": "1d:p=2", "batch": 8, "hidden": 64, "heads": 4}]}\n' >"$W/overflow_study.json"
refused "scaling_study: error: study file .*overflow_study.json: not valid JSON: number overflow parsing '1e400'" \
  "$STUDY" --study "$W/overflow_study.json" --predict "$(dirname "$0")/../../machines/dev-2core.json"
case=study_scheme_refuses_model  # was: "GPT (1D): n_head=3 ...", naming no point or file
printf '{"points": [{"gpus": 2, "scheme": "1d:p=2", "batch": 8, "hidden": 6, "heads": 3, "vocab": 64}]}\n' >"$W/heads3.json"
refused "scaling_study: error: study file .*heads3.json: point 0 \(gpus=2, scheme 1d:p=2\): .*n_head=3 must be divisible by p=2" \
  "$STUDY" --study "$W/heads3.json" --predict "$(dirname "$0")/../../machines/dev-2core.json"
case=calibrate_out_empty  # was: measured, then "renaming … over '' failed"
refused "calibrate: error: --out must name a file \(it is empty\)" "$CALIBRATE" --out ''
case=generate_tokenizer_missing  # was: "… holds neither vocab.json + merges.txt …"
refused "gpt_generate: error: --tokenizer '.*no-such-tokenizer' does not exist" "$GENERATE" \
  --hf "$W/nan/export" --prompt hi --tokenizer "$W/no-such-tokenizer"
case=generate_hf_missing  # was: "config file '…': no such file"
refused "gpt_generate: error: --hf '.*no-such-export' does not exist" "$GENERATE" \
  --hf "$W/no-such-export" --prompt hi
case=generate_prompt_empty  # was: "generate: prompt 0 is empty"
refused "gpt_generate: error: --prompt is empty" "$GENERATE" --hf "$W/nan/export" --prompt ''
case=train_import_dangling  # was: "config file '…/config.json': no such file"
ln -sf "$W/nowhere" "$W/import_dangling"
refused "gpt_train: error: --import '.*import_dangling' is a dangling symbolic link" "$TRAIN" \
  --steps 1 --export '' --out "$W/import_out" --import "$W/import_dangling"
case=custom_model_flag  # was: CLI11's text, no "error:", exit 105
refused "custom_model: error: --steps: Value 0 not in range 1 to 1000000 \(see --help\)" \
  "$CUSTOM" --steps 0
[ "$rc" = 2 ] || fail "exit $rc, expected 2"
case=custom_model_lr_nan  # tenth pass; was: accepted (CLI::Range lets nan through), losses nan
refused "custom_model: error: --lr: 'nan' is not a number in \[1e-08, 1\]" "$CUSTOM" --lr nan
case=study_paper_negative  # was: -1 printed as a paper's figure
printf '{"kind": "weak", "points": [{"gpus": 2, "scheme": "1d:p=2", "batch": 8, "hidden": 64, "heads": 4, "paper_fwd_per_sample_s": -1}]}\n' >"$W/paper_negative.json"
refused "point 0: paper_fwd_per_sample_s is -1, not a positive number of seconds" "$STUDY" \
  --study "$W/paper_negative.json" --predict "$(dirname "$0")/../../machines/dev-2core.json"
case=custom_model_seed_negative  # was: -1 wrapped to 2^64-1
refused "--seed: '-1' is not an integer in \\[0, " "$CUSTOM" --seed -1
case=train_top_hex  # was: 0x5 accepted as 5
refused "--top: '0x5' is not an integer in \\[1, 1000\\]" "$TRAIN" --top 0x5
case=generate_eos_range  # was: accepted (an end token the model never generates)
refused "gpt_generate: error: --eos 1000000: not an id the model can generate .*ids 0..255" \
  "$GENERATE" --hf "$W/nan/export" --prompt hi --eos 1000000
case=train_data_link_loop  # was: "no such file"
ln -sf loop_b "$W/loop_a"
ln -sf loop_a "$W/loop_b"
refused "gpt_train: error: --data: text file: '.*loop_a' is a symbolic link loop" "$TRAIN" \
  --data "$W/loop_a" --steps 1 --export '' --out "$W/loop_out"
case=resume_steps_below_warmup  # was: "LrSchedule: total=6 must be ... >= warmup=20"
out=$(timeout -s KILL 60 "$MPIEXEC" -np 2 "${FLAGS[@]}" "$TRAIN" --layers 1 --hidden 32 \
  --heads 4 --seq 16 --batch 8 --steps 25 --checkpoint-every 3 --eval-every 0 --export '' \
  --progress none --out "$W/warm" 2>&1) || fail "the run to resume failed: $out"
echo step_00000003 >"$W/warm/checkpoints/latest"
out=$(timeout -s KILL 60 "$MPIEXEC" -np 2 "${FLAGS[@]}" "$TRAIN" --steps 6 --resume \
  --eval-every 0 --export '' --progress none --out "$W/warm" 2>&1)
rc=$?
printf '%s\n' "$out" >"$W/$case.txt"
echo "[$case] exit $rc: $(grep -m1 "warm-up" <<<"$out")"
[ "$rc" = 0 ] || fail "the resume with --steps 6 failed:"$'\n'"$out"
[ "$(grep -c "gpt_train: the warm-up (20 steps, saved in the checkpoint) is longer than --steps 6: warm-up 6 steps" <<<"$out")" = 1 ] ||
  fail "no note (once) that the warm-up ends at step 6:"$'\n'"$out"
grep -q "warm-up 6, cosine" <<<"$out" || fail "the schedule's warm-up is not 6:"$'\n'"$out"

finish "every program refused sizes no node holds and bad inputs, once, naming them"
