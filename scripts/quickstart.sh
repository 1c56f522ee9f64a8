#!/usr/bin/env bash
# One-stop set-up for a fresh Debian machine: installs what is missing from
# Debian packages, configures, builds, then runs what you ask for.
#
#   scripts/quickstart.sh demo    the main demo: gpt_train on a 2x2 mesh, loss plot
#   scripts/quickstart.sh test    the whole test suite (ctest)
#   scripts/quickstart.sh asan    the whole test suite under ASan + UBSan
#   scripts/quickstart.sh build   set-up and build only
#
# Environment: BUILD_DIR (default build, build-asan for asan), JOBS (default
# nproc), SUMMA_CMAKE_ARGS (extra configure arguments).
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-demo}

packages=(build-essential cmake ninja-build pkg-config openmpi-bin libopenmpi-dev libeigen3-dev
          libfmt-dev nlohmann-json3-dev libxxhash-dev libgtest-dev libcli11-dev libscalapack-openmpi-dev libblis-dev)
# The demo also plots its loss curve.
if [ "$what" = demo ]; then packages+=(python3-matplotlib); fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "quickstart: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# OpenMPI refuses root and more ranks than cores unless told (CI runs as root
# on 2 cores); these only take effect where they are needed.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
jobs=${JOBS:-$(nproc)}

configure_and_build() {  # <build dir> <extra cmake args...>
  local dir=$1; shift
  cmake -S . -B "$dir" -G Ninja "$@" ${SUMMA_CMAKE_ARGS:-}
  cmake --build "$dir" -j "$jobs"
}

case "$what" in
  demo)
    dir=${BUILD_DIR:-build}
    configure_and_build "$dir" -DCMAKE_BUILD_TYPE=Release
    # Trains a small GPT on the bundled corpus on a 2x2 mesh (about two
    # minutes on 2 cores), exports it, then plots the loss curve.
    # --overwrite: a second demo replaces the first one's run.
    mpirun -np 4 "$dir/examples/gpt_train" --out gpt_train_out --overwrite
    if /usr/bin/python3 -c "import matplotlib" 2>/dev/null; then
      echo "loss plot: $(/usr/bin/python3 scripts/plot_loss.py gpt_train_out/log.jsonl)"
    fi
    ;;
  test)
    dir=${BUILD_DIR:-build}
    configure_and_build "$dir" -DCMAKE_BUILD_TYPE=Release
    ctest --test-dir "$dir" --output-on-failure -j "$jobs"
    ;;
  asan)
    dir=${BUILD_DIR:-build-asan}
    configure_and_build "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DSUMMA_SANITIZE=address,undefined
    # Full unwinding on malloc so leak stacks reach the MPI frames the
    # suppressions name (MPI plugins are unloaded before the leak report).
    export ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0:abort_on_error=1:detect_odr_violation=0
    # use_tls=0: GCC 12's LeakSanitizer reads a bogus dynamic-TLS range under
    # glibc 2.36 in some MPI test processes ("DTLS 6 at 0x3d2d-0x400004e2f"
    # with verbosity=1) and its tracer then segfaults at exit after every case
    # passed (seen on comm_np8, then layers2d_np9). Without the TLS roots a
    # pointer held only in thread-local storage would be reported as a leak;
    # no leak can be missed.
    export LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp:print_suppressions=0:use_tls=0
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    ctest --test-dir "$dir" --output-on-failure -j "$jobs"
    ;;
  build)
    configure_and_build "${BUILD_DIR:-build}" -DCMAKE_BUILD_TYPE=Release
    ;;
  *)
    echo "usage: $0 demo|test|asan|build" >&2
    exit 2
    ;;
esac
