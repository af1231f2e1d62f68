# The project's vocabulary (README.md lists these): make, make test, make demo, make finetune,
# make bench[-training|-kernels|-fusion|-decode|-ir|-shm|-collectives|-distributed|-compile|-nki],
# make lint, make asan, make tsan. Every target sets itself up first (scripts/setup.sh).
PY := .venv/bin/python
BUILD := build
# NOTE: one build at a time in a build folder (several shells may run make at once).
LOCKED := flock $(BUILD)/.lock

.PHONY: all setup build test test-cpp test-python test-fusion test-isa demo finetune bench bench-training bench-kernels bench-fusion bench-decode bench-ir bench-shm bench-collectives bench-distributed bench-compile bench-graphs bench-nki lint asan tsan clean

all: build

setup:
	@bash scripts/setup.sh

build: setup
	@mkdir -p $(BUILD)
	@[ -f $(BUILD)/build.ninja ] || $(LOCKED) cmake -S . -B $(BUILD) -G Ninja -DPython3_EXECUTABLE=$(abspath $(PY))
	@$(LOCKED) cmake --build $(BUILD)

test: test-cpp asan tsan test-python test-fusion test-isa

# Once per SIMD variant this CPU supports (OPENNEURON_ISA), so every code path is proven here.
test-cpp: build
	@for isa in $$($(PY) -c 'import openneuron._C as c; print(" ".join(c._host_isas()))'); do \
	  echo "runtime_tests: OPENNEURON_ISA=$$isa"; \
	  OPENNEURON_ISA=$$isa $(BUILD)/runtime_tests --gtest_brief=1 || exit 1; done

# pytest-xdist: two workers (the distributed tests' ranks and the fresh interpreters wait as
# much as they compute); the database tests' pass counts still print (conftest.py).
PYTEST := $(PY) -m pytest -n 2

test-python: build
	$(PYTEST) tests/python

# The suite again with adaptive eager on (it must change no result): the files that compute
# results. Left out: adaptive eager's own tests (test_fusion.py runs both modes), devices,
# streams, events, memory, RNG, profiler, origin, CLI and storage (no result a fused group
# computes), the Hugging Face ecosystem runs (their numerics are test_hf_models.py's and
# test_training.py's) and the distributed runs; test_opinfo.py keeps only the ops adaptive eager
# records (the rest ran above).
FUSION_FILES := opinfo modules optimizers training hf_models generate tracing lowp_training \
  fusion_math native_kernels native_norms autocast autograd checkpoint grad_scaler \
  recurrent_modules async_aten_path accelerator_only_ops bad_input errors
test-fusion: build
	TORCH_NEURONX_ENABLE_CONCATENATION=1 $(PYTEST) -q \
	  $(foreach f,$(FUSION_FILES),tests/python/test_$(f).py)

# The bitwise tests again under every OPENNEURON_ISA / ATEN_CPU_CAPABILITY / MKL code path.
test-isa: build
	bash scripts/test_isa_matrix.sh

demo: build
	$(PY) examples/03_train_gpt.py

finetune: build
	$(PY) examples/04_finetune_hf.py

bench: build
	$(PY) benchmarks/eager_overhead.py

bench-training: build
	$(PY) benchmarks/training_step.py

bench-kernels: build
	$(PY) benchmarks/kernels.py

bench-fusion: build
	$(PY) benchmarks/fusion.py

bench-decode: build
	$(PY) benchmarks/decode.py --compiled

bench-graphs: build
	$(PY) benchmarks/graphs.py

bench-collectives: build
	$(PY) benchmarks/collectives.py

bench-ir: build
	@$(LOCKED) cmake --build $(BUILD) --target ir_bench
	$(BUILD)/ir_bench

bench-shm: build
	@$(LOCKED) cmake --build $(BUILD) --target shm_bench
	$(BUILD)/shm_bench 2

bench-distributed: build
	$(PY) benchmarks/distributed_training.py

bench-compile: build
	$(PY) benchmarks/compile.py --mfu

bench-nki: build
	$(PY) benchmarks/nki.py

lint: setup
	@command -v clang-format >/dev/null || (echo "lint: apt-get install clang-format" && exit 1)
	clang-format --dry-run --Werror $$(git ls-files 'csrc/*.cpp' 'csrc/*.h' 'tests/cpp/*.cpp')
	.venv/bin/pip install -q ruff && .venv/bin/ruff check openneuron tests benchmarks examples

asan tsan: setup
	cmake -S . -B build-$@ -G Ninja -DOPENNEURON_RUNTIME_ONLY=ON \
	  -DOPENNEURON_SANITIZER=$(if $(filter asan,$@),address,thread)
	cmake --build build-$@
	build-$@/runtime_tests --gtest_brief=1

clean:
	rm -rf $(BUILD) build-asan build-tsan openneuron/_C*.so
