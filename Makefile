# recflash — setup, build, test, demo. Run from the repository root.
#
#   make setup   system packages (apt), .venv with the pinned Python stack, then the package
#   make test    setup + the C++ unit tests (ctest) + pytest
#   make demo    setup + examples/demo.py, a short examples/train_dlrm_ray.py --quick, then
#                examples/dlrm_inference_ssd.py --quick (TorchRec inference with SSD tables)
#   make build   reinstall the package only (incremental C++ build under build/)
#   make clean   remove build/ (keeps .venv)
#   make asan-build / asan-test    ASan+UBSan build of the extension; store + NDP suites under it
#   make tsan-build / tsan-test    TSan build; the concurrency tests under it
#   make fuzz-build / fuzz MINUTES=M   the ASan build, then every fuzz target under it
#   make crash-stress TRIALS=N     benchmarks/crash_stress.py (SIGKILL + power loss + fault matrix)
#
# Everything is idempotent: re-running `make setup` skips apt when every package is present,
# skips pip when requirements.txt is unchanged, and always reinstalls the package itself.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
# The steps of `setup` must run in order, also under `make -j`.
.NOTPARALLEL:

PYTHON       ?= python3
VENV         := .venv
VPY          := $(VENV)/bin/python
PIP          := $(VENV)/bin/pip
APT_PACKAGES := liburing-dev librocksdb-dev pkg-config fio cmake ninja-build g++ googletest libgtest-dev clang
# torchrec's wheel asks for the CUDA fbgemm-gpu; fbgemm-gpu-cpu is pinned in requirements.txt,
# so torchrec goes in without its dependencies.
TORCHREC     := torchrec==1.9.2
REQ_STAMP    := $(VENV)/.recflash-requirements.sha256
PYTEST_ARGS  ?=
DEMO_ARGS    ?=

.PHONY: help setup system-deps python-deps build proto cpp-test tsa-check test demo clean asan-build asan-test tsan-build \
        tsan-test fuzz-build fuzz crash-stress

help:
	@sed -n '3,12p' Makefile | sed 's/^# \{0,1\}//'

setup: system-deps python-deps build

# apt only when something is missing (dpkg-query), so re-runs stay fast and offline.
# When $(PYTHON) is Debian's own and lacks venv support or headers, its packages are added too.
system-deps:
	@missing=""; \
	for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' "$$p" 2>/dev/null | grep -q ' installed$$' || missing="$$missing $$p"; \
	done; \
	extra=""; \
	if ! command -v $(PYTHON) >/dev/null 2>&1; then extra="python3 python3-venv python3-dev"; \
	elif ! $(PYTHON) -c 'import ensurepip, os, sysconfig, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null; then \
	  extra="python3-venv python3-dev"; fi; \
	if [ -z "$$missing$$extra" ]; then echo "setup: system packages present"; \
	else \
	  echo "setup: installing system packages:$$missing $$extra"; \
	  SUDO=""; if [ "$$(id -u)" -ne 0 ]; then SUDO="sudo"; fi; \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update; \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y $(APT_PACKAGES) $$extra; \
	fi

