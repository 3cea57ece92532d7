# The two commands of the README: `make demo` and `make test`.
# Each creates .venv on first use and reuses it while pyproject.toml is unchanged.
# `make demo` installs the runtime dependencies only; `make test` (and `make venv`) add the
# test tools (pytest, mypy, ruff, hypothesis) of the `test` extra.
PYTHON ?= python3
VENV := .venv
RUNTIME_STAMP := $(VENV)/.installed-runtime
STAMP := $(VENV)/.installed
BIN := $(VENV)/bin
WORKDIR ?= demo-out
PIP := $(BIN)/python -m pip --quiet --disable-pip-version-check

CHROMIUM := /usr/bin/chromium

.PHONY: demo test lint typecheck pytest venv clean browser

$(RUNTIME_STAMP): pyproject.toml
	@echo "installing gridledger and its dependencies into $(VENV) (once; about a minute)..."
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -e .
	@touch $(RUNTIME_STAMP)

$(STAMP): pyproject.toml
	@echo "installing gridledger and its test tools into $(VENV) (once; a minute or two)..."
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -e '.[test]'
	@touch $(STAMP) $(RUNTIME_STAMP)

# The oldest DuckDB whose storage format exports are written in (proto/EXPORT.md
# "Readers"): a test opens exports with it, so the promise is checked by the reader itself.
DUCKDB_1_0 := $(VENV)/duckdb-1.0
DUCKDB_1_0_STAMP := $(DUCKDB_1_0)/.installed

$(DUCKDB_1_0_STAMP): $(STAMP)
	$(PIP) install --no-deps --target $(DUCKDB_1_0) duckdb==1.0.0
	@touch $(DUCKDB_1_0_STAMP)

venv: $(STAMP) $(DUCKDB_1_0_STAMP)

demo: $(RUNTIME_STAMP)
	$(BIN)/gridledger demo --workdir $(WORKDIR)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# The statement page is tested in a real browser (tests/test_bill_browser.py): Debian's
# chromium, installed once (as root, as the build machine runs) and then left alone.
# Playwright drives it; it never downloads a browser of its own.
browser:
	@test -x $(CHROMIUM) || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }
	@test -x $(CHROMIUM) || { echo "FAIL: $(CHROMIUM) is still missing" >&2; exit 1; }

pytest: $(STAMP) $(DUCKDB_1_0_STAMP) browser
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test: lint typecheck pytest

clean:
	rm -rf $(VENV) $(WORKDIR) .pytest_cache .mypy_cache .ruff_cache
