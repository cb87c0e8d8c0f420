# `make run` and `make test` work from a fresh clone: each creates .venv when missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP_RUN := $(VENV)/.installed-run
STAMP_TEST := $(VENV)/.installed-test
STAMP_BENCH := $(VENV)/.installed-bench

.PHONY: run test e2e lint format typecheck review bench demo clean redis-server chromium

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP_RUN): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(STAMP_TEST): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@ $(STAMP_RUN)

$(STAMP_BENCH): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	touch $@ $(STAMP_TEST) $(STAMP_RUN)

# `make run PORT=9000`, `make run ARGS="--upstream http://127.0.0.1:8000/v1"`. PORT counts only
# when given on the command line (many environments export a PORT of their own); the environment
# variable COMPACTION_PROXY__SERVER__PORT works too.
run: $(STAMP_RUN)
	$(BIN)/compaction-proxy --config config.yaml $(if $(filter command line,$(origin PORT)),--port $(PORT)) $(ARGS)

# The state tests start a real redis-server. Found on PATH, or installed from Debian's package
# when we may (root, apt-get); otherwise one clear line and a failure.
redis-server:
	@command -v redis-server >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "make: installing the Debian package redis-server (needed by tests/proxy/state)"; \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; } >/dev/null 2>&1 || true; \
	  fi; \
	  command -v redis-server >/dev/null 2>&1 || { \
	    echo "make: redis-server is missing and could not be installed; install it (apt-get install redis-server, brew install redis) and run make test again" >&2; \
	    exit 1; }; }

# The dashboard's browser test drives a headless chromium through chromedriver (Selenium). Found
# on PATH, or installed from Debian's packages when we may (root, apt-get); otherwise one line.
chromium:
	@{ command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; } || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "make: installing the Debian packages chromium and chromium-driver (needed by tests/proxy/admin/test_dashboard_browser.py)"; \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } >/dev/null 2>&1 || true; \
	  fi; \
	  { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; } || { \
	    echo "make: chromium or chromedriver is missing and could not be installed; install them (apt-get install chromium chromium-driver) and run make test again" >&2; \
	    exit 1; }; }

test: $(STAMP_TEST) redis-server chromium
	$(BIN)/python -m ruff check .
	$(BIN)/python -m ruff format --check .
	$(BIN)/python -m mypy
	$(BIN)/python -m pytest

# The real clients (pinned Codex CLI and Claude Code, installed by npm under .e2e/; the pinned
# openai-agents SDK, installed by pip into .venv) and the openai and anthropic SDKs through the
# proxy against scripted fakes of their APIs. When npm or pip cannot install a client, its runs
# are reported as skipped, with why; everything else still runs.
e2e: $(STAMP_TEST)
	PYTHON=$(BIN)/python tests/e2e/install.sh
	$(BIN)/python -m pytest -o addopts="-q -rs" tests/e2e

lint: $(STAMP_TEST)
	$(BIN)/python -m ruff check .
	$(BIN)/python -m ruff format --check .

format: $(STAMP_TEST)
	$(BIN)/python -m ruff check --fix .
	$(BIN)/python -m ruff format .

typecheck: $(STAMP_TEST)
	$(BIN)/python -m mypy

# Warnings for a reviewer, never a failure: the modules past about 300 lines (tests/review.py).
review: $(STAMP_TEST)
	$(BIN)/python -m tests.review

demo: $(STAMP_RUN)
	$(BIN)/compaction-proxy demo

bench: $(STAMP_BENCH) redis-server
	$(BIN)/python -m bench.decision
	$(BIN)/python -m bench.token_accuracy
	$(BIN)/python -m bench.passthrough
	$(BIN)/python -m bench.replay
	$(BIN)/python -m bench.hotpath
	$(BIN)/python -m bench.instructions
	$(BIN)/python -m bench.retention
	$(BIN)/python -m bench.scan_speed
	$(BIN)/python -m bench.state
	$(BIN)/python -m bench.sqlite_writes
	$(BIN)/python -m bench.adoption
	$(BIN)/python -m bench.archive
	$(BIN)/python -m bench.recall
	$(BIN)/python -m bench.dashboard
	$(BIN)/python -m bench.cost
	$(BIN)/python -m bench.bombs

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .e2e
