# Sourced by the fault scripts: the mpiexec flags (the script's second
# argument, a CMake list or words) as FLAGS, the failure count and fail(),
# finish(), and poison_safetensors().
# shellcheck shell=bash
# shellcheck disable=SC2034  # used by the scripts that source this
read -r -a FLAGS <<<"${2//;/ }"
failures=0
case=setup
fail() {
  echo "FAIL [$case]: $*"
  failures=$((failures + 1))
}
# finish <message>: exit 1 naming how many cases failed, else print <message>.
finish() {
  if [ "$failures" != 0 ]; then
    echo "$failures case(s) failed"
    exit 1
  fi
  echo "$1"
}
# poison_safetensors <file>: the first value of a safetensors file becomes NaN.
poison_safetensors() {
  python3 - "$1" <<'EOF'
import struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
b[8 + n:8 + n + 4] = struct.pack("<f", float("nan"))
open(p, "wb").write(b)
EOF
}
