# `make demo` and `make test` build .venv with the machine's python3 on first use and reuse it after.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast bench clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=24"
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/fedpriv demo

test: $(STAMP)
	$(PY) -m pytest -n 2 -q

test-fast: $(STAMP)
	$(PY) -m pytest -n 2 -q -m "not slow"

bench: $(STAMP)
	$(PY) benchmarks/synthetic_corpus.py --preset stackoverflow --users-to-sample 5000
	$(PY) benchmarks/dp_vocab.py
	$(PY) benchmarks/dpsgd_step.py --model all

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
