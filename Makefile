# The README's two commands: `make demo` and `make test`. Every target sets up
# the virtualenv first; `setup` does nothing when the lock has not changed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export GOTOOLCHAIN ?= local

.PHONY: setup system-packages demo demo-real test test-fast test-unit test-testbed testbed bench lint lock clean

# Debian packages the tests and the testbed use: PostgreSQL (the store tests start
# a real server), Chromium (the browser tests), and the real-node pool's runtime:
# containerd, runc, the CNI plugins and `ip` for the Pod network's bridge (unshare
# and nsenter are util-linux, always there). Idempotent: apt runs only when one
# is missing, through sudo when not root.
SYSTEM_PACKAGES := ca-certificates git make python3-venv postgresql chromium \
	containerd runc containernetworking-plugins iproute2

system-packages:
	@missing=""; for pkg in $(SYSTEM_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$pkg 2>/dev/null | grep -q "install ok installed" \
	    || missing="$$missing $$pkg"; \
	done; \
	if [ -n "$$missing" ]; then \
	  sudo_=""; [ "$$(id -u)" -eq 0 ] || sudo_=sudo; \
	  echo "installing Debian packages:$$missing"; \
	  $$sudo_ env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $$sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

setup: $(STAMP)

$(STAMP): requirements.lock pyproject.toml | system-packages
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --require-hashes --no-deps -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

testbed: setup
	$(BIN)/kubetrain testbed build

demo: testbed
	$(BIN)/python -m kubetrain.demo

# The real-node pool: one real training run on real kubelets (see docs/testbed.md).
demo-real: testbed
	$(BIN)/python -m kubetrain.demo --real

# The suite in parallel workers (pytest-xdist): tests/conftest.py keeps a module's
# tests on one worker and puts every test of the real-node pool, of Kueue and of the
# no-gpu pool in one group each, so each of those testbeds starts once. Most tests
# wait on processes (Kubernetes, kubetrain serve, PostgreSQL, Chromium), so there are
# more workers than the 2 cores CI has. The collection run first writes pytest's
# rewritten test modules to __pycache__ once, instead of once per worker (it is not
# written when PYTHONDONTWRITEBYTECODE is set, hence its unexport). --durations
# prints where the time went (docs/testing.md).
TEST_WORKERS ?= 4
XDIST := -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder
unexport PYTHONDONTWRITEBYTECODE

test: testbed
	$(BIN)/pytest --collect-only -q > /dev/null
	$(BIN)/pytest $(XDIST) --durations=40 --durations-min=5

# The inner loop: the pure core and the database tiers (the store, the HTTP API, the
# CLI, the pages from recorded data), no testbed.
test-fast: setup
	$(BIN)/pytest -m "unit or db" -n 2 --dist loadgroup --durations=10

test-unit: setup
	$(BIN)/pytest -m unit

test-testbed: testbed
	$(BIN)/pytest -m testbed

# Benchmarks, one after another (each prints a table and writes bench/results/*.json).
bench: testbed
	$(BIN)/python bench/testbed_start.py
	$(BIN)/python bench/submit.py
	$(BIN)/python bench/propagation.py
	$(BIN)/python bench/diagnosis.py
	$(BIN)/python bench/checkpoint.py
	$(BIN)/python bench/progress.py
	$(BIN)/python bench/cache_memory.py
	$(BIN)/python bench/create.py
	$(BIN)/python bench/sync_record.py
	$(BIN)/python bench/history.py

lint: setup
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

# Regenerate the lock after changing dependencies in pyproject.toml (needs uv).
lock:
	uv pip compile pyproject.toml build-requirements.in --extra test --extra bench --generate-hashes \
		--python-version 3.11 --universal -o requirements.lock

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
