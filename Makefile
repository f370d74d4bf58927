# cadenza — one entry point per job. Both targets create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench clean-venv

$(BIN)/.ready: pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	@# The CPU wheel first, so that no dependency pulls a multi-GB CUDA build of torch.
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/python -m cadenza.rl.engines.install  # vLLM in its own venv ($(VENV)/vllm) + SmolLM2 (see docs/engines.md)
	@touch $@

demo: $(BIN)/.ready
	$(BIN)/cadenza demo

test: $(BIN)/.ready
	$(BIN)/python -m pytest -q tests

lint: $(BIN)/.ready
	$(BIN)/ruff check .

bench: $(BIN)/.ready
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean-venv:
	rm -rf $(VENV)
