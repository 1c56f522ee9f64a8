#!/usr/bin/env bash
# One-stop set-up for a fresh Debian machine: installs what is missing from
# Debian packages, configures, builds, then runs what you ask for.
#
#   scripts/quickstart.sh demo    the main demo: builds only gpt_train and gpt_generate
#                                 (Release), trains on a 2x2 mesh, plots the loss, then
#                                 gpt_generate: a few lines from the trained model
#   scripts/quickstart.sh test    the whole test suite (ctest) in the checked build:
#                                 AddressSanitizer + UndefinedBehaviorSanitizer, -O1
#   scripts/quickstart.sh build   set-up and the whole Release build (tests, benchmarks)
#
# Environment: BUILD_DIR (default build, build-check for test), JOBS (default
# nproc), SUMMA_CMAKE_ARGS (extra configure arguments), SUMMA_DEMO_CUDA (ON
# builds the demo with the CUDA component; default: only where nvidia-smi
# sees a GPU), SUMMA_APT_LOCK_WAIT (seconds to wait for another apt or dpkg
# to finish, default 600).
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-demo}
case "$what" in
  demo | test | build) ;;
  *)
    echo "usage: $0 demo|test|build" >&2
    exit 2
    ;;
esac

# What each mode needs. The demo: the library with BLIS (the CPU GEMM, its
# pthread build; docs/design.md "CPU GEMM"), gpt_train (CLI11) and its loss
# plot (python3-matplotlib); the tests and benchmarks add GoogleTest,
# ScaLAPACK and Debian's default BLIS (the PDGEMM comparison) and OpenBLAS
# (every backend test runs on each CPU GEMM library), and the tests
# python3-torch
# (hf_torch and torch_block check summa's export and block in PyTorch; the
# doc-check runs hf_check.py).
packages=(build-essential cmake ninja-build pkg-config openmpi-bin libopenmpi-dev libeigen3-dev
          libfmt-dev nlohmann-json3-dev libxxhash-dev libpcre2-dev libcli11-dev python3-matplotlib libblis-pthread-dev)
if [ "$what" != demo ]; then
  packages+=(libgtest-dev libscalapack-openmpi-dev libblis-dev libopenblas-dev)
fi
if [ "$what" = test ]; then packages+=(python3-torch); fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

