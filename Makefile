# agentrt: `make run` starts the server, `make test` runs the whole suite.
# Needs only Python 3.11+ and make; everything else is installed into .venv from uv.lock.

PYTHON ?= python3
UV_VERSION := 0.13.9
TOOLS := .tools
UV := $(TOOLS)/bin/uv
VENV := .venv
BIN := $(VENV)/bin

.PHONY: help install chromium run stop test lint format typecheck bench bench-large bench-quick chaos fuzz screenshots clean

help: ## Show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(UV):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/python -m pip install --quiet --disable-pip-version-check "uv==$(UV_VERSION)"

$(VENV)/.installed: $(UV) pyproject.toml uv.lock
	$(UV) sync --frozen --compile-bytecode --python $(PYTHON)
	@touch $@

install: $(VENV)/.installed ## Create .venv and install the locked dependencies

run: install ## Start the server on 127.0.0.1:8000 (embedded Postgres unless DATABASE_URL is set)
	$(BIN)/agentrt serve

stop: install ## Stop the embedded Postgres if an agentrt process left it running
	$(BIN)/agentrt db stop

# The console's browser tests drive Debian's Chromium; Playwright never downloads a browser.
chromium: ## Install Debian's chromium for the browser tests if it is missing (as root, with apt-get)
	@if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		echo "installing Debian's chromium for tests/browser"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -qq --no-install-recommends chromium; \
	fi

# Test files run in TEST_WORKERS processes, each with its own embedded Postgres (a file stays in
# one process, so its module fixtures are shared as written).
TEST_WORKERS ?= 2

# Where `make chromium` could not install a browser (macOS, not root), the browser tests are
# skipped with a notice instead of failing the quick start; CI's Debian installs it.
test: install chromium ## Run the whole test suite (real Postgres, scripted models, headless Chromium)
	@if [ ! -x "$${AGENTRT_CHROMIUM:-/usr/bin/chromium}" ] && [ -z "$$AGENTRT_SKIP_BROWSER_TESTS" ]; then \
		echo "NOTE: no Chromium found, so tests/browser is skipped (README, 'Web console')"; \
		export AGENTRT_SKIP_BROWSER_TESTS=1; \
	fi; \
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=15 --basetemp=.pytest-tmp

screenshots: install chromium ## Take the console's screenshots into docs/console/ (the browser tests)
	AGENTRT_CONSOLE_SCREENSHOTS=docs $(BIN)/python -m pytest tests/browser --basetemp=.pytest-tmp

fuzz: install ## Schemathesis over /openapi.json against a real server on embedded Postgres (a few minutes)
	FUZZ_EXAMPLES=$${FUZZ_EXAMPLES:-100} FUZZ_MAX_TIME=$${FUZZ_MAX_TIME:-240} \
		$(BIN)/python -m pytest tests/e2e/test_openapi_fuzz.py -s --basetemp=.pytest-tmp

lint: install ## ruff lint + format check, mypy
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: install ## Format the code
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: install ## Run the benchmarks; figures go to docs/benchmarks.md
	$(BIN)/python -m bench.run

bench-large: install ## Knowledge at 1,000,000 chunks; the event log at 10,000,000 events (long)
	$(BIN)/python -m bench.run --only knowledge_large event_log_size

bench-quick: install ## A short version of the benchmarks; figures go to bench/results/ only
	$(BIN)/python -m bench.run --quick

chaos: install ## 100 runs per trial under kill -9, then Postgres restarts; figures to docs/benchmarks.md
	$(BIN)/python -m bench.chaos --write

clean: ## Remove the virtual environments (keeps .agentrt data)
	rm -rf $(VENV) $(TOOLS)
