# clmcache: the two commands of the README, and the helpers behind them.
#   make demo   build, then a Debian support bot on the tiny_llama decoder, cache off and on
#   make replay build, then replay the prefix cache over both workloads (hit-rate tables)
#   make test   build, run every test, then again under ASan + UBSan, then every fuzzer for 30 s
#   make soak   the long runs: every fuzzer for 10 minutes (docs/reliability.md)
#   make bench  run every benchmark and write docs/benchmarks.md (tests/bench/report.sh)
SHELL := /bin/bash
BUILD ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
JOBS ?= $(shell nproc)
SHARED ?= $(abspath $(CURDIR)/../shared)
CMAKE_FLAGS ?=

# Debian packages the build and the tests need (installed by `make deps`).
DEBIAN_PACKAGES := cmake make g++ pkg-config libeigen3-dev libhnswlib-dev libsqlite3-dev \
  libfmt-dev catch2 golang-go abigail-tools nlohmann-json3-dev libssl-dev libhiredis-dev redis-server gnuplot-nox \
  debian-faq debian-faq-zh-cn curl libcpp-httplib-dev clang libclang-rt-14-dev

# nvcc lives outside PATH on a stock CUDA install; CMake finds it when told.
NVCC := $(firstword $(shell command -v nvcc 2>/dev/null) $(wildcard /usr/local/cuda/bin/nvcc))
ifneq ($(NVCC),)
  CUDA_FLAGS := -DCMAKE_CUDA_COMPILER=$(NVCC)
endif

.PHONY: all deps build build-asan build-fuzz test test-release test-asan test-fuzz soak soak-fuzz demo replay bench \
  abi-baseline gpu-deps format clean

all: build

deps:
	@missing=""; \
	for p in $(DEBIAN_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || missing="$$missing $$p"; \
	done; \
	command -v cargo >/dev/null 2>&1 || [ -x $$HOME/.cargo/bin/cargo ] || missing="$$missing cargo"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian packages:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	  else \
	    echo "missing Debian packages; run:"; echo "  sudo apt-get install -y$$missing"; exit 1; \
	  fi; \
	fi

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CUDA_FLAGS) $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j$(JOBS)

build-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCLM_SANITIZE=ON -DCLM_CUDA=OFF $(CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD) -j$(JOBS)

test-release: build
	cd $(BUILD) && CLM_SHARED_DIR=$(SHARED) ctest --output-on-failure -j$(JOBS)

# The sanitizer pass runs the same suite, with property tests scaled down
# where a test says so (CLM_PROPERTY_OPS).
test-asan: build-asan
	cd $(ASAN_BUILD) && CLM_SHARED_DIR=$(SHARED) ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j$(JOBS)

# The fuzzers (tests/fuzz, docs/reliability.md): clang + libFuzzer, every
# target and the library under ASan + UBSan. Only the fuzzers and what they
# link are built (no tests, no examples): CI builds this from scratch too.
# Debug: the library's assert()s are on.
build-fuzz: deps
	cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
	  -DCLM_FUZZ=ON -DCLM_CUDA=OFF -DCLM_BUILD_TESTS=OFF -DCLM_BUILD_EXAMPLES=OFF -DCLM_INSTALL=OFF $(CMAKE_FLAGS)
	cmake --build $(FUZZ_BUILD) -j$(JOBS) --target clm_fuzzers

# Each fuzzer for 30 s on a copy of its corpus, two at a time.
test-fuzz: build-fuzz
	bash tests/fuzz/run.sh $(FUZZ_BUILD) 30

test: test-release test-asan test-fuzz

# Long runs, not part of `make test`: each fuzzer for 10 minutes. More soak
# parts join as prerequisites.
soak: soak-fuzz

soak-fuzz: build-fuzz
	bash tests/fuzz/run.sh $(FUZZ_BUILD) 600

# The main job: examples/demo/demo.sh (CLM parts trained on first use, into $(BUILD)/clm-demo).
demo: build
	@examples/demo/demo.sh $(BUILD)

replay: build
	@examples/replay/replay_demo.sh $(BUILD)/examples/replay/replay $(SHARED)

# Every bench program and the replay's hit-rate sweeps, then docs/benchmarks.md
# and docs/bench-*.png (JSON lines kept in $(BUILD)/bench-results). Run it on a
# quiet machine. CLM_BENCH_SMOKE=1 make bench: a minute or two, into a
# temporary folder, figures that mean nothing.
bench: build
	CLM_SHARED_DIR=$(SHARED) cmake --build $(BUILD) --target bench

# Regenerate tests/abi/libclmcache.abi after an intended ABI change; commit it with the change.
abi-baseline: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CUDA_FLAGS) $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j$(JOBS) --target clmcache
	bash tests/abi/update_baseline.sh $(BUILD)

# Debian's packages of the build's libraries in .gpu-deps/deps.tar.gz, for a GPU
# machine with no package registry (tests/gpu/run.sh builds against it there).
gpu-deps:
	bash tests/gpu/pack_deps.sh

format:
	clang-format -i $$(git ls-files '*.hpp' '*.cpp' '*.h' '*.c' '*.cu')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
