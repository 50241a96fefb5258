# Two commands for a fresh machine: `make run` and `make test`.
# Each creates .venv and installs the package on first use (re-installs when pyproject.toml changes).
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench lab lint

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install "$(TORCH)"
	$(BIN)/pip install -e ".[dev]"
	touch $(STAMP)

run: $(STAMP)  ## the main experiment on the offline pair (override with ARGS="model=gemma2 k=4")
	$(BIN)/python -m experiments.run $(ARGS)

test: $(STAMP)  ## the whole test suite, CPU only
	$(BIN)/python -m pytest $(ARGS)

bench: $(STAMP)  ## side-by-side benchmark against Hugging Face generation
	$(BIN)/python -m experiments.bench $(ARGS)

lab: $(STAMP)  ## JupyterLab on notebooks/
	$(BIN)/jupyter lab notebooks/

lint: $(STAMP)
	$(BIN)/ruff check src experiments tests
