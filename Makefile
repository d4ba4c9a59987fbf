# slimdata developer entry points. `make demo` and `make test` set up .venv with uv first.
# Without uv on PATH, uv is installed into its own venv (.uv/), never into the system Python
# (which may be externally managed, PEP 668).
VENV := .venv
BIN := $(VENV)/bin
UV := $(shell command -v uv 2>/dev/null || echo .uv/bin/uv)
DEMO_OUT ?= demo-out

.PHONY: setup demo test test-slow lint format docs bench gpu-check clean

setup: $(VENV)/.synced

.uv/bin/uv:
	python3 -m venv .uv
	.uv/bin/python -m pip install -q uv

$(VENV)/.synced: pyproject.toml uv.lock setup.py | $(UV)
	$(UV) sync --frozen --extra dev --extra ray --compile-bytecode
	@touch $@

demo: setup  ## build shards from the bundled corpus (Python stdlib sources), then summarize them
	$(BIN)/slimdata build --output $(DEMO_OUT) --overwrite --workers 2
	$(BIN)/slimdata stats $(DEMO_OUT) --plots $(DEMO_OUT)/plots

test: setup  ## the test suite without the tests marked slow (CI runs both)
	$(BIN)/pytest -m "not slow and not gpu"

test-slow: setup  ## the slow tests: the examples, 4-rank runs, the strategy study
	$(BIN)/pytest -m "slow and not gpu"

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The API reference: one HTML page per public module from its docstrings and __all__ (pdoc).
# A docstring or annotation pdoc cannot resolve is an error (-W error), so CI keeps it whole.
API_MODULES := slimdata slimdata.cost slimdata.plan slimdata.solver slimdata.execution slimdata.sim slimdata.sim.gantt \
	slimdata.sim.fidelity slimdata.ingest \
	slimdata.docsource slimdata.stats slimdata.plots slimdata.slicing slimdata.hooks \
	slimdata.autocp slimdata.localshards

docs: setup  ## API reference into site/api (open site/api/index.html)
	rm -rf site/api
	$(BIN)/python -W error::UserWarning -m pdoc -d restructuredtext -o site/api $(API_MODULES)

bench: setup  ## benchmarks print numbers; they are not tests
	$(BIN)/python benchmarks/bench_build.py --mb 50 200 --repeat 3 --no-warm
	$(BIN)/python benchmarks/bench_solver.py
	$(BIN)/python benchmarks/bench_sim.py
	$(BIN)/python benchmarks/bench_hooks.py

# On a CUDA machine (nothing here needs .venv): the python that has CUDA torch installs
# slimdata with the GPU extra, runs `pytest -m gpu`, builds the bundled corpus and writes the
# report (report.md, PNGs, results.json) under GPU_REPORT. GPU_PIP adds pip options (e.g.
# "--no-deps --no-build-isolation" on a machine without a package index).
GPU_PY ?= python3
GPU_REPORT ?= gpu-report
GPU_SHARDS ?= $(GPU_REPORT)/shards
GPU_PIP ?=
GPU_SECTIONS ?= env,equivalence,curve,profile,memory,speedup

gpu-check:  ## GPU tests and the GPU validation report (see docs/gpu.md)
	$(GPU_PY) -m pip install -q $(GPU_PIP) -e '.[gpu]' || { echo "the gpu extra (flash-attn) does not install here: slimdata without it, attention through torch's varlen kernel"; $(GPU_PY) -m pip install -q $(GPU_PIP) -e . ; }
	$(GPU_PY) -m pytest -m gpu tests/gpu -q -p no:cacheprovider
	test -f $(GPU_SHARDS)/index.json || $(GPU_PY) -m slimdata.cli build --output $(GPU_SHARDS) --overwrite --workers 8
	$(GPU_PY) benchmarks/gpu_check.py --out $(GPU_REPORT) --shards $(GPU_SHARDS) --sections $(GPU_SECTIONS)

clean:
	rm -rf $(DEMO_OUT) site .pytest_cache .ruff_cache .mypy_cache .uv
