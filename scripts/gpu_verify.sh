#!/usr/bin/env bash
# gpu_verify.sh: the one-shot verification of summa on an NVIDIA GPU (issue 6).
#
# Run from the repository root on a machine with a GPU:
#
#   scripts/gpu_verify.sh            # everything, within --budget seconds (default 570)
#   scripts/gpu_verify.sh --quick    # a subset in about 5 minutes (--budget 290)
#
# Options: --out DIR, --build-dir DIR (default build-gpu; a second run reuses
# it, so a build cut short by the budget continues), --arch 90, --jobs N,
# --budget SECONDS, --skip-build, --deps DIR (default .gpu_deps), --steps LIST
# (of test,gemm,block,torch,calib; default all: e.g. a second call after a first
# one ran out of time: --skip-build --steps gemm,block,torch,calib). CTEST_JOBS
# (default 8) sets ctest's parallelism.
#
# Steps (each logged; a failing step does not stop the others):
#   env    GPU, driver, nvcc, compilers, MPI, CMake, PyTorch: what the machine has
#   deps   MPI / Eigen / fmt / GoogleTest / CLI11 missing? unpack the Debian
#          packages carried in .gpu_deps/ (made here by --fetch-deps) into a
#          private prefix; NCCL missing from the toolkit? use pip's nvidia-nccl
#   build  configure (Release, SUMMA_CUDA=ON, SUMMA_CUDA_ARCHITECTURES=90) and
#          build the cuda-labelled tests and the benchmarks; when the strict
#          build fails it is retried without -Werror (another compiler may warn
#          where GCC 12 does not) and the summary says so
#   test   ctest -L cuda --output-on-failure (every cuda test; one that says
#          "Skipped" on a GPU machine counts as a failure)
#   gemm   bench/summa_gemm --backend cuda, q = 1, against cublasGemmEx in the
#          same run (acceptance: vs_cublas >= 0.85), plus a checked q = 2 run
#          (4 ranks sharing the GPU over mpi_staged)
#   block  bench/gpt_layer --backend cuda --what block for the configurations below
#          (f32, TF32, bf16), AdamW's step on the GPU and offloaded (--what
#          optimizer, bf16, 235 M parameters); without --quick also the whole GPT on 4 ranks and
#          compare_schemes --backend cuda (bf16, every 4-rank scheme, then four
#          pipelines, one per schedule: bytes per axis equal to the closed form)
#   torch  bench/torch_block.py --device cuda for the same configurations
#          (explicit attention, and --sdpa), if torch with CUDA imports
#   calib  the step-time model on the GPU (issue 29): scripts/validate_time_model.sh
#          --backend cuda, i.e. calibrate --backend cuda at one rank, then
#          compare_schemes --backend cuda --predict with that file for every
#          one-rank scheme of two GPTs in f32 and bf16; its verdict is reported,
#          not a failure (the model's error is a measurement); a run that breaks
#          is one (32). Not with --quick unless --steps names it.
#   ratio  bench/gpu_ratio.py over every JSON line: the summary tables
# calib runs last, on the budget left (at least 120 s; else it is reported
# skipped, and a second call on the warm machine runs it: --skip-build
# --steps calib): the tests, the offload measurement and the ratios come first.
#
# Output, in --out (default: $OUT when set, else ./gpu_verify_out), at most
# eight files so that the device tool brings all of them back:
#   summary.txt    step statuses, the ratio tables, the first errors
#   results.jsonl  every JSON line of summa_gemm, gpt_layer, compare_schemes and torch_block.py
#   validate_cuda.jsonl  calib's record (scripts/validate_summary.py --record renders it;
#                  its machine file, machine_cuda.json, is in logs.tar.gz)
#   env.txt        the machine
#   build.log      configure + build (tail, when long)
#   ctest.log      ctest -L cuda output
#   bench.log      the benchmarks' stderr / stdout
#   logs.tar.gz    every log in full
#
# Exit status: 0 when every step that ran passed; otherwise the sum of
#   1 env/deps  2 build  4 test  8 gemm run  16 gemm below 85 % of cuBLAS
#   32 block, or calib broke (no record)
#   64 torch (torch with CUDA missing is reported, not a failure)
#   128 a step skipped for lack of time
#
# On a machine WITH apt and internet (not the GPU machine):
#   scripts/gpu_verify.sh --fetch-deps   # downloads the Debian packages into .gpu_deps/
# and carry .gpu_deps with the device call (bench/README.md, "GPU").
set -u

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
QUICK=0
BUDGET=""
OUTDIR="${OUT:-$ROOT/gpu_verify_out}"
BUILD="$ROOT/build-gpu"
ARCH=90
JOBS=$(nproc 2>/dev/null || echo 4)
DEPS_DIR="$ROOT/.gpu_deps"
FETCH=0
SKIP_BUILD=0
STEPS="test,gemm,block,torch,calib"
STEPS_GIVEN=0
# One Python for the whole run: $SUMMA_PYTHON, else python3 on PATH (on a GPU
# machine, the one whose torch has CUDA); the build records it (SUMMA_PYTHON).
PY="${SUMMA_PYTHON:-$(command -v python3 || echo python3)}"

