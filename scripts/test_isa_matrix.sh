#!/usr/bin/env bash
# Runs the bitwise tests (adaptive eager vs eager, fused math vs CPU, native kernels) once per
# code path this host can take that changes what the IR, the native kernels or ATen compute:
# each OPENNEURON_ISA variant the CPU supports, ATen's ATEN_CPU_CAPABILITY levels and MKL's
# code paths (MKL_ENABLE_INSTRUCTIONS; VML's float32 results differ between them). The default
# path already ran in `make test-python`. Called by `make test-isa` (part of `make test`).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
FILES=(tests/python/test_fusion.py tests/python/test_fusion_math.py
       tests/python/test_native_kernels.py tests/python/test_native_norms.py)
# ATen / MKL levels change eager's (and so fusion's) bits; the native kernels are ours.
ATEN_FILES=(tests/python/test_fusion.py tests/python/test_fusion_math.py)
read -r -a isas <<<"$($PY -c 'import openneuron._C as c; print(" ".join(c._host_isas()))')"
default_isa="$($PY -c 'import openneuron._C as c; print(c._isa())')"
echo "isa-matrix: this CPU supports OPENNEURON_ISA=${isas[*]} (default $default_isa)"

run() {  # run VAR=value FILE...
  local var="$1"
  shift
  echo "isa-matrix: $var pytest ${*##*/}"
  # NOTE: tests in a fresh interpreter (marker "subprocess") check logs, configuration and
  # process lifetime, not results: they ran once in `make test-python`.
  env "$var" "$PY" -m pytest -q -m "not subprocess" "$@"
}

for isa in "${isas[@]}"; do
  [ "$isa" = "$default_isa" ] || run OPENNEURON_ISA="$isa" "${FILES[@]}"
done
# ATen picks min(requested, CPU); levels the CPU lacks would repeat the default run.
for cap in default avx2; do
  run ATEN_CPU_CAPABILITY="$cap" "${ATEN_FILES[@]}"
done
# MKL's own dispatch (VML's tanh/exp/log/cos/erf/sqrt in eager and in fused float32 kernels).
for mkl in SSE4_2 AVX2; do
  run MKL_ENABLE_INSTRUCTIONS="$mkl" "${ATEN_FILES[@]}"
done
echo "isa-matrix: every variant passed"
