# Tern: `make run` serves model_repository/ on :8000; `make test` runs every test.
# Both set up whatever a fresh machine lacks (Python venv, ONNX Runtime library, models).

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
ORT_DIR := .cache/onnxruntime
ORT_LIB := $(ORT_DIR)/libonnxruntime.so
PERF_ANALYZER := .cache/perf_analyzer/perf_analyzer
CARGO ?= cargo
export CARGO_TARGET_DIR ?= $(CURDIR)/target
# A CI run builds everything once: incremental caches would only take disk
# (~2.6 GB of target/debug over the feature sets it builds).
ifdef CI
export CARGO_INCREMENTAL ?= 0
endif
export ORT_DYLIB_PATH ?= $(CURDIR)/$(ORT_LIB)
# The servers the tests start cache compiled plugins in the clone, not in
# the user's cache folder (bounded there too, by --wasm-cache-max-size);
# pytest.ini has passing tests' temporary folders removed.
TEST_TARGETS := test-fast unit flavours e2e ort-oldest test-ort-versions test-vs-triton test-torch smoke-aarch64 package-check image-check jetson-context
$(TEST_TARGETS): export TERN_WASM_CACHE_DIR := $(CARGO_TARGET_DIR)/test-wasm-cache
# LibTorch for the pytorch backend (see `torch`).
LIBTORCH_DIR := .cache/libtorch
LIBTORCH_STAMP := $(LIBTORCH_DIR)/build-version
TORCH_BIN := $(CARGO_TARGET_DIR)/torch/tern
TORCH_ENV := LIBTORCH=$(CURDIR)/$(LIBTORCH_DIR)
ifeq ($(TORCH),1)
export LIBTORCH := $(CURDIR)/$(LIBTORCH_DIR)
endif

.PHONY: bench-static ort-oldest test-ort-versions fuzz fuzz-build fuzz-long python-runner bench-python bench-python-interpreter stage-clock stage-times run test test-fast setup build release unit e2e flavours torch torch-cuda test-torch bench-torch smoke-aarch64 package-check image-check jetson-context images dashboard-png dist lint toolchains c-toolchain test-audio lang-plugins bench bench-reload bench-shm bench-alloc bench-batching bench-sequences bench-streaming soak bench-grpc bench-plugins bench-lang bench-tokenizer bench-embedding bench-detection bench-ort bench-ort-isolated bench-peers clippy clean models plugins test-vs-triton redis-server bench-cache bench-trace bench-unix

setup: $(VENV)/.stamp $(ORT_LIB) models plugins $(PERF_ANALYZER)
	@rustup which clippy-driver >/dev/null 2>&1 || rustup component add clippy
	$(call mark,setup)

# The time of each stage of `make test`, printed at its end (and by .ci/run
# when a stage fails) so the CI budget stays visible: each stage appends
# "<stage> <epoch seconds>" when it is done; a stage's time runs from the
# mark before it, so it includes whatever prerequisites ran first.
STAGE_LOG := $(CURDIR)/.cache/stage-times
mark = @mkdir -p $(dir $(STAGE_LOG)) && echo "$(1) $$(date +%s)" >> $(STAGE_LOG)
stage-clock:
	@mkdir -p $(dir $(STAGE_LOG)) && echo "start $$(date +%s)" > $(STAGE_LOG)
stage-times:
	@test -f $(STAGE_LOG) && awk 'NR == 1 { t0 = prev = $$2; print "stage times:"; next } \
		{ printf "  %-16s %6d s\n", $$1, $$2 - prev; prev = $$2 } \
		END { printf "  %-16s %6d s (%.1f min)\n", "total", prev - t0, (prev - t0) / 60 }' $(STAGE_LOG)

$(VENV)/.stamp: tests/requirements.txt tests/requirements-nodeps.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -r tests/requirements.txt
	$(VENV)/bin/pip install -q --no-deps -r tests/requirements-nodeps.txt
	touch $@

# The ONNX Runtime shared library comes from the onnxruntime PyPI wheel.
$(ORT_LIB): $(VENV)/.stamp
	mkdir -p $(ORT_DIR)
	cp "$$($(PY) -c 'import glob, os, onnxruntime; print(sorted(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so*")))[0])')" $@

# Triton's perf_analyzer for the end-to-end tests (PyPI wheel + Debian 13's glibc; see the script).
$(PERF_ANALYZER): scripts/get_perf_analyzer.sh | $(VENV)/.stamp
	bash scripts/get_perf_analyzer.sh $(dir $@) $(PY)

models: $(VENV)/.stamp
	@test -f model_repository/tiny_lm/1/model.onnx || $(PY) scripts/gen_models.py example model_repository
	@test -f model_repository/minilm/1/model.onnx -a -f model_repository/bert_tokenizer/1/vocab.txt || $(PY) scripts/gen_minilm.py model_repository
	@test -f model_repository/silero_vad/1/model.onnx || $(PY) scripts/get_silero_vad.py model_repository
	@test -f model_repository/magika_model/1/model.onnx -a -f model_repository/magika_post/1/content_types_kb.min.json -a -f model_repository/magika_prep/1/config.min.json || $(PY) scripts/get_magika.py model_repository

# WebAssembly plugins (plugins/, own cargo workspace) and the examples served from model_repository/.
WASM_OUT := $(CARGO_TARGET_DIR)/wasm32-wasip2/release
EXAMPLE_PLUGINS := add_sub simple_identity bert_tokenizer embed_pool greedy_decoder prep_rust magika_prep magika_post
plugins:
	@rustup target list --installed | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2
	cd plugins && $(CARGO) build --release --target wasm32-wasip2
	@for p in $(EXAMPLE_PLUGINS); do mkdir -p model_repository/$$p/1 && cp $(WASM_OUT)/$$p.wasm model_repository/$$p/1/model.wasm; done
	@mkdir -p model_repository/greedy_decoder_stream/1 && cp $(WASM_OUT)/greedy_decoder.wasm model_repository/greedy_decoder_stream/1/model.wasm

