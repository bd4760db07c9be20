# Everything starts from a bare Python 3.11 and make: the first target that
# needs the virtualenv creates it and installs daskpile with its test extras.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# checkov, the security scanner of deploy/ (tests/test_deploy_scan.py), lives in a venv of its own
# under the project's: its pins conflict with ours. The test checks it runs this version.
CHECKOV_VERSION := 3.3.30
CHECKOV_VENV := $(VENV)/tools/checkov
# Azurite, the Azure Storage emulator the abfs:// tests start (tests/test_azure.py): a Node.js program,
# installed where npm exists; without it those tests skip, saying why.
AZURITE_VERSION := 3.37.0
# PyTorch for daskpile.torch's tests (make test-torch), kept out of the test extras: its CPU build is
# about 700 MB. 2.13.0 is the release this machine has a CPU wheel of.
TORCH_VERSION := 2.13.0
# torchdata: its StatefulDataLoader resumes PileDataset in every DataLoader worker
TORCHDATA_VERSION := 0.11.0

.PHONY: demo test test-oldest test-torch docs lint format bench bench-b bench-memory clean

# The venv takes the image's versions (deploy/constraints.txt) of what both have, so that a release on PyPI
# (cloudpickle 3.1.3, 2026-11) cannot make the client differ from the image it would talk to.
$(STAMP): pyproject.toml deploy/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test,bench]" -c deploy/constraints.txt
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install --quiet "checkov==$(CHECKOV_VERSION)"
	if command -v npm >/dev/null; then npm install --silent --no-audit --no-fund --prefix $(VENV)/tools/azurite \
		"azurite@$(AZURITE_VERSION)"; fi
	touch $(STAMP)

demo: $(STAMP)  ## make a sorted dataset, shuffle it on a LocalCluster, verify it
	$(BIN)/daskpile demo demo-data

test: $(STAMP) lint  ## lint, then the whole test suite (doctests included)
	$(BIN)/python -m pytest -n 2 --dist loadfile --doctest-modules daskpile tests

# The suite on the oldest versions pyproject.toml allows (tests/oldest.txt), in a venv of its own; the deploy
# checks are the image's, whose versions are the newest.
OLDEST_VENV := .venv-oldest
$(OLDEST_VENV)/.installed: pyproject.toml tests/oldest.txt
	$(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(OLDEST_VENV)/bin/python -m pip install --quiet -e ".[test,bench]" -c tests/oldest.txt
	touch $@

test-oldest: $(OLDEST_VENV)/.installed  ## the whole test suite on the oldest dependencies daskpile allows
	$(OLDEST_VENV)/bin/python -m pytest -n 2 --dist loadfile --doctest-modules daskpile tests --deselect tests/test_deploy_scan.py

test-torch: $(STAMP)  ## install PyTorch into the venv, then test daskpile.torch under a real DataLoader
	$(BIN)/python -m pip install --quiet "torch==$(TORCH_VERSION)" "torchdata==$(TORCHDATA_VERSION)"
	$(BIN)/python -m pytest --doctest-modules daskpile/torch.py tests/test_torch.py

docs: $(STAMP)  ## the documentation site, warnings as errors, into docs/_build/html
	$(BIN)/sphinx-build -W --keep-going -n -b html docs docs/_build/html

bench: $(STAMP)  ## every system on dataset A (10 M rows), 3 runs each; results in benchmarks/results/
	$(BIN)/python benchmarks/run.py --size A --reps 3

bench-b: $(STAMP)  ## the same on dataset B (100 M rows), 1 run each
	$(BIN)/python benchmarks/run.py --size B --reps 1

bench-memory: $(STAMP)  ## dataset B with every worker limited to 2 GiB (DuckDB to 4 GB)
	$(BIN)/python benchmarks/run.py --size B --reps 1 --worker-memory 2GiB --duckdb-memory 4GB --timeout 1800 \
		--systems "daskpile auto piles" "duckdb ORDER BY random()" "dask p2p + sample"

lint: $(STAMP)
	$(BIN)/ruff check daskpile tests benchmarks conftest.py docs/conf.py
	$(BIN)/ruff format --check daskpile tests benchmarks conftest.py docs/conf.py

format: $(STAMP)
	$(BIN)/ruff check --fix daskpile tests benchmarks conftest.py docs/conf.py
	$(BIN)/ruff format daskpile tests benchmarks conftest.py docs/conf.py

clean:
	rm -rf $(VENV) $(OLDEST_VENV) demo-data .pytest_cache docs/_build
