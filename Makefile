# slimdata developer entry points. `make demo` and `make test` set up .venv with uv first.
# Without uv on PATH, uv is installed into its own venv (.uv/), never into the system Python
# (which may be externally managed, PEP 668).
VENV := .venv
BIN := $(VENV)/bin
UV := $(shell command -v uv 2>/dev/null || echo .uv/bin/uv)
DEMO_OUT ?= demo-out

.PHONY: setup demo test lint format bench clean

setup: $(VENV)/.synced

.uv/bin/uv:
	python3 -m venv .uv
	.uv/bin/python -m pip install -q uv

$(VENV)/.synced: pyproject.toml uv.lock setup.py | $(UV)
	$(UV) sync --frozen --extra dev --compile-bytecode
	@touch $@

demo: setup  ## build shards from the bundled corpus (Python stdlib sources), then summarize them
	$(BIN)/slimdata build --output $(DEMO_OUT) --overwrite --workers 2
	$(BIN)/slimdata stats $(DEMO_OUT) --plots $(DEMO_OUT)/plots

test: setup  ## the whole test suite (examples included)
	$(BIN)/pytest

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: setup  ## benchmarks print numbers; they are not tests
	$(BIN)/python benchmarks/bench_build.py --mb 50 200 --repeat 3 --no-warm
	$(BIN)/python benchmarks/bench_solver.py
	$(BIN)/python benchmarks/bench_sim.py
	$(BIN)/python benchmarks/bench_hooks.py

clean:
	rm -rf $(DEMO_OUT) .pytest_cache .ruff_cache .mypy_cache .uv