# Plugins in Python, JavaScript and C, built by `tern plugin build` (so the
# binary must exist first) with toolchains make installs: componentize-py
# (venv), jco (npm, under .cache/jco), clang + wasi-libc (apt).
JCO := .cache/jco/node_modules/.bin/jco
export TERN_JCO := $(CURDIR)/$(JCO)
export TERN_COMPONENTIZE_PY := $(CURDIR)/$(VENV)/bin/componentize-py
LANG_PLUGINS := prep_python prep_js prep_c misbehave_python stream_python stream_js stream_c stream_relay_python nudenet_prep topk_python topk_js topk_c ops_python
LANG_EXAMPLES := prep_python prep_js prep_c
TERN_TOOL ?= $(CARGO_TARGET_DIR)/debug/tern

$(JCO):
	npm install --prefix .cache/jco --no-audit --no-fund @bytecodealliance/jco@1.35.0

c-toolchain:
	@command -v clang >/dev/null && test -f /usr/lib/wasm32-wasi/libc.a && test -f "$$(clang --print-resource-dir)/lib/wasi/libclang_rt.builtins-wasm32.a" \
		|| (apt-get update -qq && apt-get install -y -qq clang lld wasi-libc libclang-rt-dev-wasm32)

toolchains: $(VENV)/.stamp $(JCO) c-toolchain
	@rustup target list --installed | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2

$(WASM_OUT)/%.wasm: plugins/%/app.py guest-sdk/python/tern_plugin.py guest-sdk/python/tern_ops.py wit/plugin.wit | $(TERN_TOOL)
	$(TERN_TOOL) plugin build plugins/$* --wit wit --sdk guest-sdk/python --cache-dir none -o $@
$(WASM_OUT)/%.wasm: plugins/%/model.js guest-sdk/js/tern.js wit/plugin.wit | $(TERN_TOOL)
	$(TERN_TOOL) plugin build plugins/$* --wit wit --sdk guest-sdk/js --cache-dir none -o $@
$(WASM_OUT)/%.wasm: plugins/%/model.c guest-sdk/c/tern_plugin.c guest-sdk/c/tern_plugin.h wit/plugin.wit | $(TERN_TOOL)
	$(TERN_TOOL) plugin build plugins/$* --wit wit --sdk guest-sdk/c --cache-dir none -o $@

