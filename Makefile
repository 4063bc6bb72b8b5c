# sandfork — the two commands a newcomer needs are `make demo` and `make test`.
SHELL := /bin/bash
CARGO ?= cargo
# The in-sandbox agent runs on images without a C library, so it is linked statically.
HOST_TARGET := x86_64-unknown-linux-gnu
AGENT_FLAGS := CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static"

.PHONY: setup build demo test lint bench bench-blockstore

setup:
	@scripts/setup

build: setup
	$(CARGO) build --release --workspace --bins

demo: build
	@scripts/demo

test: setup
	$(CARGO) build --workspace --bins
	$(CARGO) nextest run --workspace --no-fail-fast

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

bench: bench-blockstore

bench-blockstore: build
	@bench/blockstore
