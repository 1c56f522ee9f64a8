#!/usr/bin/env bash
# The step-time model against measured steps on this machine (docs/scaling.md,
# "Validation here"): calibrates the machine for three GPT sizes (or takes a
# machine file), then runs compare_schemes --predict for every scheme at 1, 2
# and 4 ranks and prints, per model size and rank count, the mean and worst
# |predicted - measured| / measured and where the measured fastest scheme is
# in the predicted order; the same summary as Markdown in OUT/summary.md.
#
#   scripts/validate_time_model.sh [--build DIR] [--machine FILE | --calibrate FILE]
#                                  [--ranks "1 2 4"] [--reps 7] [--repeat 3] [--out DIR]
#                                  [--calibrate-args "ARGS"] [--record FILE]
#                                  [--backend cpu|cuda] [--dtype "f32 bf16"]
#
# --backend cuda validates on a GPU (scripts/gpu_verify.sh's calib step,
# docs/gpu.md): calibrate and compare_schemes with --backend cuda, the
# calibration at one rank (the whole GPU: its GEMM rates by shape and mode,
# kernels and launch overhead; one rank measures no collective, so the
# file's links are placeholders), ranks "1" by default (more ranks would
# share the GPU over mpi_staged, a host-staged path no multi-GPU run takes),
# and two larger GPTs (gpu-small: hidden 512, seq 256; gpu-large: hidden
# 2048, seq 512) for which a GPU step is more than its launches. --dtype
# lists the element types compared (default f32; each its own rows).
#
# --calibrate-args passes ARGS (split on spaces) to calibrate after the
# script's own flags, e.g. --calibrate-args "--passes 3" for a calibration
# that is each figure's median over three whole passes (docs/scaling.md,
# "Calibration you can trust"). It needs --calibrate.
#
# --record FILE keeps the run's lines as a record (bench/records/: a
# provenance line, then each model and rank count's compare_schemes lines),
# which docs/scaling.md renders (scripts/validate_summary.py --record FILE).
#
# Needs a Release build (scripts/quickstart.sh build); timings from the
# checked build (sanitizers, -O0 tests) mean nothing. With 4 ranks on 2
# cores the run is oversubscribed: compare_schemes then predicts with 2
# ranks per core (--ranks-per-device, detected). This machine's speed drifts
# by several per cent over minutes, so each rank count's comparison is run
# --repeat times, interleaved, and a scheme's measured step is the median
# of its runs' medians.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build machine=machines/dev-2core.json calibrate="" calibrate_args="" ranks="" reps=7 repeat=3 record=""
backend=cpu dtypes="f32"
out=/tmp/summa-validate
while (($#)); do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --machine) machine=$2; shift 2 ;;
    --calibrate) calibrate=$2; shift 2 ;;
    --calibrate-args) calibrate_args=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --record) record=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;;
    --dtype) dtypes=$2; shift 2 ;;
    *) echo "validate_time_model: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
case "$backend" in
  cpu) [ -n "$ranks" ] || ranks="1 2 4" ;;
  cuda) [ -n "$ranks" ] || ranks="1" ;;
  *) echo "validate_time_model: --backend '$backend': expected cpu or cuda" >&2; exit 2 ;;
esac
for d in $dtypes; do
  case "$d" in f32 | f64 | bf16) ;; *) echo "validate_time_model: --dtype '$d': expected f32, f64 or bf16" >&2; exit 2 ;; esac
done
if [ -n "$calibrate_args" ] && [ -z "$calibrate" ]; then
  echo "validate_time_model: --calibrate-args '$calibrate_args' needs --calibrate FILE (it is passed to calibrate)" >&2
  exit 2
fi
for tool in compare_schemes calibrate; do
  [ -x "$build/bench/$tool" ] || { echo "validate_time_model: no $build/bench/$tool (build first)" >&2; exit 2; }
done
# shellcheck source=scripts/python.sh
. scripts/python.sh
python=$(summa_python "$build")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mkdir -p "$out"
# name, then compare_schemes' model flags and calibrate's --gpt text
models=(
  "small|--layers 2 --hidden 128 --heads 4 --seq 64 --batch 16 --vocab 1024|layers=2,hidden=128,heads=4,seq=64,batch=16,vocab=1024"
  "medium|--layers 2 --hidden 256 --heads 8 --seq 64 --batch 16 --vocab 2048|layers=2,hidden=256,heads=8,seq=64,batch=16,vocab=2048"
  "large|--layers 2 --hidden 512 --heads 8 --seq 128 --batch 8 --vocab 4096|layers=2,hidden=512,heads=8,seq=128,batch=8,vocab=4096"
)
device=()  # compare_schemes' and calibrate's backend flags
if [ "$backend" = cuda ]; then
  models=(
    "gpu-small|--layers 2 --hidden 512 --heads 8 --seq 256 --batch 8 --vocab 8192|layers=2,hidden=512,heads=8,seq=256,batch=8,vocab=8192"
    "gpu-large|--layers 2 --hidden 2048 --heads 16 --seq 512 --batch 8 --vocab 16384|layers=2,hidden=2048,heads=16,seq=512,batch=8,vocab=16384"
  )
  device=(--backend cuda)
fi
if [ -n "$calibrate" ]; then
  gpt=()
  for m in "${models[@]}"; do gpt+=(--gpt "${m##*|}"); done
  # the calibrated element types: f32 and bf16, and any other compared
  calibrated=f32,bf16
  for d in $dtypes; do [[ ",$calibrated," == *",$d,"* ]] || calibrated+=",$d"; done
  # CPU: 2 ranks, one per core. GPU: one rank, the whole GPU, square GEMMs
  # up to 2048 (its peak needs large products; the GPTs' shapes besides).
  calibrate_np=2 sweep=() label="this development machine (2 cores, CpuBackend, Open MPI shared memory)"
  if [ "$backend" = cuda ]; then
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
    calibrate_np=1 sweep=(--max-size 2048 --reps 5 --min-seconds 0.02)
    label="${gpu:-a GPU} (CudaBackend, one rank; validate_time_model.sh)"
  fi
  # shellcheck disable=SC2086 # calibrate_args is split on spaces on purpose
  mpirun -np "$calibrate_np" "$build/bench/calibrate" --out "$calibrate" --dtype "$calibrated" \
    --ranks "${ranks// /,}" "${sweep[@]}" "${device[@]}" --name "$label" "${gpt[@]}" \
    $calibrate_args
  machine=$calibrate
fi
rm -f "$out"/*.jsonl
for ((run = 1; run <= repeat; ++run)); do
  for m in "${models[@]}"; do
    name=${m%%|*} rest=${m#*|}
    flags=${rest%%|*}
    for dtype in $dtypes; do
      # f32 alone keeps the rows' names of the records before --dtype
      group=$name
      [ "$dtypes" = f32 ] || group=$name-$dtype
      for np in $ranks; do
        echo "validate_time_model: run $run of $repeat, $group model, $np rank(s)" >&2
        # shellcheck disable=SC2086
        mpirun -np "$np" "$build/bench/compare_schemes" $flags --format json --predict "$machine" \
          --reps "$reps" --max-batch 16 --budget-mib 4096 --dtype "$dtype" "${device[@]}" \
          >>"$out/$group-np$np.jsonl" 2>"$out/$group-np$np.log"
      done
    done
  done
done
status=0
"$python" scripts/validate_summary.py "$out" "$machine" || status=$?
if [ -n "$record" ]; then
  "$python" scripts/validate_summary.py --write-record "$record" "$out" "$machine"
fi
exit $status
