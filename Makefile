# sandfork — the two commands a newcomer needs are `make demo` and `make test`.
SHELL := /bin/bash
CARGO ?= cargo
PYTHON ?= python3
# The `sandfork` binary carries everything it needs: the statically linked in-sandbox agent
# is built by crates/agent-embed/build.rs and embedded, and the disk server is `sandfork`
# itself started as `sandfork-disk`.

.PHONY: setup build build-release demo test test-rust test-python test-typescript test-console fuzz lint bench bench-blockstore bench-sandbox bench-fork bench-warm bench-memory bench-pool bench-workloads bench-images bench-surface bench-cluster bench-compat bench-mcp bench-fanout bench-density

setup:
	@scripts/setup

build: setup
	$(CARGO) build --workspace --bins

build-release: setup
	$(CARGO) build --release --workspace --bins

demo: build-release
	@scripts/demo

test: build test-rust test-python test-typescript test-console test-integrations fuzz

test-rust:
	$(CARGO) nextest run --workspace --no-fail-fast

# Each suite has its own conftest.py, so each runs in a pytest of its own; all run, and the
# target fails if any failed.
PY_SUITES := sdk/python/tests tests/security tests/reliability tests/api tests/checkpoints tests/images tests/cluster tests/compat/tensorlake tests/docs tests/compat/e2b tests/mcp
test-python:
	@failed=""; for suite in $(PY_SUITES); do \
	  echo "== pytest $$suite"; \
	  $(PYTHON) -m pytest -q $$suite || failed="$$failed $$suite"; \
	done; \
	if [ -n "$$failed" ]; then echo "failed suites:$$failed"; exit 1; fi

# The TypeScript SDK against a real daemon (its dependencies from the lockfile).
test-typescript:
	cd sdk/typescript && npm ci --prefer-offline --no-audit --no-fund --loglevel=error && npm test

# The web console in headless Chromium, driven by Playwright, against a real daemon (the
# console itself is built into the binary by crates/console-embed). The daemon and the
# browser run in a network namespace with loopback alone: the hostile-page probes reach
# nothing else.
test-console:
	cd console && npm ci --prefer-offline --no-audit --no-fund --loglevel=error && unshare -n sh -c 'ip link set lo up && exec npm test'

# The sandbox-provider packages (integrations/: inspect-ai, the OpenAI Agents SDK, Harbor) against a
# real daemon, with the real frameworks at the versions integrations/requirements.txt pins,
# installed into a venv outside the repository when missing.
test-integrations: build
	$(PYTHON) integrations/run_tests.py

# Every cargo-fuzz target for FUZZ_TIME seconds each (see docs/SECURITY.md).
FUZZ_TIME ?= 20
fuzz: setup
	@scripts/fuzz --time $(FUZZ_TIME)

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(PYTHON) scripts/check-circles --self-test
	$(PYTHON) scripts/check-circles

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

# Memory shared across forks (page merging on and off, same run). Starts its own daemons.
bench-memory: build-release
	@out=$$(mktemp /tmp/sandfork-bench.XXXXXX); \
	  python3 bench/memory.py | tee $$out && \
	  python3 bench/report.py "memory" "make bench-memory" <$$out >/dev/null; \
	  rc=$$?; rm -f $$out; exit $$rc

# Forks from the pool of ready forks, with and without a pool (same run). Starts its own daemons.
bench-pool: build-release
	@out=$$(mktemp /tmp/sandfork-bench.XXXXXX); \
	  python3 bench/pool.py | tee $$out && \
	  python3 bench/report.py "pool" "make bench-pool" <$$out >/dev/null; \
	  rc=$$?; rm -f $$out; exit $$rc

# The examples' warm states (browser, PostgreSQL, ML worker) next to podman + CRIU.
# Real workloads (pip install, a C build, SQLite) on the disk path against overlayfs (as
# podman mounts a container), a plain loop device and the host's filesystem; ~15 minutes.
# Pull + first sandbox and a rebuild with a changed late step, next to podman.
bench-images: build-release
	@out=$$(mktemp /tmp/sandfork-bench.XXXXXX); \
	  python3 bench/images.py | tee $$out && \
	  python3 bench/report.py "images" "make bench-images" <$$out >/dev/null; \
	  rc=$$?; rm -f $$out; exit $$rc

