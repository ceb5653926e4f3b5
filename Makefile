# Two commands on a fresh machine with nothing but Python (>= 3.10):
#   make demo   create .venv, install, run the CPU demo (train + before/after evaluation)
#   make test   create .venv, install, run the test suite (slow and GPU tests excluded)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-slow lint format clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[dev,track,audio,video,render,deepspeed]"
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/mmrft train

test: $(STAMP)
	$(BIN)/pytest -q

test-slow: $(STAMP)
	$(BIN)/pytest -q -m slow

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
