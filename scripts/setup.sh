#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: system packages (apt), a virtualenv in .venv with the
# pinned torch and test tools, and the editable build of openneuron. Fast the second time.
# Called by `make setup` (and so by `make demo` / `make test`).
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v ccache >/dev/null || need+=(ccache)
command -v g++ >/dev/null || need+=(g++)
[ -f /usr/include/gtest/gtest.h ] || need+=(libgtest-dev)
python3 -c "import ensurepip" 2>/dev/null || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing system packages: ${need[*]}"
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
stamp=.venv/.openneuron-deps
want="$(sha1sum pyproject.toml | cut -c1-40)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing python packages into .venv"
  # NOTE: torch is pinned; an unpinned torch would pull a multi-GB CUDA build. transformers is
  # pinned too (5.25 needs a `kernels` release PyPI mirrors here lack); tests build tiny HF models.
  # accelerate and peft: the versions tested with transformers 5.20.0 and torch 2.13.0
  # (tests/python/test_huggingface_stack.py); neither makes pip touch torch. torchtitan 0.3.0:
  # tests/python/test_torchtitan.py (torch stays pinned in the same command). ml_dtypes: numpy
  # arrays of bfloat16 / float8 for NKI kernels (openneuron/nki/_tensor.py).
  .venv/bin/pip install -q --disable-pip-version-check \
    torch==2.13.0 setuptools wheel pytest pytest-xdist numpy expecttest hypothesis \
    transformers==5.20.0 accelerate==1.15.0 peft==0.21.2 torchtitan==0.3.0 ml_dtypes==0.7.0
  # NOTE: torchtitan imports triton unconditionally; triton goes into a folder of its own that
  # only the torchtitan runs put on PYTHONPATH (Inductor elsewhere never sees it).
  .venv/bin/pip install -q --disable-pip-version-check --no-deps --upgrade \
    --target .venv/torchtitan-site triton==3.9.0
  .venv/bin/pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e .
  echo "$want" >"$stamp"
fi
