# sandfork — the two commands a newcomer needs are `make demo` and `make test`.
SHELL := /bin/bash
CARGO ?= cargo
PYTHON ?= python3
TARGET_DIR := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)
# The in-sandbox agent runs on images without a C library, so it is linked statically.
HOST_TARGET := x86_64-unknown-linux-gnu
STATIC := CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static"

export SANDFORK_AGENT_BIN ?= $(TARGET_DIR)/$(HOST_TARGET)/debug/sandfork-agent

.PHONY: setup build build-release demo test test-rust test-python fuzz lint bench bench-blockstore bench-sandbox bench-fork

setup:
	@scripts/setup

build: setup
	$(CARGO) build --workspace --bins
	$(STATIC) $(CARGO) build -p sandfork-agent --target $(HOST_TARGET)

build-release: setup
	$(CARGO) build --release --workspace --bins
	$(STATIC) $(CARGO) build --release -p sandfork-agent --target $(HOST_TARGET)

demo: build-release
	@scripts/demo

test: build test-rust test-python fuzz

test-rust:
	$(CARGO) nextest run --workspace --no-fail-fast

# Each suite has its own conftest.py, so each runs in a pytest of its own; all run, and the
# target fails if any failed.
PY_SUITES := sdk/python/tests tests/security tests/reliability tests/api
test-python:
	@failed=""; for suite in $(PY_SUITES); do \
	  echo "== pytest $$suite"; \
	  $(PYTHON) -m pytest -q $$suite || failed="$$failed $$suite"; \
	done; \
	if [ -n "$$failed" ]; then echo "failed suites:$$failed"; exit 1; fi

# Every cargo-fuzz target for FUZZ_TIME seconds each (see docs/security.md).
FUZZ_TIME ?= 20
fuzz: setup
	@scripts/fuzz --time $(FUZZ_TIME)

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

bench: build-release
	@scripts/setup --bench
	@bench/run

bench-blockstore: build-release
	@scripts/setup --bench
	@bench/blockstore

bench-sandbox: build-release
	@bench/sandbox --python

bench-fork: build-release
	@scripts/setup --bench
	@bench/fork --python --mb 50,500 --fanout 1,8,32
