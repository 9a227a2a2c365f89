# Two entry points (see README "Quick start"); both create the environment on first use.
#   make advance   run the next phase of the shipped plan through the runner
#   make test      run the test suite (CPU; GPU-only tests skip with a reason)

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# CPU build of torch; triton matches the GPU host (3.6) so interpreter tests run the same Triton.
TORCH_SPEC ?= torch==2.13.0
TRITON_SPEC ?= triton==3.6.0

.PHONY: advance test status env

env: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)" "$(TRITON_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[campaign,test]"
	touch $@

advance: env
	$(BIN)/runner advance

status: env
	$(BIN)/runner status

test: env
	$(BIN)/python -m pytest -q
