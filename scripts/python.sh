# Sourced by the scripts: summa_python BUILD_DIR prints the Python the build
# chose at configure time (SUMMA_PYTHON in BUILD_DIR/CMakeCache.txt,
# cmake/SummaPython.cmake); $SUMMA_PYTHON overrides it; without either,
# Debian's /usr/bin/python3, then python3 on PATH.
summa_python() {
  local cache=${1:-build}/CMakeCache.txt py=${SUMMA_PYTHON:-}
  if [ -z "$py" ] && [ -f "$cache" ]; then
    py=$(sed -n 's/^SUMMA_PYTHON:[A-Z]*=//p' "$cache" | head -1)
  fi
  if [ -z "$py" ]; then
    if [ -x /usr/bin/python3 ]; then py=/usr/bin/python3; else py=$(command -v python3 || true); fi
  fi
  [ -n "$py" ] || { echo "no Python 3 found (install python3 or set SUMMA_PYTHON)" >&2; return 1; }
  printf '%s\n' "$py"
}