# The Python runner: the one prebuilt component that serves Triton Python
# models (backend: "python", <version>/model.py) with no build step
# (guest-sdk/python/runner), copied beside the binary, where the server looks.
PYTHON_RUNNER_SRC := $(wildcard guest-sdk/python/runner/*.py) guest-sdk/python/tern_plugin.py guest-sdk/python/tern_ops.py wit/plugin.wit
$(WASM_OUT)/python-runner.wasm: $(PYTHON_RUNNER_SRC) | $(TERN_TOOL)
	$(TERN_TOOL) plugin build guest-sdk/python/runner --wit wit --sdk guest-sdk/python --cache-dir none -o $@

python-runner: toolchains $(WASM_OUT)/python-runner.wasm
	cp $(WASM_OUT)/python-runner.wasm $(dir $(TERN_TOOL))python-runner.wasm

lang-plugins: toolchains $(foreach p,$(LANG_PLUGINS),$(WASM_OUT)/$(p).wasm) python-runner
	@for p in $(LANG_EXAMPLES); do mkdir -p model_repository/$$p/1 && cp $(WASM_OUT)/$$p.wasm model_repository/$$p/1/model.wasm; done

# `make run TORCH=1` (or `make release TORCH=1`): the release build with the
# pytorch backend, which links LibTorch (~440 MB of libraries; see `torch`).
ifeq ($(TORCH),1)
RELEASE_FEATURES := --features torch
RELEASE_DEPS := $(LIBTORCH_STAMP)
endif

release: setup $(RELEASE_DEPS)
	$(CARGO) build --release -p tern $(RELEASE_FEATURES)

# Extra server flags: make run ARGS="--log-verbose=1".
run: release
	$(MAKE) lang-plugins TERN_TOOL=$(CARGO_TARGET_DIR)/release/tern
	$(CARGO_TARGET_DIR)/release/tern --model-repository=model_repository $(ARGS)

# Clippy runs inside the debug builds the tests use: cargo hands each
# workspace crate to clippy's driver (RUSTC_WORKSPACE_WRAPPER, as `cargo
# clippy` does), which compiles it and lints it in one pass, with every
# warning an error. So `make unit` lints the workspace with all its targets
# (tests and the benchmark examples), `make flavours` the build without
# default features and `make test-torch` the torch flavour, and CI never
# type-checks the dependency graph a second time for a separate clippy run.
# Every debug build in this file carries $(LINTED), so they share artifacts;
# a plain `cargo build` afterwards recompiles the workspace crates once.
# The driver's path is looked up when each command runs (`make setup`
# installs the clippy component first on a machine without it).
LINTED := RUSTC_WORKSPACE_WRAPPER=$$(rustup which clippy-driver) CLIPPY_ARGS=-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__
CLIPPY := $(LINTED) $(CARGO)

lint:
	python3 scripts/check_links.py
	$(CARGO) fmt --all --check
	$(call mark,lint)

# Clippy alone, as a separate pass: every target of the workspace and the
# build without default features (what `make unit` and `make flavours` lint
# while they build).
clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy -p tern --no-default-features -- -D warnings

# The edit loop: every crate's unit tests, the Rust integration tests and the
# component tests; no language toolchains, no e2e (tests/README.md). The
# ONNX Runtime library comes from the venv (a test needs it, and fails without).
test-fast: $(ORT_LIB)
	@rustup target list --installed | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2
	$(CLIPPY) test --workspace --lib --bins --tests

# Unit + Rust integration tests and doc tests (debug profile, linted); the
# benchmark examples are built too. The same build's binary drives the e2e tests.
unit: setup
	$(CLIPPY) test --workspace
	cd plugins && $(CARGO) test -p wordpiece -p prep_rust -p magika_prep -p magika_post
	$(call mark,unit)

# Coverage-guided fuzzing (fuzz/README.md): libFuzzer through libfuzzer-sys
# on stable Rust; the coverage instrumentation is added by
# scripts/fuzz-rustc.sh to Tern's own crates and the targets only. The crate is its own workspace (fuzz/Cargo.lock), built into
# target/fuzz at opt-level 1 (linted by clippy like the workspace).
# `make fuzz` (part of `make test`) runs every target from the committed
# corpus for FUZZ_SECONDS each (new inputs go to a scratch folder, not the corpus); `make fuzz-long
# TARGET=<t> SECONDS=<n>` runs one, then minimises fuzz/corpus/<t> with
# what it found (-merge=1); RUNS=<n> stops it after n executions if that
# comes first (its log: target/fuzz/logs/long-<target>.log).
FUZZ_TARGETS := http_infer http_generate grpc_infer shm_region config_pbtxt config_json labels warmup plugin_outputs plugin_metrics image
FUZZ_SECONDS ?= 4
FUZZ_TRIPLE := $(shell rustc -vV | sed -n 's/^host: //p')
FUZZ_DIR := $(CARGO_TARGET_DIR)/fuzz
# `make fuzz` builds the cheap `smoke` profile (opt-level 0, the same checks and
# instrumentation), the campaigns the optimised `release` one.
FUZZ_PROFILE ?= release
fuzz: FUZZ_PROFILE := smoke
FUZZ_BIN = $(FUZZ_DIR)/$(FUZZ_TRIPLE)/$(FUZZ_PROFILE)
FUZZ_RUSTFLAGS := --cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
	-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
	-Cllvm-args=-sanitizer-coverage-trace-compares
# A hang is an input taking over 1 s; an allocation over 1 GiB or 2 GiB resident fails too.
FUZZ_LIMITS := -timeout=1 -rss_limit_mb=2048 -malloc_limit_mb=1024
fuzz-build:
	cd fuzz && RUSTC_WRAPPER=$(CURDIR)/scripts/fuzz-rustc.sh FUZZ_RUSTFLAGS="$(FUZZ_RUSTFLAGS)" \
		CARGO_TARGET_DIR=$(FUZZ_DIR) $(LINTED) \
		$(CARGO) build --profile $(FUZZ_PROFILE) --locked --target $(FUZZ_TRIPLE) --bins
fuzz: fuzz-build
	@mkdir -p $(FUZZ_DIR)/logs
	@for t in $(FUZZ_TARGETS); do \
		rm -rf $(FUZZ_DIR)/scratch/$$t && mkdir -p $(FUZZ_DIR)/scratch/$$t $(FUZZ_DIR)/artifacts/$$t fuzz/corpus/$$t && \
		$(FUZZ_BIN)/$$t $(FUZZ_LIMITS) -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
			-artifact_prefix=$(FUZZ_DIR)/artifacts/$$t/ $(FUZZ_DIR)/scratch/$$t fuzz/corpus/$$t \
			> $(FUZZ_DIR)/logs/$$t.log 2>&1 \
			|| { tail -n 40 $(FUZZ_DIR)/logs/$$t.log; echo "fuzz $$t failed (log: $(FUZZ_DIR)/logs/$$t.log)"; exit 1; }; \
		echo "fuzz $$t: $$(grep -E '^#[0-9]+[[:space:]]+DONE' $(FUZZ_DIR)/logs/$$t.log | head -n 1)"; \
	done
	$(call mark,fuzz)
SECONDS ?= 600
fuzz-long: fuzz-build
	@test -n "$(TARGET)" || { echo "usage: make fuzz-long TARGET=<target> SECONDS=<n>"; exit 2; }
	rm -rf $(FUZZ_DIR)/long/$(TARGET) $(FUZZ_DIR)/merged/$(TARGET)
	mkdir -p $(FUZZ_DIR)/logs $(FUZZ_DIR)/long/$(TARGET) $(FUZZ_DIR)/merged/$(TARGET) $(FUZZ_DIR)/artifacts/$(TARGET) fuzz/corpus/$(TARGET) fuzz/seeds/$(TARGET)
	$(FUZZ_BIN)/$(TARGET) $(FUZZ_LIMITS) -max_total_time=$(SECONDS) $(if $(RUNS),-runs=$(RUNS)) -print_final_stats=1 \
		-artifact_prefix=$(FUZZ_DIR)/artifacts/$(TARGET)/ $(FUZZ_DIR)/long/$(TARGET) fuzz/corpus/$(TARGET) fuzz/seeds/$(TARGET) \
		2>&1 | tee $(FUZZ_DIR)/logs/long-$(TARGET).log; test $${PIPESTATUS[0]} -eq 0
	$(FUZZ_BIN)/$(TARGET) $(FUZZ_LIMITS) -merge=1 $(FUZZ_DIR)/merged/$(TARGET) \
		fuzz/corpus/$(TARGET) fuzz/seeds/$(TARGET) $(FUZZ_DIR)/long/$(TARGET)
	rm -rf fuzz/corpus/$(TARGET) && cp -r $(FUZZ_DIR)/merged/$(TARGET) fuzz/corpus/$(TARGET)
	@echo "fuzz/corpus/$(TARGET): $$(ls fuzz/corpus/$(TARGET) | wc -l) files, $$(du -sk --apparent-size fuzz/corpus/$(TARGET) | cut -f1) KB"

# The build without default features (WebAssembly plugins + identity, no
# ONNX Runtime, no CUDA): its binary for tests/test_build_flavours.py,
# linted by clippy as it builds (its unit tests are the default build's).
# Built in the same target dir, then copied out, so the default binary is
# relinked, not rebuilt.
MINIMAL_BIN := $(CARGO_TARGET_DIR)/minimal/tern
flavours: setup
	$(CLIPPY) build -p tern --no-default-features
	mkdir -p $(dir $(MINIMAL_BIN)) && cp $(CARGO_TARGET_DIR)/debug/tern $(MINIMAL_BIN)
	$(CLIPPY) build -p tern
	$(call mark,flavours)

# The pytorch backend (cargo feature `torch`): TorchScript through LibTorch
# (tch), which the binary links, so it is not in the default build. LibTorch
# 2.13.0 is assembled from PyPI wheels without installing PyTorch (CPU set:
# torch --no-deps plus the CUDA runtime and CUPTI libraries libtorch_cpu
# links, ~440 MB), or hard-linked from the venv's PyTorch once that is
# installed; the binary finds it through its rpath. The flavour is built in
# the same target dir and copied out, like `flavours`.
$(LIBTORCH_STAMP): scripts/get_libtorch.py | $(VENV)/.stamp
	$(PY) scripts/get_libtorch.py $(LIBTORCH_DIR)

torch: setup $(LIBTORCH_STAMP)
	$(TORCH_ENV) $(CLIPPY) build -p tern --features torch
	mkdir -p $(dir $(TORCH_BIN)) && cp $(CARGO_TARGET_DIR)/debug/tern $(TORCH_BIN)
	$(CLIPPY) build -p tern

# PyTorch itself (with its CUDA wheels: ~4.6 GB, ~1 min here) for the tests
# and the benchmark, which make TorchScript models and compare with torch.
TORCH_PY := $(VENV)/.torch-stamp
$(TORCH_PY): $(VENV)/.stamp
	$(VENV)/bin/pip install -q torch==2.13.0
	touch $@

# The CUDA flavour: libtorch_cuda and the CUDA 13 libraries it loads (cuBLAS,
# cuDNN, NCCL, ...: ~3.6 GB of NVIDIA's PyPI wheels, hard-linked from the
# venv's PyTorch, so no second copy) linked for KIND_GPU instances. Checked
# here by linking it and starting it without a GPU.
LIBTORCH_CUDA_DIR := .cache/libtorch-cuda
TORCH_CUDA_ENV := LIBTORCH=$(CURDIR)/$(LIBTORCH_CUDA_DIR)
TORCH_CUDA_BIN := $(CARGO_TARGET_DIR)/torch-cuda/tern
$(LIBTORCH_CUDA_DIR)/build-version: scripts/get_libtorch.py | $(VENV)/.stamp $(TORCH_PY)
	$(PY) scripts/get_libtorch.py $(LIBTORCH_CUDA_DIR) --cuda

torch-cuda: setup $(LIBTORCH_CUDA_DIR)/build-version $(TORCH_PY)
	$(TORCH_CUDA_ENV) $(CLIPPY) build -p tern --features torch-cuda
	mkdir -p $(dir $(TORCH_CUDA_BIN)) && cp $(CARGO_TARGET_DIR)/debug/tern $(TORCH_CUDA_BIN)
	$(CLIPPY) build -p tern
	ldd $(TORCH_CUDA_BIN) | grep -q 'libtorch_cuda.so => /'
	$(TORCH_CUDA_BIN) --version | grep 'libtorch: .*CUDA linked'

# The pytorch tests run on one build, the CUDA flavour: without a GPU it runs
# TorchScript on the CPU as the `torch` build does (the same code, with
# libtorch_cuda linked besides), so one LibTorch build proves both and CI
# compiles torch-sys and the server once for them. `make torch` (the CPU
# LibTorch) stays for `make run TORCH=1` and `make bench-torch`.
test-torch: torch-cuda
	$(TORCH_CUDA_ENV) $(CLIPPY) test -p tern-torch --features cuda
	TERN_TORCH_BIN=$(TORCH_CUDA_BIN) TERN_PLUGINS_DIR=$(WASM_OUT) $(PY) -m pytest tests/test_torch.py -q -rs
	$(call mark,test-torch)

# TorchScript through Tern vs torch.jit.load in Python (docs/PERFORMANCE.md):
# ResNet-18 and a small CNN, 3 interleaved rounds, ~20 min after the build
# (BENCH_ARGS="--models torch_bench --rounds 1" for a quick look).
TORCH_RELEASE_BIN := $(CARGO_TARGET_DIR)/torch-release/tern
bench-torch: setup $(LIBTORCH_STAMP) $(TORCH_PY)
	$(TORCH_ENV) $(CARGO) build --release -p tern --features torch
	mkdir -p $(dir $(TORCH_RELEASE_BIN)) && cp $(CARGO_TARGET_DIR)/release/tern $(TORCH_RELEASE_BIN)
	$(PY) tests/bench/torch_models.py --tern $(TORCH_RELEASE_BIN) $(BENCH_ARGS)

# espeak-ng (Debian) speaks the test audio of the Silero VAD stream tests.
test-audio:
	@command -v espeak-ng >/dev/null || (apt-get update -qq && apt-get install -y -qq espeak-ng)

# Test files another target runs with what it builds (the pytorch build, the
# images, the Jetson context, Triton itself); `make e2e` fails on any skip not about a GPU.
E2E_OWN_TARGETS := --ignore=tests/test_torch.py --ignore=tests/test_images.py --ignore=tests/test_jetson_recipe.py --ignore=tests/test_vs_triton.py --ignore=tests/test_vs_triton_sequences.py
# Debian's redis-server for the redis response cache's tests (they start their own on a free port).
redis-server:
	@command -v redis-server >/dev/null || (apt-get update -qq && apt-get install -y -qq --no-install-recommends redis-server >/dev/null)

# Azurite (npm), the Azure Blob server tests/test_remote_repository.py starts for as:// repositories.
AZURITE := .cache/azurite/node_modules/.bin/azurite-blob
export TERN_AZURITE := $(CURDIR)/$(AZURITE)
$(AZURITE):
	npm install --prefix .cache/azurite --no-audit --no-fund azurite@3.35.0

e2e: setup flavours test-audio redis-server $(AZURITE)
	$(CLIPPY) build --workspace
	$(MAKE) lang-plugins TERN_TOOL=$(CARGO_TARGET_DIR)/debug/tern
	TERN_BIN=$(CARGO_TARGET_DIR)/debug/tern TERN_MINIMAL_BIN=$(MINIMAL_BIN) TERN_PLUGINS_DIR=$(WASM_OUT) TERN_STRICT_SKIPS=1 \
		$(PY) -m pytest tests -q -rs --durations=15 -n 2 --dist loadfile --no-loadscope-reorder $(E2E_OWN_TARGETS)
	$(call mark,e2e)

# The ONNX Runtime versions Tern runs with (docs/deployment.md, "ONNX Runtime
# versions"): the ONNX end-to-end tests against older libraries (PyPI wheels
# from 1.19, the onnxruntime-node npm package before), then, with
# test-ort-versions, the device smoke test under qemu on aarch64 too.
# `make test` runs the oldest (the API level Tern asks for) on
# x86_64 here and on aarch64 in smoke-aarch64.
ORT_OLDEST := 1.17.3
ORT_VERSIONS ?= 1.17.3 1.18.0 1.19.2 1.20.1 1.22.1
ORT_VERSION_TESTS := tests/test_http.py tests/test_grpc.py tests/test_accelerators.py tests/test_batching.py \
	tests/test_sequences.py tests/test_ensembles.py tests/test_shm.py tests/test_errors.py
ort-lib = $$($(PY) scripts/dist.py --arch $(1) --onnxruntime-only --onnxruntime-version $(2))
# Each library is checked to be the version asked for (by what `tern
# --version` reads from it) before the tests run on it.
define ort-version-tests
	set -e; for v in $(1); do echo "== ONNX Runtime $$v (x86_64)"; \
		lib=$(call ort-lib,x86_64,$$v); \
		ORT_DYLIB_PATH=$$lib $(CARGO_TARGET_DIR)/debug/tern --version | grep -F "onnxruntime: $$v at "; \
		TERN_BIN=$(CARGO_TARGET_DIR)/debug/tern TERN_MINIMAL_BIN=$(MINIMAL_BIN) TERN_PLUGINS_DIR=$(WASM_OUT) \
		TERN_STRICT_SKIPS=1 ORT_DYLIB_PATH=$$lib \
		$(PY) -m pytest $(ORT_VERSION_TESTS) -q -rs -n 2 --dist loadfile; done
endef
ort-oldest: setup flavours
	$(CLIPPY) build --workspace
	$(MAKE) lang-plugins TERN_TOOL=$(CARGO_TARGET_DIR)/debug/tern
	$(call ort-version-tests,$(ORT_OLDEST))
	$(call mark,ort-oldest)

test-ort-versions: smoke-aarch64 flavours
	$(call ort-version-tests,$(ORT_VERSIONS))
	set -e; for v in $(ORT_VERSIONS); do echo "== ONNX Runtime $$v (aarch64, qemu)"; \
		lib=$(call ort-lib,aarch64,$$v); \
		TERN_BIN=$(QEMU_DIR)/tern TERN_HOST_BIN=$(CARGO_TARGET_DIR)/debug/tern TERN_SMOKE_TARGET=aarch64-unknown-linux-gnu \
		TERN_SMOKE_ORT_LIBS=$$lib TERN_PLUGINS_DIR=$(WASM_OUT) \
		$(PY) -m pytest tests/test_device_smoke.py -q -rs; done

test: stage-clock setup lint unit fuzz e2e ort-oldest test-vs-triton test-torch smoke-aarch64 package-check image-check
	@$(MAKE) --no-print-directory stage-times

# Cross builds with cargo-zigbuild (the ziglang wheel is the C toolchain and
# libc for every target): glibc 2.31 for JetPack 5 and newer, static musl.
ZIG_STAMP := $(VENV)/.zig-stamp
ZIG_PATH := PATH=$(CURDIR)/$(VENV)/bin:$$PATH
$(ZIG_STAMP): $(VENV)/.stamp
	$(VENV)/bin/pip install -q ziglang==0.17.1 cargo-zigbuild==0.24.0
	touch $@

# The aarch64 binary (profile `cross`, glibc <= 2.31) under qemu-user with a
# 39-bit address space and plugins precompiled here: tests/test_device_smoke.py.
QEMU_DIR := .cache/qemu-aarch64
AARCH64_BIN := $(CARGO_TARGET_DIR)/aarch64-unknown-linux-gnu/cross/tern
smoke-aarch64: setup $(ZIG_STAMP)
	@rustup target list --installed | grep -qx aarch64-unknown-linux-gnu || rustup target add aarch64-unknown-linux-gnu
	$(CLIPPY) build -p tern
	$(MAKE) lang-plugins TERN_TOOL=$(CARGO_TARGET_DIR)/debug/tern
	$(ZIG_PATH) $(PY) scripts/dist.py --arch aarch64 --profile cross --build-only
	bash scripts/qemu-aarch64.sh $(QEMU_DIR) $(AARCH64_BIN)
	TERN_BIN=$(QEMU_DIR)/tern TERN_HOST_BIN=$(CARGO_TARGET_DIR)/debug/tern TERN_SMOKE_TARGET=aarch64-unknown-linux-gnu \
		TERN_SMOKE_ORT_LIBS=$$($(PY) scripts/dist.py --arch aarch64 --onnxruntime-only),$(call ort-lib,aarch64,$(ORT_OLDEST)) \
		TERN_PLUGINS_DIR=$(WASM_OUT) $(PY) -m pytest tests/test_device_smoke.py -q
	$(call mark,smoke-aarch64)

# The aarch64 tarball and .deb from that build: lintian, then the packaged
# binary extracted and run (it must find ONNX Runtime where the package put it).
package-check: smoke-aarch64
	@command -v lintian >/dev/null || (apt-get update -qq && apt-get install -y -qq lintian)
	$(CLIPPY) build --workspace
	$(MAKE) python-runner TERN_TOOL=$(CARGO_TARGET_DIR)/debug/tern
	$(ZIG_PATH) $(PY) scripts/dist.py --arch aarch64 --profile cross --out .cache/package-check
	bash scripts/check-packages.sh .cache/package-check $(QEMU_DIR)/root
	$(call mark,package-check)

# The images, built with umoci and skopeo (no Docker daemon) from the gnu
# tarballs, then unpacked and run by tests/test_images.py: tern:<version>-cpu (a
# multi-architecture OCI index over amd64 and arm64) and tern:<version>-cuda
# (amd64: ONNX Runtime's GPU build and the CUDA 13 libraries its providers load,
# ~1.4 GB of wheels from PyPI into .cache/image-cuda), each as an OCI layout and
# an oci-archive. The cuda build fails if images/cuda-manifest.json (what the
# image takes from the wheels) differs from the pinned wheels: after changing the
# pins, `scripts/images.py --flavour cuda --write-manifest` rewrites it.
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
IMAGE_TOOLS := command -v umoci >/dev/null && command -v skopeo >/dev/null || (apt-get update -qq && apt-get install -y -qq umoci skopeo)
images: dist
	@$(IMAGE_TOOLS)
	$(PY) scripts/images.py --tarballs dist --out dist
	TERN_IMAGE_LAYOUT=dist/oci TERN_IMAGE_TAG=$(VERSION)-cpu $(PY) -m pytest tests/test_images.py -q
	TERN_IMAGE_LAYOUT=dist/oci TERN_IMAGE_TAG=$(VERSION)-cpu-python $(PY) -m pytest tests/test_images.py -q -k "index or entrypoint"
	$(PY) scripts/images.py --flavour cuda --tarballs dist --out dist
	TERN_IMAGE_LAYOUT=dist/oci-cuda TERN_IMAGE_TAG=$(VERSION)-cuda $(PY) -m pytest tests/test_images.py -q

# CI's image check: the same images from the cheapest builds that prove
# them: arm64 from the `cross` aarch64 tarball package-check made, amd64 from
# the debug build the tests ran (the image ships its own glibc, so the
# glibc <= 2.31 build that the aarch64 one proves is not needed to prove the
# image), and the Jetson recipe's context. The cuda image is built from
# images/cuda-manifest.json without the wheels: placeholders at the manifest's
# paths, its pins and libraries checked against scripts/images.py and every
# DT_NEEDED resolved inside the image (`make images` checks the manifest itself).
image-check: package-check jetson-context
	@$(IMAGE_TOOLS)
	$(PY) scripts/dist.py --arch x86_64 --binary $(CARGO_TARGET_DIR)/debug/tern --out .cache/package-check --no-deb
	$(PY) scripts/images.py --tarballs .cache/package-check --out .cache/image-check
	TERN_IMAGE_LAYOUT=.cache/image-check/oci TERN_IMAGE_TAG=$(VERSION)-cpu $(PY) -m pytest tests/test_images.py -q
	TERN_IMAGE_LAYOUT=.cache/image-check/oci TERN_IMAGE_TAG=$(VERSION)-cpu-python $(PY) -m pytest tests/test_images.py -q -k "index or entrypoint"
	$(PY) scripts/images.py --flavour cuda --from-manifest --tarballs .cache/package-check --out .cache/image-check --no-archive
	TERN_IMAGE_LAYOUT=.cache/image-check/oci-cuda TERN_IMAGE_TAG=$(VERSION)-cuda $(PY) -m pytest tests/test_images.py -q
	$(call mark,image-check)

# docs/img/dashboard.png: the Grafana dashboard's queries (deploy/grafana/tern.json)
# evaluated over scrapes of a server under ~2.5 minutes of real traffic and drawn
# with matplotlib (Grafana is not installable here).
dashboard-png: setup plugins
	$(CLIPPY) build -p tern
	$(MAKE) lang-plugins TERN_TOOL=$(CARGO_TARGET_DIR)/debug/tern
	$(PY) -c 'import matplotlib' 2>/dev/null || $(PY) -m pip install -q matplotlib==3.11.2
	$(PY) scripts/dashboard_plot.py --binary $(CARGO_TARGET_DIR)/debug/tern --plugins-dir $(WASM_OUT)

# The Jetson recipe (images/jetson/, never built here: no Jetson, no nvcr.io): its
# build context from the cheap `cross` aarch64 tarball with the plugins precompiled
# on this machine, checked by tests/test_jetson_recipe.py (stages, bases and config
# of the Containerfile, the ONNX Runtime steps, the binary under qemu on the cache).
JETSON_TARBALL := .cache/package-check/tern-$(VERSION)-aarch64-linux-gnu.tar.gz
jetson-context: package-check
	@command -v curl >/dev/null || (apt-get update -qq && apt-get install -y -qq --no-install-recommends curl >/dev/null)
	$(PY) scripts/jetson_context.py --tarball $(JETSON_TARBALL) --tern-host $(CARGO_TARGET_DIR)/debug/tern --out .cache/jetson-context
	TERN_JETSON_CONTEXT=.cache/jetson-context TERN_JETSON_TARBALL=$(JETSON_TARBALL) TERN_HOST_BIN=$(CARGO_TARGET_DIR)/debug/tern \
		$(PY) -m pytest tests/test_jetson_recipe.py -q
	$(call mark,jetson-context)

# Release artifacts in dist/: tarballs (x86_64, aarch64: glibc 2.31 + ONNX
# Runtime; static musl plugins-only) and .debs, with the `dist` profile (fat
# LTO); ~15 minutes per target on 2 cores. Sizes: docs/deployment.md.
dist: setup $(ZIG_STAMP)
	@for t in aarch64-unknown-linux-gnu x86_64-unknown-linux-musl aarch64-unknown-linux-musl; do \
		rustup target list --installed | grep -qx $$t || rustup target add $$t; done
	@command -v lintian >/dev/null || (apt-get update -qq && apt-get install -y -qq lintian)
	$(CLIPPY) build --workspace
	$(MAKE) python-runner TERN_TOOL=$(CARGO_TARGET_DIR)/debug/tern
	rm -rf dist
	for a in x86_64 aarch64; do $(ZIG_PATH) $(PY) scripts/dist.py --arch $$a --flavour gnu && \
		$(ZIG_PATH) $(PY) scripts/dist.py --arch $$a --flavour musl || exit 1; done
	bash scripts/qemu-aarch64.sh $(QEMU_DIR) $(CARGO_TARGET_DIR)/aarch64-unknown-linux-gnu/dist/tern
	bash scripts/check-packages.sh dist $(QEMU_DIR)/root

# Load benchmark (release build): see docs/PERFORMANCE.md.
bench: release
	$(MAKE) lang-plugins TERN_TOOL=$(CARGO_TARGET_DIR)/release/tern
	@command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk)
	$(CARGO) build --release -p tern --example baseline
	$(PY) tests/bench/http_load.py --tern $(CARGO_TARGET_DIR)/release/tern --baseline $(CARGO_TARGET_DIR)/release/examples/baseline

bench-reload: release
	@command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk)
	$(PY) tests/bench/reload.py --tern $(CARGO_TARGET_DIR)/release/tern

bench-remote: release
	$(PY) tests/bench/remote_swap.py --tern $(CARGO_TARGET_DIR)/release/tern

bench-shm: release
	$(PY) tests/bench/shm.py --tern $(CARGO_TARGET_DIR)/release/tern

# The response cache, local and redis, vs no cache (docs/PERFORMANCE.md).
bench-cache: release redis-server $(PERF_ANALYZER)
	$(PY) tests/bench/response_cache.py --tern $(CARGO_TARGET_DIR)/release/tern --perf-analyzer $(PERF_ANALYZER)

bench-trace: release $(PERF_ANALYZER)
	$(PY) tests/bench/trace_overhead.py --tern $(CARGO_TARGET_DIR)/release/tern --perf-analyzer $(PERF_ANALYZER)

# gRPC over a Unix-domain socket vs loopback TCP, one server serving both,
# perf_analyzer at concurrency 1 and 16, interleaved (docs/PERFORMANCE.md,
# "Unix-domain sockets"; ~1 min).
bench-unix: release $(PERF_ANALYZER)
	$(PY) tests/bench/unix_sockets.py --tern $(CARGO_TARGET_DIR)/release/tern --perf-analyzer $(PERF_ANALYZER)

bench-batching: release
	@command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk)
	$(PY) tests/bench/batching.py --tern $(CARGO_TARGET_DIR)/release/tern

bench-sequences: release
	$(PY) tests/bench/sequences.py --tern $(CARGO_TARGET_DIR)/release/tern

# A long mixed load with reloads, every answer checked (docs/PERFORMANCE.md, "Soak").
SOAK_SECONDS ?= 600
soak: release
	$(PY) tests/soak.py --tern $(CARGO_TARGET_DIR)/release/tern --plugins $(WASM_OUT) --duration $(SOAK_SECONDS)

bench-streaming: release
	$(PY) tests/bench/streaming.py --tern $(CARGO_TARGET_DIR)/release/tern --plugins $(WASM_OUT)

# Heap allocations per request on the CPU path (baseline numbers in docs/PERFORMANCE.md).
bench-alloc: setup
	$(CARGO) build --release -p tern --example alloc_bench
	rm -rf .cache/bench-alloc && $(PY) -c 'import sys; sys.path.insert(0, "scripts"); import gen_models; gen_models.test(".cache/bench-alloc")'
	$(CARGO_TARGET_DIR)/release/examples/alloc_bench .cache/bench-alloc 2000
	$(CARGO_TARGET_DIR)/release/examples/alloc_bench .cache/bench-alloc 2000 --host-memory-pool-byte-size=0

bench-grpc: release
	$(MAKE) lang-plugins TERN_TOOL=$(CARGO_TARGET_DIR)/release/tern
	@command -v h2load >/dev/null || (apt-get update -qq && apt-get install -y -qq nghttp2-client)
	$(CARGO) build --release -p tern --example grpc_baseline
	$(PY) tests/bench/grpc_load.py --tern $(CARGO_TARGET_DIR)/release/tern --baseline $(CARGO_TARGET_DIR)/release/examples/grpc_baseline

bench-plugins: setup
	$(CARGO) build --release -p tern --example plugin_bench
	rm -rf .cache/bench-plugins && $(PY) -c 'import sys; sys.path.insert(0, "scripts"); import gen_models; gen_models.plugin_repo(".cache/bench-plugins", "$(WASM_OUT)")'
	$(CARGO_TARGET_DIR)/release/examples/plugin_bench .cache/bench-plugins

# Per-language plugin costs (size, compile, cache, instantiate, call): docs/PERFORMANCE.md.
BENCH_LANG := .cache/bench-lang
bench-lang: release
	$(MAKE) lang-plugins $(foreach l,python js c,$(WASM_OUT)/empty_$(l).wasm) TERN_TOOL=$(CARGO_TARGET_DIR)/release/tern
	$(CARGO) build --release -p tern --example lang_bench
	rm -rf $(BENCH_LANG) && for l in rust python js c; do \
		for k in empty prep; do mkdir -p $(BENCH_LANG)/$${k}_$$l/1 && cp $(WASM_OUT)/$${k}_$$l.wasm $(BENCH_LANG)/$${k}_$$l/1/model.wasm; done; \
		cp model_repository/prep_$$l/config.pbtxt $(BENCH_LANG)/prep_$$l/; \
		sed "s/prep_$$l/empty_$$l/" model_repository/prep_$$l/config.pbtxt > $(BENCH_LANG)/empty_$$l/config.pbtxt; \
	done
	$(CARGO_TARGET_DIR)/release/examples/lang_bench $(BENCH_LANG)

bench-tokenizer: setup
	$(CARGO) build --release -p tern --example tokenizer_bench
	$(CARGO_TARGET_DIR)/release/examples/tokenizer_bench model_repository

bench-embedding: release
	@command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk)
	$(VENV)/bin/pip install -q tokenizers
	$(PY) tests/bench/embedding.py --tern $(CARGO_TARGET_DIR)/release/tern

clean:
	rm -rf $(CARGO_TARGET_DIR) $(VENV) .cache

# Host kernels vs numpy+PIL / OpenCV / pure Python for nudenet's
# preprocessing, and the detection ensemble vs nudenet in one process:
# docs/PERFORMANCE.md, "Plugin pre/post-processing".
bench-detection: release
	$(MAKE) lang-plugins $(WASM_OUT)/nudenet_prep_pure.wasm TERN_TOOL=$(CARGO_TARGET_DIR)/release/tern
	$(PY) tests/bench/detection.py --tern $(CARGO_TARGET_DIR)/release/tern --plugins $(WASM_OUT)

# Tern on RapidOCR's text recogniser against ONNX Runtime alone: ORT's thread
# spinning on (the default) and off, server CPU per request and when idle,
# gRPC vs binary HTTP with a 1 MB output at concurrency 1 and 16 (~6 min).
bench-ort: release $(PERF_ANALYZER)
	$(PY) tests/bench/ort_real_model.py --tern $(CARGO_TARGET_DIR)/release/tern --perf-analyzer $(PERF_ANALYZER)

# The same model with the client off the model's core: Tern and ONNX Runtime
# alone on core 0 with one intra-op thread, perf_analyzer on core 1; concurrency
# 1, and 16 with dynamic batching (~6 min).
bench-ort-isolated: release $(PERF_ANALYZER)
	$(PY) tests/bench/ort_real_model.py --isolate --tern $(CARGO_TARGET_DIR)/release/tern --perf-analyzer $(PERF_ANALYZER)

# Tern vs MLServer 1.7.1 and KServe 0.21 (each in its own pinned venv under
# .cache/peers-venv, made by the script) on `simple` and RapidOCR's PP-OCRv4
# text recogniser, driven by perf_analyzer over gRPC and HTTP: a markdown
# table, target/bench-peers/results.json and docs/img/peers-*.png (~16 min on
# 2 cores). `make bench-peers QUICK=1`: one short round (~3 min).
bench-peers: release
	$(PY) tests/bench/peers.py --tern $(CARGO_TARGET_DIR)/release/tern --perf-analyzer $(PERF_ANALYZER) --python $(PYTHON) $(if $(QUICK),--quick) $(BENCH_ARGS)

# Tern against Triton itself (tests/test_vs_triton.py; not in `make e2e`): the
# unchanged Python-backend model folders of tests/python_models served by
# tritonserver 2.51 (CPU only, from the nvidia-pytriton PyPI wheel: ~55 MB,
# fetched once into .cache/triton-ref by scripts/triton_ref.sh with a numpy<2
# venv for its Python stub) and by the debug build with its Python runner;
# outputs, dtypes, shapes, error statuses and model states compared.
TRITON_REF_DIR := .cache/triton-ref
TRITON_REF := $(TRITON_REF_DIR)/.stamp
$(TRITON_REF): scripts/triton_ref.sh
	bash scripts/triton_ref.sh $(TRITON_REF_DIR) $(PYTHON)

test-vs-triton: $(VENV)/.stamp $(TRITON_REF)
	@rustup target list --installed | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2
	$(CLIPPY) build --workspace
	$(MAKE) python-runner TERN_TOOL=$(CARGO_TARGET_DIR)/debug/tern
	TERN_BIN=$(CARGO_TARGET_DIR)/debug/tern TERN_TRITON_REF=$(CURDIR)/$(TRITON_REF_DIR) \
		$(PY) -m pytest tests/test_vs_triton.py tests/test_vs_triton_sequences.py -q -rxs
	$(call mark,test-vs-triton)

# The static device build (profile dist-static, no cross-compile) against the
# same source with those levers off (profile dist, feature cross-compile):
# size, start to READY, a plugin call, Cranelift compiling the Python runner
# (tests/bench/static_build.py; docs/PERFORMANCE.md). Two fat-LTO builds, ~40 min.
STATIC_DIR := $(CARGO_TARGET_DIR)/x86_64-unknown-linux-musl
bench-static: setup $(ZIG_STAMP)
	@rustup target list --installed | grep -qx x86_64-unknown-linux-musl || rustup target add x86_64-unknown-linux-musl
	$(ZIG_PATH) $(PY) scripts/dist.py --arch x86_64 --flavour musl --profile dist --features cross-compile --build-only
	$(ZIG_PATH) $(PY) scripts/dist.py --arch x86_64 --flavour musl --build-only
	$(MAKE) python-runner TERN_TOOL=$(STATIC_DIR)/dist/tern
	$(PY) tests/bench/static_build.py --plugins $(WASM_OUT) --compile $(WASM_OUT)/python-runner.wasm \
		levers-off=$(STATIC_DIR)/dist/tern device=$(STATIC_DIR)/dist-static/tern

# The interpreter's cost alone: the same model.py's execute() in a loop in
# plain CPython and in the Python runner (tests/bench/python_interpreter.py).
bench-python-interpreter: release toolchains
	$(MAKE) python-runner TERN_TOOL=$(CARGO_TARGET_DIR)/release/tern
	$(PY) tests/bench/python_interpreter.py --tern $(CARGO_TARGET_DIR)/release/tern --runner $(WASM_OUT)/python-runner.wasm $(BENCH_ARGS)

# Triton Python models on Tern's Python runner vs Triton 2.51's Python
# backend (tests/bench/python_models.py): add_sub, strings and preprocess,
# one instance each, perf_analyzer over gRPC at concurrency 1 and 16, time to
# READY and resident memory, 2 interleaved rounds (~6 min).
bench-python: release $(PERF_ANALYZER) $(TRITON_REF)
	$(MAKE) python-runner TERN_TOOL=$(CARGO_TARGET_DIR)/release/tern
	$(PY) tests/bench/python_models.py --tern $(CARGO_TARGET_DIR)/release/tern --triton-ref $(TRITON_REF_DIR) --perf-analyzer $(PERF_ANALYZER) $(BENCH_ARGS)
