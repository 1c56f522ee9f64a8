#!/usr/bin/env bash
# One-stop set-up for a fresh Debian machine: installs what is missing from
# Debian packages, configures, builds, then runs what you ask for.
#
#   scripts/quickstart.sh demo    the main demo: gpt_train on a 2x2 mesh, loss plot, then
#                                 gpt_generate: a few lines from the trained model
#   scripts/quickstart.sh test    the whole test suite (ctest) in the checked build:
#                                 AddressSanitizer + UndefinedBehaviorSanitizer, -O1
#   scripts/quickstart.sh build   set-up and the Release build only
#
# Environment: BUILD_DIR (default build, build-check for test), JOBS (default
# nproc), SUMMA_CMAKE_ARGS (extra configure arguments).
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-demo}

packages=(build-essential cmake ninja-build pkg-config openmpi-bin libopenmpi-dev libeigen3-dev
          libfmt-dev nlohmann-json3-dev libxxhash-dev libpcre2-dev libgtest-dev libcli11-dev libscalapack-openmpi-dev libblis-dev)
# The demo plots its loss curve; the tests plot a scaling study (bench_scaling_study_plot).
if [ "$what" = demo ] || [ "$what" = test ]; then packages+=(python3-matplotlib); fi
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
    configure_and_build "$dir" -DCMAKE_BUILD_TYPE=Release -DSUMMA_NATIVE_ARCH=ON
    # Trains a small GPT on the bundled corpus on a 2x2 mesh (about two
    # minutes on 2 cores), exports it, then plots the loss curve.
    # --overwrite: a second demo replaces the first one's run.
    mpirun -np 4 "$dir/examples/gpt_train" --out gpt_train_out --overwrite
    if /usr/bin/python3 -c "import matplotlib" 2>/dev/null; then
      echo "loss plot: $(/usr/bin/python3 scripts/plot_loss.py gpt_train_out/log.jsonl)"
    fi
    # A few lines from the model it trained (key/value cache, 2x2 mesh).
    mpirun -np 4 "$dir/examples/gpt_generate" --checkpoint gpt_train_out/checkpoints \
      --temperature 0.8 --top-k 40 --seed 1 --max-new-tokens 40 \
      --prompt "The weather in the mountains" --prompt "Computers were" --prompt "To make bread, "
    ;;
  test)
    # One build, every test once: the suite under ASan + UBSan (leaks
    # included) at -O1 (build type Check, CMakeLists.txt), with the CUDA
    # component compiled where CUDA is found (its GPU tests run from a
    # Release build: scripts/gpu_verify.sh). The sanitizer settings are part
    # of every test (tests/CMakeLists.txt), so a plain ctest runs them right.
    dir=${BUILD_DIR:-build-check}
    configure_and_build "$dir" -DCMAKE_BUILD_TYPE=Check -DSUMMA_SANITIZE=address,undefined \
      -DSUMMA_NATIVE_ARCH=ON
    ctest --test-dir "$dir" --output-on-failure -j "$jobs"
    ;;
  build)
    configure_and_build "${BUILD_DIR:-build}" -DCMAKE_BUILD_TYPE=Release -DSUMMA_NATIVE_ARCH=ON
    ;;
  *)
    echo "usage: $0 demo|test|build" >&2
    exit 2
    ;;
esac