usage() { sed -n '2,/^set -u/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//;/^set -u/d'; }

while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --budget) BUDGET="$2"; shift ;;
    --out) OUTDIR="$2"; shift ;;
    --build-dir) BUILD="$2"; shift ;;
    --arch) ARCH="$2"; shift ;;
    --jobs) JOBS="$2"; shift ;;
    --deps) DEPS_DIR="$2"; shift ;;
    --skip-build) SKIP_BUILD=1 ;;
    --steps) STEPS="$2"; STEPS_GIVEN=1; shift ;;
    --fetch-deps) FETCH=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_verify.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

# ------------------------------------------------------------------ --fetch-deps
# The build dependencies as Debian 12 packages (Open MPI with the libraries it
# loads, Eigen, fmt, nlohmann-json, xxHash, PCRE2, GoogleTest, CLI11, and
# pkg-config, which finds libxxhash.pc and libpcre2-8.pc under
# CMAKE_PREFIX_PATH), nothing of a base system (libc, libpcre2-8-0, the
# compiler runtime: the GPU machine has its own, and a second libc on
# LD_LIBRARY_PATH would break it). About 10 MB.
DEB_PACKAGES="libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common libpmix2 libhwloc15
  libevent-core-2.1-7 libevent-pthreads-2.1-7 libfabric1 libucx0 libibverbs1 ibverbs-providers
  librdmacm1 libpsm2-2 libpsm-infinipath1 libnl-3-200 libnl-route-3-200 libnuma1 libmunge2
  libltdl7 libxnvctrl0 libpciaccess0 libeigen3-dev libfmt-dev libfmt9 libgtest-dev googletest
  libcli11-dev nlohmann-json3-dev libxxhash-dev libxxhash0 libpcre2-dev libpcre2-16-0
  libpcre2-32-0 libpcre2-posix3 pkgconf pkgconf-bin libpkgconf3"
if [ "$FETCH" = 1 ]; then
  command -v apt-get >/dev/null || { echo "--fetch-deps needs apt-get" >&2; exit 2; }
  mkdir -p "$DEPS_DIR"
  [ -d "$ROOT/.git" ] && mkdir -p "$ROOT/.git/info"
  grep -qx '/.gpu_deps/' "$ROOT/.git/info/exclude" 2>/dev/null ||
    echo '/.gpu_deps/' >>"$ROOT/.git/info/exclude"
  echo "gpu_verify.sh: downloading $(echo $DEB_PACKAGES | wc -w) packages into $DEPS_DIR"
  (cd "$DEPS_DIR" && apt-get download $DEB_PACKAGES) || { echo "apt-get download failed" >&2; exit 1; }
  du -sh "$DEPS_DIR"
  echo "carry it: run(carry=[\".gpu_deps\"], command=\"scripts/gpu_verify.sh\")"
  exit 0
fi

