#!/usr/bin/env bash
# Builds the origin-capture harness module (origin_harness.cpp + aten/origin_capture.cpp + the
# runtime files they need) against PYTHON's headers, outside the source tree, and runs
# check_origin.py with it. usage: scripts/origin_harness/check.sh [PYTHON]  (default python3)
# ORIGIN_HARNESS_BUILD picks the build folder (default /tmp/origin-harness).
set -euo pipefail
PY=${1:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CXX=${CXX:-g++}

read -r TAG INC EXT < <("$PY" -c 'import sys, sysconfig
print("py%d%d%s" % (sys.version_info[0], sys.version_info[1], sys.abiflags),
      sysconfig.get_paths()["include"], sysconfig.get_config_var("EXT_SUFFIX"))')
OUT=${ORIGIN_HARNESS_BUILD:-/tmp/origin-harness}/$TAG
mkdir -p "$OUT"
echo "== $("$PY" -c 'import sys; print(sys.version.split()[0], sys.executable)')  headers: $INC"

FLAGS=(-std=gnu++17 -O2 -g -fPIC -fvisibility=hidden -I"$INC" -I"$ROOT/csrc")
# NOTE: warnings are errors only for the files under test.
"$CXX" "${FLAGS[@]}" -Wall -Wextra -Werror -c "$ROOT/csrc/aten/origin_capture.cpp" \
  -o "$OUT/origin_capture.o"
"$CXX" "${FLAGS[@]}" -Wall -Wextra -Werror -c "$HERE/origin_harness.cpp" -o "$OUT/origin_harness.o"
RUNTIME=(config.cpp isa.cpp hal.cpp)
OBJS=()
for f in "${RUNTIME[@]}"; do
  "$CXX" "${FLAGS[@]}" -ffunction-sections -c "$ROOT/csrc/runtime/$f" -o "$OUT/runtime_${f%.cpp}.o"
  OBJS+=("$OUT/runtime_${f%.cpp}.o")
done
# NOTE: hal.cpp holds origin_set_resolver/origin_describe next to hal(); --gc-sections drops the
# unused (hidden) hal() and with it the reference to the rest of the runtime.
# Python's own symbols come from the interpreter at import (which loads it with RTLD_NOW, so
# anything else left undefined fails the import).
"$CXX" -shared -Wl,--gc-sections -o "$OUT/_origin_harness$EXT" "$OUT/origin_harness.o" \
  "$OUT/origin_capture.o" "${OBJS[@]}" -lpthread

PYTHONPATH="$OUT" OPENNEURON_ORIGIN=1 "$PY" "$HERE/check_origin.py"
