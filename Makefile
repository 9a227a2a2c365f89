# Two entry points (see README "Quick start"); both create the environment on first use.
#   make advance   run the next phase of the shipped plan through the runner
#   make test      run the test suite (CPU; GPU-only tests skip with a reason)

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# CPU build of torch; triton matches the GPU host (3.6) so interpreter tests run the same Triton.
TORCH_SPEC ?= torch==2.13.0
TRITON_SPEC ?= triton==3.6.0
# The runner's exit code for "a gate needs a device this machine lacks" (runner.errors.ExitCode).
BLOCKED := 3

.PHONY: advance test status env

env: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@echo "make: creating $(VENV) (first use only, about a minute)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@echo "make: installing CPU torch and triton into $(VENV)"
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)" "$(TRITON_SPEC)"
	@echo "make: installing the runner (editable) and the campaign's and the tests' packages"
	@# setuptools warns on every editable install that a folder named like the package may
	@# shadow it; here that folder is the package itself.
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install --quiet -e ".[campaign,test]"
	touch $@
	@echo "make: $(VENV) is ready; the runner is $(BIN)/runner"

# On a machine without a GPU the runner ends with "blocked" (exit 3), the documented outcome:
# make says so and succeeds. Any other non-zero exit (a failed gate, a plan error) fails make.
advance: env
	@$(BIN)/runner advance; code=$$?; \
	if [ $$code -eq $(BLOCKED) ]; then \
		echo "make advance: blocked, as expected without a GPU: the gates this machine can run were run and the report written; the message above says how to finish on a GPU host"; \
		exit 0; \
	fi; \
	exit $$code

status: env
	$(BIN)/runner status

test: env
	$(BIN)/python -m pytest -q
