# Set-up is part of every target: `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
WORKDIR ?= workdirs
PYTEST_WORKERS ?= 2

.PHONY: install data test demo clean

install: $(VENV)/.installed

$(VENV)/.installed: setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	touch $@

# Embedded offline datasets from Debian packages (no root): Fashion-MNIST, Python docs.
data: install
	$(PY) -m ensemble_jax.data.fetch

test: install data
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) tests

demo: install data
	$(PY) -m experiments.demo --workdir=$(WORKDIR)/demo

clean:
	rm -rf $(WORKDIR)