$(VPY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

# pip runs only when requirements.txt (or the torchrec pin) changed since the last success.
python-deps: $(VPY)
	@want="$$( { sha256sum requirements.txt; echo '$(TORCHREC)'; } | sha256sum | cut -d' ' -f1 )"; \
	if [ -f $(REQ_STAMP) ] && [ "$$(cat $(REQ_STAMP))" = "$$want" ]; then \
	  echo "setup: Python dependencies up to date"; \
	else \
	  $(PIP) install --upgrade pip; \
	  $(PIP) install -r requirements.txt; \
	  $(PIP) install --no-deps $(TORCHREC); \
	  echo "$$want" > $(REQ_STAMP); \
	fi

# scikit-build-core keeps its CMake/ninja build dir under build/, so this is quick when
# nothing changed. --no-build-isolation uses scikit-build-core/pybind11 from the venv.
build:
	@test -x $(PIP) || { echo "no $(VENV): run 'make setup' first" >&2; exit 1; }
	$(PIP) install --no-build-isolation --no-deps .

# Regenerates the NDP device protocol's Python code (committed; tests/test_ndp_device.py checks
# that it matches ndp/proto/ndp.proto).
proto:
	$(VPY) -P ndp/proto/generate.py

# The C++ unit tests (tests/cpp, GoogleTest) in their own CMake build without the Python module.
CPP_TEST_DIR := build/cpp-tests
cpp-test:
	cmake -S . -B $(CPP_TEST_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release -DRECFLASH_PYTHON=OFF -DRECFLASH_TESTS=ON >/dev/null
	cmake --build $(CPP_TEST_DIR) --target recflash_unit_tests
	ctest --test-dir $(CPP_TEST_DIR) --output-on-failure

# Clang's thread-safety analysis over the engine (reader, ndp, ingest), warnings as errors;
# configuring first checks that the analysis rejects tests/cpp/thread_safety_probe.cc.
TSA_DIR := build/tsa
tsa-check:
	cmake -S . -B $(TSA_DIR) -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DRECFLASH_PYTHON=OFF -DRECFLASH_THREAD_SAFETY=ON >/dev/null
	cmake --build $(TSA_DIR) --target recflash_reader recflash_ndp recflash_ingest

test: setup cpp-test tsa-check
	@start=$$(date +%s%N); rc=0; \
	$(VENV)/bin/pytest -q -p no:cacheprovider $(PYTEST_ARGS) || rc=$$?; \
	ms=$$(( ($$(date +%s%N) - start) / 1000000 )); \
	printf 'pytest wall time: %d.%03d s (exit code %d)\n' $$((ms / 1000)) $$((ms % 1000)) $$rc; \
	exit $$rc

demo: setup
	$(VPY) examples/demo.py $(DEMO_ARGS)
	$(VPY) examples/train_dlrm_ray.py --quick
	$(VPY) examples/dlrm_inference_ssd.py --quick

clean:
	rm -rf build/

# --- sanitizer builds (separate trees under build/; never part of `make test`) -------------------
# The instrumented extension is installed into build/<san>-site, which PYTHONPATH puts before the
# venv's own build; the sanitizer runtime must be the first library loaded (LD_PRELOAD), since
# the Python interpreter itself is not instrumented. Leak checking is off: CPython keeps
# interned objects alive at exit by design.
ASAN_SITE   := build/asan-site
TSAN_SITE   := build/tsan-site
ASAN_ENV     = PYTHONPATH=$(CURDIR)/$(ASAN_SITE) LD_PRELOAD="$$(g++ -print-file-name=libasan.so) $$(g++ -print-file-name=libubsan.so)" \
               ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
TSAN_ENV     = PYTHONPATH=$(CURDIR)/$(TSAN_SITE) LD_PRELOAD="$$(g++ -print-file-name=libtsan.so)" \
               TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ignore_noninstrumented_modules=1 suppressions=$(CURDIR)/tests/tsan.supp"
ASAN_TESTS  ?= tests/test_store_basic.py tests/test_store_model.py tests/test_recovery.py tests/test_errors.py \
               tests/test_read_only.py tests/test_compact_pages.py tests/test_ndp_sls.py tests/test_fault_injection.py \
               tests/test_io_ring.py tests/test_read_corruption.py
TSAN_TESTS  ?= tests/test_concurrency.py
MINUTES     ?= 60
TRIALS      ?= 1000

asan-build:
	@test -x $(PIP) || { echo "no $(VENV): run 'make setup' first" >&2; exit 1; }
	nice $(PIP) install --no-build-isolation --no-deps --upgrade --target $(ASAN_SITE) \
	  -C cmake.define.RECFLASH_SANITIZE=address -C build-dir=build/asan .

tsan-build:
	@test -x $(PIP) || { echo "no $(VENV): run 'make setup' first" >&2; exit 1; }
	nice $(PIP) install --no-build-isolation --no-deps --upgrade --target $(TSAN_SITE) \
	  -C cmake.define.RECFLASH_SANITIZE=thread -C build-dir=build/tsan .

asan-test: asan-build
	$(ASAN_ENV) nice $(VENV)/bin/pytest -q -p no:cacheprovider $(ASAN_TESTS) $(PYTEST_ARGS)

# setarch -R: TSan's shadow memory needs the fixed layout that address randomisation breaks.
tsan-test: tsan-build
	$(TSAN_ENV) nice setarch $$(uname -m) -R $(VENV)/bin/pytest -q -p no:cacheprovider $(TSAN_TESTS) $(PYTEST_ARGS)

fuzz-build: asan-build

fuzz: fuzz-build
	$(ASAN_ENV) nice -n 19 $(VPY) -P tests/fuzz/run.py --minutes $(MINUTES) --json benchmarks/results/fuzz.json

crash-stress:
	nice -n 19 $(VPY) -P benchmarks/crash_stress.py --trials $(TRIALS) --json benchmarks/results/crash_stress.json