# apt-get, waiting for another apt or dpkg (an unattended upgrade, a second
# set-up) to let go of its locks, for SUMMA_APT_LOCK_WAIT seconds at most.
apt_get() {
  local sudo="" wait=${SUMMA_APT_LOCK_WAIT:-600} start=$SECONDS log
  [ "$(id -u)" = 0 ] || sudo="sudo"
  log=$(mktemp)
  while true; do
    if DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=10 "$@" >"$log" 2>&1; then
      grep -v '^debconf: \|^(Reading database' "$log" || true
      rm -f "$log"
      return 0
    fi
    if grep -q "Could not get lock\|Unable to acquire the dpkg\|Unable to lock" "$log" &&
      ((SECONDS - start < wait)); then
      echo "quickstart: apt is busy (another apt or dpkg holds its lock); waiting ($((SECONDS - start)) of ${wait} s)"
      sleep 5
      continue
    fi
    cat "$log" >&2
    rm -f "$log"
    echo "quickstart: 'apt-get $*' failed$( ((SECONDS - start >= wait)) && echo " after waiting ${wait} s for another apt or dpkg to finish (raise SUMMA_APT_LOCK_WAIT, or end that one)")" >&2
    return 1
  done
}
if ((${#missing[@]})); then
  echo "quickstart: installing ${missing[*]}"
  apt_get update -qq
  apt_get install -y -qq --no-install-recommends "${missing[@]}"
fi

# OpenMPI refuses root and more ranks than cores unless told (CI runs as root
# on 2 cores); these only take effect where they are needed.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
jobs=${JOBS:-$(nproc)}
python_modules=matplotlib
[ "$what" = test ] && python_modules="matplotlib;torch"

configure() {  # <build dir> <extra cmake args...>
  local dir=$1
  shift
  # python3-matplotlib (and for the tests python3-torch) were installed
  # above: the build's Python must import them (cmake/SummaPython.cmake), so
  # no plot or torch test is skipped for want of them.
  # A build directory configured before (by hand, with another generator)
  # keeps its generator: CMake refuses to switch one.
  local generator=Ninja
  if [ -f "$dir/CMakeCache.txt" ]; then
    generator=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$dir/CMakeCache.txt")
    [ -n "$generator" ] || generator=Ninja
  fi
  # shellcheck disable=SC2086
  cmake -S . -B "$dir" -G "$generator" -DSUMMA_PYTHON_REQUIRE="$python_modules" "$@" \
    ${SUMMA_CMAKE_ARGS:-}
}

# The build's length before it starts: compile steps left, at about
# $per_step seconds a step on one core (measured 2026-11-26 on a 2-core AMD
# EPYC: the demo's 62 Release steps in 198 s, 229 of the full build in 600 s).
build_targets() {  # <build dir> <per-step seconds> [targets...]
  local dir=$1 per_step=$2
  shift 2
  local steps dry
  dry=$(ninja -C "$dir" -n "$@" 2>/dev/null || true)
  if grep -q "Re-running CMake" <<<"$dry"; then
    # a dry run stops where CMake would re-run (a fresh tree): count every
    # command of the targets instead
    steps=$(ninja -C "$dir" -t commands "$@" 2>/dev/null | wc -l || true)
  else
    steps=$(grep -c '^\[' <<<"$dry" || true)
  fi
  if ((steps > 0)); then
    local minutes=$(((steps * per_step + jobs * 60 - 1) / (jobs * 60)))
    echo "quickstart: building ${*:-everything}: $steps steps on $jobs core(s), about $minutes min"
  fi
  local start=$SECONDS targets=()
  (($#)) && targets=(--target "$@")
  cmake --build "$dir" -j "$jobs" "${targets[@]}"
  echo "quickstart: built in $((SECONDS - start)) s"
}

case "$what" in
  demo)
    dir=${BUILD_DIR:-build}
    # Release, only what the demo runs: no tests, no benchmarks, and the CUDA
    # component only where a GPU is there to run it (or SUMMA_DEMO_CUDA=ON).
    cuda=OFF
    if [ "${SUMMA_DEMO_CUDA:-}" = ON ] || nvidia-smi -L >/dev/null 2>&1; then cuda=AUTO; fi
    configure "$dir" -DCMAKE_BUILD_TYPE=Release -DSUMMA_NATIVE_ARCH=ON -DSUMMA_BUILD_TESTS=OFF \
      -DSUMMA_BUILD_BENCH=OFF -DSUMMA_BUILD_EXAMPLES=ON -DSUMMA_CUDA=$cuda
    build_targets "$dir" 6 gpt_train gpt_generate
    # Trains a small GPT on the bundled corpus on a 2x2 mesh (about a minute
    # and a half on 2 cores), exports it, then plots the loss curve.
    # --overwrite: a second demo replaces the first one's run.
    mpirun -np 4 "$dir/examples/gpt_train" --out gpt_train_out --overwrite
    # shellcheck source=scripts/python.sh
    . scripts/python.sh
    python=$(summa_python "$dir")
    echo "loss plot: $("$python" scripts/plot_loss.py gpt_train_out/log.jsonl)"
    # A few lines from the model it trained (key/value cache, 2x2 mesh); the
    # longest prompt (28 bytes) and 32 new tokens fit its 64 positions.
    mpirun -np 4 "$dir/examples/gpt_generate" --checkpoint gpt_train_out/checkpoints \
      --temperature 0.8 --top-k 40 --seed 1 --max-new-tokens 32 \
      --prompt "The weather in the mountains" --prompt "Computers were" --prompt "To make bread, "
    ;;
  test)
    # One build, every test once: the suite under ASan + UBSan (leaks
    # included) at -O1 (build type Check, CMakeLists.txt), with the CUDA
    # component compiled where CUDA is found (its GPU tests run from a
    # Release build: scripts/gpu_verify.sh). The sanitizer settings are part
    # of every test (tests/CMakeLists.txt), so a plain ctest runs them right.
    dir=${BUILD_DIR:-build-check}
    # The suite's default CPU GEMM is BLIS, as the demo's and a user's: an
    # uninstrumented library, about 2.3 times faster here than Eigen's
    # kernels compiled with the sanitizers at -O1 (most of the suite's time
    # was those). Eigen, the fallback, and OpenBLAS run their own variants
    # (backend_<library>, summa_np4_<library>; docs/design.md).
    configure "$dir" -DCMAKE_BUILD_TYPE=Check -DSUMMA_SANITIZE=address,undefined \
      -DSUMMA_NATIVE_ARCH=ON -DSUMMA_CPU_GEMM=blis
    build_targets "$dir" 6
    ctest --test-dir "$dir" --output-on-failure -j "$jobs"
    ;;
  build)
    dir=${BUILD_DIR:-build}
    configure "$dir" -DCMAKE_BUILD_TYPE=Release -DSUMMA_NATIVE_ARCH=ON -DSUMMA_BUILD_TESTS=ON \
      -DSUMMA_BUILD_BENCH=ON -DSUMMA_BUILD_EXAMPLES=ON
    build_targets "$dir" 6
    ;;
esac
