# `make run` and `make test` each set up .venv on first use (pinned by constraints.txt).
VENV   := .venv
PYTHON := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: run test bench clean-venv

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[mpi,tf,gpu,dev]'
	@touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/hvdtrain

test: $(STAMP)
	$(PYTHON) -m pytest -q

bench: $(STAMP)
	$(PYTHON) scripts/run_benchmarks.py

clean-venv:
	rm -rf $(VENV)
