# The two commands a fresh machine needs: `make run` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# CPU machines: this pin is the CPU build. GPU machines: see README ("GPU machines").
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX_URL ?=

.PHONY: install browser run test lint bench soak mutate device-wheels device-check clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q '$(TORCH_SPEC)' $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL))
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

run: install
	$(BIN)/accelgen generate jobs/configs/default.yaml

# Headless Chromium for the report's browser test (skipped, with the reason, where it cannot be installed).
browser:
	.ci/install-browser

test: install browser
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: install
	$(BIN)/accelgen bench

# Seeded runs with random faults and bad rows, each verified; not part of `make test`.
RUNS ?= 20
soak: install
	ACCELGEN_SOAK_RUNS=$(RUNS) $(BIN)/python -m pytest -q -s -m slow tests/test_soak.py

# Mutation testing of the decoding cores, the proposers and the controller's decisions against their fast tests
# ([tool.mutmut]); hours on a small machine, not part of `make test`. `mutmut run "GLOB"` runs one file's mutants.
mutate: install
	OMP_NUM_THREADS=1 nice -n 19 $(BIN)/mutmut run --max-children 1
	$(BIN)/mutmut results

# A GPU machine without internet: wheels of what its image lacks, downloaded here into .whl/ (carried there).
device-wheels:
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl \
		omegaconf==2.4.0 antlr4-python3-runtime==4.13.2

# On the GPU machine, with its own python (README, "Device check"): JSON under $$OUT, else out/device.
device-check:
	$(PYTHON) -m jobs.device_check

clean:
	rm -rf $(VENV) out
