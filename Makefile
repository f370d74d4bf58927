# cadenza — one entry point per job. Every target first checks the system (.ci/prereqs: Python >= 3.11,
# git, a usable bubblewrap; installed with apt-get when run as root), then creates .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip install -q --disable-pip-version-check --no-warn-script-location
INSTALL := $(BIN)/python -m cadenza.installer --python $(BIN)/python --

.PHONY: demo test test-fast lint docs bench prereqs clean-venv

prereqs:
	@PY=$(PY) sh .ci/prereqs

$(BIN)/.ready: pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@echo "installing cadenza into $(VENV) (first run only, about a minute) ..."
	@$(PIP) --upgrade pip
	@# uv installs the three venvs about 10x faster than pip (cadenza/installer.py falls back to pip).
	@$(PIP) uv || echo "uv is not installable here; installing with pip"
	@# The CPU wheel first, so that no dependency pulls a multi-GB CUDA build of torch.
	@$(BIN)/python -c "import torch" 2>/dev/null || $(INSTALL) torch==2.13.0
	@$(INSTALL) -e '.[train,dev]'
	@$(BIN)/python -c "import cadenza.cli" || { echo "error: the install into $(VENV) failed; rerun with: $(BIN)/python -m pip install -e '.[train,dev]'" >&2; exit 1; }
	@touch $@

# The vLLM engine (its own venv, $(VENV)/vllm) and the offline SmolLM2 model: what the engine tests need.
# `make demo` does not wait for it (its toy policy samples faster in-process; see docs/engines.md).
$(VENV)/.engines: $(BIN)/.ready
	@$(BIN)/python -m cadenza.rl.engines.install
	@touch $@

# mini-swe-agent and swebench (their own venv, $(VENV)/ecosystem: mini-swe-agent would downgrade
# python-dateutil in the trainer's venv; docs/ecosystem.md): what the ecosystem tests need.
$(VENV)/.ecosystem: $(BIN)/.ready
	@$(BIN)/python -m cadenza.integrations.install
	@touch $@

demo: prereqs $(BIN)/.ready
	$(BIN)/cadenza demo

# TEST_WORKERS xdist workers, more than the 2 cores: the suite mostly waits (subprocesses, pip, engine
# start-up). Each module stays on one worker; the tests marked `serial` (vLLM engines) share one and those
# marked `serial("ray")` (Ray clusters) another, so each lane runs one test at a time (tests/README.md). --durations: the 25 slowest tests are listed after
# every run, so the 20-minute budget stays visible. CADENZA_REQUIRE_ENGINES=1: a test of the vLLM or Ray
# lane whose component is missing fails instead of skipping (tests/support/lanes.py).
TEST_WORKERS ?= 4
test: prereqs $(BIN)/.ready
	@# the two extra venvs install side by side (about a minute sooner on a fresh machine)
	@$(MAKE) --no-print-directory -j2 $(VENV)/.engines $(VENV)/.ecosystem
	CADENZA_REQUIRE_ENGINES=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=25 tests

# The unit tests not marked slow (no PyPI builds, no distributed runs; see pyproject.toml), on 2 xdist
# workers (most of their time is subprocesses importing torch: two overlap on 2 cores).
test-fast: prereqs $(BIN)/.ready
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup tests/unit -m "not slow and not distributed and not network"

lint: $(BIN)/.ready
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

# Regenerates docs/config-reference.md from the config dataclasses (a test fails when it is stale).
docs: $(BIN)/.ready
	$(BIN)/python -m cadenza.docgen

bench: $(BIN)/.ready
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean-venv:
	rm -rf $(VENV)