# N forks of a memory snapshot in one call (no ready forks), every child answering an exec,
# next to N cold creates in the same run; host memory per fork right after.
bench-fanout: build-release
	@out=$$(mktemp /tmp/sandfork-bench.XXXXXX); \
	  python3 bench/fanout.py $(if $(COUNT),--count $(COUNT)) | tee $$out && \
	  python3 bench/report.py "fan-out" "make bench-fanout$(if $(COUNT), COUNT=$(COUNT))" <$$out >/dev/null; \
	  rc=$$?; rm -f $$out; exit $$rc

# Forks kept alive in steps up to 1,000 (or until the host refuses), with what each costs.
bench-density: build-release
	@out=$$(mktemp /tmp/sandfork-bench.XXXXXX); \
	  python3 bench/density.py $(if $(STEP),--step $(STEP)) $(if $(MAX),--max $(MAX)) | tee $$out && \
	  python3 bench/report.py "density" "make bench-density$(if $(STEP), STEP=$(STEP))$(if $(MAX), MAX=$(MAX))" <$$out >/dev/null; \
	  rc=$$?; rm -f $$out; exit $$rc

# One MCP tool call against the same call through the Python SDK (stdio and HTTP).
bench-mcp: build-release
	@out=$$(mktemp) && python3 bench/mcp.py $(if $(RUNS),--runs $(RUNS)) | tee $$out && \
	  python3 bench/report.py "MCP" "make bench-mcp$(if $(RUNS), RUNS=$(RUNS))" <$$out >/dev/null; \
	  rc=$$?; rm -f $$out; exit $$rc

# Four nodes behind the gateway (network namespaces, Ray, SeaweedFS) next to one standalone
# node: cold-cache restores, bytes they fetch, a fork of 32 over the nodes. Starts its own.
bench-cluster: build-release
	@out=$$(mktemp /tmp/sandfork-bench.XXXXXX); \
	  python3 bench/cluster.py $(if $(RUNS),--runs $(RUNS)) | tee $$out && \
	  python3 bench/report.py "cluster" "make bench-cluster$(if $(RUNS), RUNS=$(RUNS))" <$$out >/dev/null; \
	  rc=$$?; rm -f $$out; exit $$rc

bench-surface: build-release
	@out=$$(mktemp /tmp/sandfork-bench.XXXXXX); \
	  scripts/with-daemon python3 bench/surface.py | tee $$out && \
	  python3 bench/report.py "agents' surface" "make bench-surface" <$$out >/dev/null; \
	  rc=$$?; rm -f $$out; exit $$rc

# The Tensorlake and E2B layers against sandfork's own SDK, one daemon (the SDKs from the
# compat suites' venvs, all in a network namespace with loopback alone).
bench-compat: build-release
	@out=$$(mktemp /tmp/sandfork-bench.XXXXXX); \
	  python3 bench/compat.py $(if $(RUNS),--runs $(RUNS)) | tee $$out && \
	  python3 bench/report.py "Compatibility layers" "make bench-compat$(if $(RUNS), RUNS=$(RUNS))" <$$out >/dev/null; \
	  rc=$$?; rm -f $$out; exit $$rc

bench-workloads: build-release
	@out=$$(mktemp /tmp/sandfork-bench.XXXXXX); \
	  python3 bench/workloads.py | tee $$out && \
	  python3 bench/report.py "workloads" "make bench-workloads" <$$out >/dev/null; \
	  rc=$$?; rm -f $$out; exit $$rc

bench-warm: build-release
	@scripts/setup --bench
	@out=$$(mktemp /tmp/sandfork-bench.XXXXXX); \
	  scripts/with-daemon python3 bench/warm.py | tee $$out && \
	  python3 bench/report.py "warm states" "make bench-warm" <$$out >/dev/null; \
	  rc=$$?; rm -f $$out; exit $$rc