[ -n "$BUDGET" ] || { [ "$QUICK" = 1 ] && BUDGET=290 || BUDGET=570; }
want() { case ",$STEPS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
# Keep the outputs out of `git status` in a checkout (no-op elsewhere).
if [ -d "$ROOT/.git" ]; then
  mkdir -p "$ROOT/.git/info"
  for p in /gpu_verify_out/ /.gpu_deps/; do
    grep -qxF "$p" "$ROOT/.git/info/exclude" 2>/dev/null || echo "$p" >>"$ROOT/.git/info/exclude"
  done
fi
START=$(date +%s)
mkdir -p "$OUTDIR"
WORK=$(mktemp -d /tmp/gpu_verify.XXXXXX)
LOG="$WORK/logs"
mkdir -p "$LOG"
: >"$OUTDIR/results.jsonl"
SUMMARY="$WORK/summary.txt"
: >"$SUMMARY"
STATUS=0
declare -a STEP_LINES=()

elapsed() { echo $(($(date +%s) - START)); }
left() { echo $((BUDGET - $(elapsed))); }
note() { echo "[gpu_verify $(elapsed)s] $*" | tee -a "$LOG/steps.log" >&2; }
record() {  # record <step> <status text> [exit bit]
  STEP_LINES+=("$(printf '%-7s %s' "$1" "$2")")
  [ -n "${3:-}" ] && STATUS=$((STATUS | $3))
  note "$1: $2"
}
# enough <seconds>: true when that much of the budget is left
enough() { [ "$(left)" -ge "$1" ]; }
# run_logged <logfile> <timeout seconds> <command...>: output to the log; exit status
run_logged() {
  local logfile=$1 limit=$2
  shift 2
  [ "$limit" -lt 10 ] && limit=10
  echo "\$ $*" >>"$logfile"
  timeout --kill-after=10 "$limit" "$@" >>"$logfile" 2>&1
}
json_lines() { grep -E '^\{' "$1" >>"$OUTDIR/results.jsonl" 2>/dev/null || true; }

# ------------------------------------------------------------------ env
{
  echo "date: $(date -u)"; echo "host: $(uname -a)"; echo "user: $(id)"
  echo "repo: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null) (dirty files: $(git -C "$ROOT" status --short 2>/dev/null | wc -l))"
  echo "--- nvidia-smi"; nvidia-smi 2>&1 | head -20
  echo "--- nvcc"; (command -v nvcc || ls /usr/local/cuda/bin/nvcc) 2>&1; (nvcc --version || /usr/local/cuda/bin/nvcc --version) 2>&1 | tail -2
  echo "--- c++"; (c++ --version || g++ --version) 2>&1 | head -1
  echo "--- cmake"; cmake --version 2>&1 | head -1; echo "ninja $(ninja --version 2>&1)"
  echo "--- mpi"; (command -v mpicxx mpirun; mpirun --version) 2>&1 | head -4
  echo "--- headers"; for f in /usr/include/eigen3/Eigen/Core /usr/include/fmt/core.h /usr/include/gtest/gtest.h /usr/include/CLI/CLI.hpp /usr/local/cuda/include/nccl.h /usr/include/nccl.h; do [ -e "$f" ] && echo "have $f" || echo "MISSING $f"; done
  echo "--- python"; echo "$PY"; "$PY" -c 'import torch,sys; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>&1 | tail -1
  echo "--- os"; head -2 /etc/os-release 2>/dev/null; echo "cores $(nproc)"
} >"$OUTDIR/env.txt" 2>&1
if nvidia-smi -L >/dev/null 2>&1; then record env "ok: $(nvidia-smi -L 2>/dev/null | head -1)"
else record env "FAILED: nvidia-smi sees no GPU (see env.txt)" 1; fi

# ------------------------------------------------------------------ deps
export PATH="/usr/local/cuda/bin:$PATH"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
CMAKE_EXTRA=()
missing=()
command -v mpicxx >/dev/null || missing+=(mpi)
[ -e /usr/include/eigen3/Eigen/Core ] || missing+=(eigen)
[ -e /usr/include/fmt/core.h ] || missing+=(fmt)
[ -e /usr/include/nlohmann/json.hpp ] || missing+=(nlohmann-json)
[ -e /usr/include/xxhash.h ] || missing+=(xxhash)
[ -e /usr/include/pcre2.h ] || missing+=(pcre2)
command -v pkg-config >/dev/null || missing+=(pkg-config)
[ -e /usr/include/gtest/gtest.h ] || missing+=(gtest)
[ -e /usr/include/CLI/CLI.hpp ] || missing+=(cli11)
if [ ${#missing[@]} -gt 0 ]; then
  if ls "$DEPS_DIR"/*.deb >/dev/null 2>&1; then
    PREFIX=/tmp/summa-deps
    mkdir -p "$PREFIX"
    # Only the packages of what is missing: a second Open MPI beside the
    # machine's own (its PMIx plugins loading the other's libraries) breaks both.
    wanted=""
    for m in "${missing[@]}"; do
      case $m in
        mpi) wanted+=" libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common libpmix2 libhwloc15
               libevent-core-2.1-7 libevent-pthreads-2.1-7 libfabric1 libucx0 libibverbs1
               ibverbs-providers librdmacm1 libpsm2-2 libpsm-infinipath1 libnl-3-200
               libnl-route-3-200 libnuma1 libmunge2 libltdl7 libxnvctrl0 libpciaccess0" ;;
        eigen) wanted+=" libeigen3-dev" ;;
        fmt) wanted+=" libfmt-dev libfmt9" ;;
        nlohmann-json) wanted+=" nlohmann-json3-dev" ;;
        xxhash) wanted+=" libxxhash-dev libxxhash0" ;;
        pcre2) wanted+=" libpcre2-dev libpcre2-16-0 libpcre2-32-0 libpcre2-posix3" ;;
        pkg-config) wanted+=" pkgconf pkgconf-bin libpkgconf3" ;;
        gtest) wanted+=" libgtest-dev googletest" ;;
        cli11) wanted+=" libcli11-dev" ;;
      esac
    done
    unpacked=0
    for pkg in $wanted; do
      for f in "$DEPS_DIR/${pkg}"_*.deb; do
        [ -e "$f" ] || { echo "no $pkg in $DEPS_DIR" >>"$LOG/deps.log"; continue; }
        dpkg-deb -x "$f" "$PREFIX" 2>>"$LOG/deps.log" && unpacked=$((unpacked + 1)) ||
          echo "could not unpack $f" >>"$LOG/deps.log"
      done
    done
    MULTI=$PREFIX/usr/lib/x86_64-linux-gnu
    export PATH="$PREFIX/usr/bin:$PATH"
    export LD_LIBRARY_PATH="$MULTI:${LD_LIBRARY_PATH:-}"
    export CPATH="$PREFIX/usr/include:$PREFIX/usr/include/eigen3:${CPATH:-}"
    CMAKE_EXTRA+=("-DCMAKE_PREFIX_PATH=$PREFIX/usr;$MULTI/cmake")
    [ -d "$PREFIX/usr/share/eigen3/cmake" ] && CMAKE_EXTRA+=("-DEigen3_DIR=$PREFIX/usr/share/eigen3/cmake")
    case " ${missing[*]} " in *" mpi "*)
      # dpkg-deb -x makes no update-alternatives links.
      for t in mpicxx mpic++ mpicc mpirun mpiexec; do
        [ -e "$PREFIX/usr/bin/$t.openmpi" ] && ln -sf "$t.openmpi" "$PREFIX/usr/bin/$t"
      done
      export LD_LIBRARY_PATH="$MULTI/openmpi/lib:$LD_LIBRARY_PATH"
      # Open MPI and PMIx relocated from /usr to the prefix.
      export OPAL_PREFIX="$PREFIX/usr" PMIX_INSTALL_PREFIX="$PREFIX/usr"
      export OPAL_LIBDIR="$MULTI/openmpi/lib" OPAL_INCLUDEDIR="$MULTI/openmpi/include"
      export OPAL_DATADIR="$PREFIX/usr/share/openmpi" OPAL_PKGDATADIR="$PREFIX/usr/share/openmpi"
      export OPAL_SYSCONFDIR="$PREFIX/etc/openmpi"
      CMAKE_EXTRA+=("-DMPI_CXX_COMPILER=$PREFIX/usr/bin/mpicxx" "-DMPIEXEC_EXECUTABLE=$PREFIX/usr/bin/mpirun") ;;
    esac
    if command -v mpicxx >/dev/null && mpicxx --showme:version >>"$LOG/deps.log" 2>&1; then
      record deps "ok: missing ${missing[*]}, unpacked $unpacked packages from $DEPS_DIR into $PREFIX"
    else
      record deps "FAILED: missing ${missing[*]}; unpacked $DEPS_DIR but mpicxx does not run (deps.log)" 1
    fi
  else
    record deps "FAILED: missing ${missing[*]} and no $DEPS_DIR/*.deb (make it with --fetch-deps where apt works, carry it)" 1
  fi
else
  record deps "ok: MPI, Eigen, fmt, nlohmann-json, xxHash, GoogleTest, CLI11, pkg-config installed"
fi
# NCCL: the toolkit's, the system's, else the one pip installed with PyTorch.
if [ ! -e /usr/local/cuda/include/nccl.h ] && [ ! -e /usr/include/nccl.h ]; then
  nccl=$("$PY" -c 'import nvidia.nccl as m, os; print(list(m.__path__)[0])' 2>/dev/null)
  if [ -n "$nccl" ] && [ -e "$nccl/include/nccl.h" ]; then
    lib=$(ls "$nccl"/lib/libnccl.so* 2>/dev/null | head -1)
    CMAKE_EXTRA+=("-DSUMMA_NCCL_INCLUDE_DIR=$nccl/include" "-DSUMMA_NCCL_LIBRARY=$lib")
    export LD_LIBRARY_PATH="$nccl/lib:${LD_LIBRARY_PATH:-}"
    note "NCCL from pip: $lib"
  else
    note "NCCL not found in the toolkit, /usr/include or pip: configure will fail"
  fi
fi

# ------------------------------------------------------------------ build
BENCH_TARGETS="summa_gemm gpt_layer compare_schemes calibrate"
build_ok=0
configure() {  # configure [launcher]
  local extra=()
  [ -n "${1:-}" ] && extra=("-DCMAKE_CXX_COMPILER_LAUNCHER=$1" "-DCMAKE_CUDA_COMPILER_LAUNCHER=$1")
  run_logged "$LOG/build.log" "$(left)" cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DSUMMA_CUDA=ON -DSUMMA_CUDA_ARCHITECTURES="$ARCH" -DSUMMA_NATIVE_ARCH=ON -DSUMMA_PYTHON="$PY" "${CMAKE_EXTRA[@]}" "${extra[@]}"
}
cuda_test_targets() {  # the executables of the cuda-labelled tests
  (cd "$BUILD" && ctest -L cuda -N --show-only=json-v1 2>/dev/null) | "$PY" -c '
import json, os, sys
try:
    data = json.load(sys.stdin)
except Exception:
    sys.exit(0)
names = set()
for t in data.get("tests", []):
    for a in t.get("command", []):
        b = os.path.basename(a)
        if b.startswith("test_") and os.sep in a:
            names.add(b)
print(" ".join(sorted(names)))'
}
if [ "$SKIP_BUILD" = 1 ]; then
  [ -x "$BUILD/bench/summa_gemm" ] && { build_ok=1; record build "skipped (--skip-build), using $BUILD"; } ||
    record build "FAILED: --skip-build but no $BUILD/bench/summa_gemm" 2
elif ! enough 120; then
  record build "skipped: time budget" 128
else
  if configure; then
    # test_cuda_backend by name: ctest lists no command for a test whose
    # executable (named as a target, not run through mpirun) is not built yet.
    targets="$BENCH_TARGETS test_cuda_backend $(cuda_test_targets)"
    [ "$QUICK" = 1 ] && targets="$BENCH_TARGETS test_cuda_backend test_summa"
    note "building $targets with -j$JOBS"
    if run_logged "$LOG/build.log" "$(($(left) - 60))" cmake --build "$BUILD" -j "$JOBS" --target $targets; then
      build_ok=1; record build "ok (strict: -Werror)"
    else
      # Retry without -Werror: a launcher that drops it from every command.
      cat >"$WORK/no-werror" <<'EOF'
#!/usr/bin/env bash
args=()
for a in "$@"; do
  case "$a" in
    -Werror|--Werror=all-warnings) ;;
    -Xcompiler=-Wall,-Wextra,-Werror) args+=("-Xcompiler=-Wall,-Wextra") ;;
    *) args+=("$a") ;;
  esac
done
exec "${args[@]}"
EOF
      chmod +x "$WORK/no-werror"
      grep -m 20 -E 'error|Error' "$LOG/build.log" >"$LOG/build_strict_errors.txt"
      if enough 90 && configure "$WORK/no-werror" &&
         run_logged "$LOG/build.log" "$(($(left) - 45))" cmake --build "$BUILD" -j "$JOBS" --target $targets; then
        build_ok=1; record build "PARTLY: strict build FAILED, built without -Werror (see summary: first errors)" 2
      else
        record build "FAILED (build.log)" 2
      fi
    fi
  else
    record build "FAILED: configure (build.log)" 2
  fi
fi

# ------------------------------------------------------------------ test
if ! want test; then :
elif [ "$build_ok" = 1 ] && enough 60; then
  filter=()
  [ "$QUICK" = 1 ] && filter=(-R '^(cuda_backend|summa_cuda_np1|summa_cuda_np4)$')
  # Leave the benchmarks their time: ctest gets what is left minus their share.
  reserve=30
  if [ "$QUICK" = 1 ]; then { want gemm || want block || want torch; } && reserve=120
  else
    want gemm && reserve=$((reserve + 50))
    want block && reserve=$((reserve + 100))
    want torch && reserve=$((reserve + 60))
  fi
  run_logged "$LOG/ctest.log" "$(($(left) - reserve))" ctest --test-dir "$BUILD" -L cuda "${filter[@]}" \
    --output-on-failure -j "${CTEST_JOBS:-8}" --timeout 300
  rc=$?
  [ $rc = 124 ] || [ $rc = 137 ] && echo "ctest stopped by the time budget (rc $rc)" >>"$LOG/ctest.log"
  line=$(grep -E 'tests passed|tests failed' "$LOG/ctest.log" | tail -1)
  # A skipped cuda test means it saw no GPU, except nccl_npN (N > 1), which
  # needs one GPU per rank and skips on a single-GPU machine by design.
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  skipped=$(grep -E '\*\*\*Skipped' "$LOG/ctest.log" | sed -E 's/.*Test +#[0-9]+: ([^ ]+) .*/\1/' |
            awk -v g="$gpus" '{ if (match($0, /^nccl_np[0-9]+$/) && substr($0, 8) + 0 > g) next; print }' |
            tr '\n' ' ')
  if [ $rc = 0 ] && [ -z "$skipped" ]; then record test "ok: $line"
  elif [ $rc = 0 ]; then record test "FAILED: skipped on a GPU machine: $skipped($line)" 4
  elif [ $rc = 124 ] || [ $rc = 137 ]; then
    record test "FAILED: stopped by the time budget after: ${line:-no summary} (rerun: --skip-build --steps test)" 4
  else record test "FAILED (rc $rc): $line" 4; fi
elif [ "$build_ok" = 1 ]; then record test "skipped: time budget" 128
else record test "skipped: no build" 4; fi

# ------------------------------------------------------------------ benchmarks
MPIRUN=(mpirun)
mpirun --version 2>/dev/null | grep -q "Open MPI" && MPIRUN=(mpirun --allow-run-as-root --oversubscribe)
GEMM="$BUILD/bench/summa_gemm"
LAYER="$BUILD/bench/gpt_layer"
SCHEMES="$BUILD/bench/compare_schemes"
bench() {  # bench <name> <seconds needed> <command...>: JSON lines to results.jsonl
  local name=$1 need=$2
  shift 2
  if ! enough "$need"; then echo "skipped $name: time budget" >>"$LOG/bench.log"; return 200; fi
  echo "=== $name" >>"$LOG/bench.log"
  : >"$WORK/one.log"
  run_logged "$WORK/one.log" "$(($(left) - 15))" "$@"
  local rc=$?
  cat "$WORK/one.log" >>"$LOG/bench.log"
  json_lines "$WORK/one.log"
  return $rc
}
step_result() {  # step_result <step> <bit> <rc...>
  local step=$1 bit=$2 bad=0 skipped=0
  shift 2
  for rc in "$@"; do
    [ "$rc" = 200 ] && skipped=1 && continue
    [ "$rc" != 0 ] && bad=$((bad + 1))
  done
  if [ $bad -gt 0 ]; then record "$step" "FAILED: $bad run(s) failed (bench.log)" "$bit"
  elif [ $skipped = 1 ]; then record "$step" "partly skipped: time budget" 128
  else record "$step" "ok"; fi
}

if [ "$QUICK" = 1 ]; then
  BLOCKS=("768 12 1024 8")
else
  BLOCKS=("768 12 1024 8" "1600 25 1024 4")
fi

if ! want gemm; then :
elif [ "$build_ok" = 1 ] && [ -x "$GEMM" ]; then
  rcs=()
  # The acceptance runs: q = 1, one GEMM per panel (--panel 0), fp32 without TF32.
  if [ "$QUICK" = 1 ]; then
    bench gemm_f32 40 "${MPIRUN[@]}" -np 1 "$GEMM" --backend cuda --size 4096 --forms AB --panel 0 --dtype f32 --reps 10 --warmup 2; rcs+=($?)
    bench gemm_tf32 40 "${MPIRUN[@]}" -np 1 "$GEMM" --backend cuda --tf32 --size 4096 --forms AB --panel 0 --dtype f32 --reps 10 --warmup 2; rcs+=($?)
    bench gemm_bf16 40 "${MPIRUN[@]}" -np 1 "$GEMM" --backend cuda --size 4096 --forms AB --panel 0 --dtype bf16 --reps 10 --warmup 2; rcs+=($?)
  else
    bench gemm_f32 90 "${MPIRUN[@]}" -np 1 "$GEMM" --backend cuda --size 4096,8192 --forms AB,ABt,AtB --panel 0 --dtype f32 --reps 10 --warmup 2; rcs+=($?)
    bench gemm_tf32 60 "${MPIRUN[@]}" -np 1 "$GEMM" --backend cuda --tf32 --size 4096,8192 --forms AB --panel 0 --dtype f32 --reps 10 --warmup 2; rcs+=($?)
    bench gemm_f64 60 "${MPIRUN[@]}" -np 1 "$GEMM" --backend cuda --size 4096 --forms AB --panel 0 --dtype f64 --reps 5 --warmup 1; rcs+=($?)
    bench gemm_bf16 60 "${MPIRUN[@]}" -np 1 "$GEMM" --backend cuda --size 4096,8192 --forms AB,ABt,AtB --panel 0 --dtype bf16 --reps 10 --warmup 2; rcs+=($?)
    # Informative: q = 2, 4 ranks sharing the GPU over mpi_staged (host-staged collectives).
    bench gemm_q2 60 "${MPIRUN[@]}" -np 4 "$GEMM" --backend cuda --size 8192 --forms AB --panel 0,1024 --overlap both --dtype f32 --reps 5 --warmup 1; rcs+=($?)
  fi
  # Correctness against a double-precision host reference and cuBLAS: q = 1, and q = 2
  # (4 ranks sharing the GPU over mpi_staged), odd-ish sizes.
  bench gemm_check_q1 40 "${MPIRUN[@]}" -np 1 "$GEMM" --backend cuda --m 768 --n 512 --k 1280 --panel 0,256 --overlap both --dtype f32,f64,bf16 --reps 2 --warmup 1 --check; rcs+=($?)
  bench gemm_check_q2 60 "${MPIRUN[@]}" -np 4 "$GEMM" --backend cuda --m 768 --n 512 --k 1280 --panel 0,96 --overlap both --dtype f32,f64,bf16 --reps 2 --warmup 1 --check; rcs+=($?)
  step_result gemm 8 "${rcs[@]}"
  # The 85 % criterion, from the q = 1 lines.
  if "$PY" "$ROOT/bench/gpu_ratio.py" "$OUTDIR/results.jsonl" >"$LOG/ratio_gemm.txt" 2>&1; then
    record gemm85 "ok: every q = 1 GEMM >= 0.85 of cuBLAS"
  else
    grep -q FAIL "$LOG/ratio_gemm.txt" && record gemm85 "FAILED: a q = 1 GEMM below 0.85 of cuBLAS" 16 ||
      record gemm85 "FAILED: no usable GEMM lines" 16
  fi
else
  record gemm "skipped: no build" 8
fi

if ! want block; then :
elif [ "$build_ok" = 1 ] && [ -x "$LAYER" ]; then
  rcs=()
  # First (issue 27's measurement): AdamW's step with the state on the GPU
  # against offloaded to pinned host memory (OptimizerOptions::offload_bucket):
  # 235 M parameters.
  bench optimizer_offload 60 "${MPIRUN[@]}" -np 1 "$LAYER" --backend cuda --what optimizer --layers 4 --hidden 2048 --heads 16 --seq 128 --batch 2 --vocab 16384 --dtype bf16 --reps 5 --warmup 1 --offload-bucket 4194304; rcs+=($?)
  for cfg in "${BLOCKS[@]}"; do
    set -- $cfg
    bench "block_h$1" 45 "${MPIRUN[@]}" -np 1 "$LAYER" --backend cuda --what block --hidden "$1" --heads "$2" --seq "$3" --batch "$4" --dtype f32 --reps 10 --warmup 2; rcs+=($?)
    bench "block_h$1_tf32" 45 "${MPIRUN[@]}" -np 1 "$LAYER" --backend cuda --tf32 --what block --hidden "$1" --heads "$2" --seq "$3" --batch "$4" --dtype f32 --reps 10 --warmup 2; rcs+=($?)
    bench "block_h$1_bf16" 45 "${MPIRUN[@]}" -np 1 "$LAYER" --backend cuda --what block --hidden "$1" --heads "$2" --seq "$3" --batch "$4" --dtype bf16 --reps 10 --warmup 2; rcs+=($?)
  done
  # The whole model on the GPU (GPT2D, 4 ranks sharing it): informative, needs the layers' port.
  [ "$QUICK" = 1 ] || { bench gpt_q2 45 "${MPIRUN[@]}" -np 4 "$LAYER" --backend cuda --what gpt --layers 2 --hidden 256 --heads 8 --seq 128 --batch 8 --vocab 2048 --checkpoint both --reps 3 --warmup 1; rcs+=($?); }
  # Every 4-rank scheme on the GPU (mpi_staged): bytes per axis must equal the closed form.
  [ "$QUICK" = 1 ] || { bench schemes_q2 60 "${MPIRUN[@]}" -np 4 "$SCHEMES" --backend cuda --layers 2 --hidden 256 --heads 8 --seq 64 --batch 8 --vocab 2048 --reps 2 --warmup 1 --budget-mib 256 --max-batch 64 --format json --dtype bf16; rcs+=($?); }
  # Pipelines on the GPU (issue 28): every schedule, 4 ranks sharing it over
  # mpi_staged (the stage messages through the staged pipe), bytes per axis
  # equal to the closed form.
  [ "$QUICK" = 1 ] || { bench pipelines_q2 45 "${MPIRUN[@]}" -np 4 "$SCHEMES" --backend cuda --layers 4 --hidden 256 --heads 8 --seq 64 --batch 16 --vocab 2048 --reps 2 --warmup 1 --budget-mib 256 --max-batch 64 --format json --dtype bf16 --schemes "data=2,pipe=2:micro=4,2d:q=1;pipe=4:micro=8,1d:p=1;pipe=2:micro=4:schedule=1f1b,1d:p=2;pipe=2:micro=4:schedule=gpipe,1d:p=2"; rcs+=($?); }
  step_result block 32 "${rcs[@]}"
else
  record block "skipped: no build" 32
fi

if ! want torch; then :
elif "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
  rcs=()
  for cfg in "${BLOCKS[@]}"; do
    set -- $cfg
    common=("$PY" "$ROOT/bench/torch_block.py" --device cuda --hidden "$1" --heads "$2" --seq "$3" --batch "$4" --reps 10 --warmup 2)
    bench "torch_h$1" 30 "${common[@]}" --dtype f32,bf16; rcs+=($?)
    bench "torch_h$1_tf32" 30 "${common[@]}" --dtype f32 --tf32; rcs+=($?)
    bench "torch_h$1_sdpa" 30 "${common[@]}" --dtype f32,bf16 --sdpa; rcs+=($?)
  done
  step_result torch 64 "${rcs[@]}"
else
  record torch "not run: python3 has no torch with CUDA ($("$PY" -c 'import torch; print(torch.__version__)' 2>&1 | tail -1))"
fi

# ------------------------------------------------------------------ calib
# The step-time model on this GPU (issue 29; docs/gpu.md "The step-time model
# on a GPU"): one calibration, one validation run, its record brought back.
if ! want calib; then :
elif [ "$QUICK" = 1 ] && [ "$STEPS_GIVEN" = 0 ]; then record calib "skipped: --quick"
elif [ "$build_ok" = 1 ] && [ -x "$BUILD/bench/calibrate" ] && [ -x "$BUILD/bench/compare_schemes" ]; then
  if enough 120; then
    limit=$(($(left) - 10))
    [ "$limit" -gt 240 ] && limit=240
    run_logged "$LOG/calib.log" "$limit" "$ROOT/scripts/validate_time_model.sh" --build "$BUILD" \
      --backend cuda --dtype "f32 bf16" --repeat 1 --reps 5 --calibrate "$LOG/machine_cuda.json" \
      --out "$WORK/validate" --record "$OUTDIR/validate_cuda.jsonl"
    rc=$?
    if [ -s "$OUTDIR/validate_cuda.jsonl" ]; then
      "$PY" "$ROOT/scripts/validate_summary.py" --record "$OUTDIR/validate_cuda.jsonl" \
        >"$LOG/calib_summary.txt" 2>&1
      verdict=$(grep -o 'validate_time_model: .*' "$LOG/calib_summary.txt" | tail -1 | tr -d '`')
      record calib "ran: ${verdict:-no verdict} (validate_cuda.jsonl)"
    elif [ $rc = 124 ] || [ $rc = 137 ]; then
      record calib "FAILED: stopped after $limit s (calib.log)" 32
    else
      record calib "FAILED (rc $rc, calib.log)" 32
    fi
  else
    record calib "skipped: time budget (rerun on the warm machine: --skip-build --steps calib)" 128
  fi
else
  record calib "skipped: no build" 32
fi

# ------------------------------------------------------------------ summary
"$PY" "$ROOT/bench/gpu_ratio.py" "$OUTDIR/results.jsonl" >"$LOG/ratio.txt" 2>&1
{
  echo "gpu_verify.sh $( [ "$QUICK" = 1 ] && echo --quick ) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1), $(date -u), $(elapsed)s of $BUDGET"
  echo "repo $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)"
  echo
  for l in "${STEP_LINES[@]}"; do echo "$l"; done
  echo
  cat "$LOG/ratio.txt"
  if [ -s "$LOG/calib_summary.txt" ]; then echo; echo "calib (the step-time model on this GPU):"; cat "$LOG/calib_summary.txt"; fi
  if [ -s "$LOG/build_strict_errors.txt" ]; then echo; echo "first errors of the strict build:"; cat "$LOG/build_strict_errors.txt"; fi
  if [ -f "$LOG/ctest.log" ]; then echo; echo "ctest:"; grep -E 'tests passed|tests failed|\*\*\*Failed|\*\*\*Skipped|Not Run|Timeout' "$LOG/ctest.log" | head -40; fi
  echo
  echo "exit status $STATUS (1 env/deps, 2 build, 4 test, 8 gemm, 16 gemm < 85%, 32 block or calib, 64 torch, 128 time budget)"
} >"$SUMMARY"
cp "$SUMMARY" "$OUTDIR/summary.txt"
for f in build ctest bench; do
  [ -f "$LOG/$f.log" ] || continue
  if [ "$(stat -c %s "$LOG/$f.log")" -gt 4000000 ]; then tail -c 4000000 "$LOG/$f.log" >"$OUTDIR/$f.log"
  else cp "$LOG/$f.log" "$OUTDIR/$f.log"; fi
done
tar -czf "$OUTDIR/logs.tar.gz" -C "$WORK" logs summary.txt 2>/dev/null
cat "$SUMMARY"
exit "$STATUS"
