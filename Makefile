# Two entry points, each creating its own virtual environment when needed:
#   make run   compile the bundled example model (blob and HTML report beside it)
#   make test  run the test suite
# and, for iterating: make test-fast (no PyPTO compile, no browser: under 2 minutes)
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-fast clean chromium graphviz

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first and pinned: the CPU wheel on disk, never a multi-GB CUDA build from a range.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test,corpus,ray]'
	touch $(STAMP)

run: $(STAMP) graphviz
	$(VENV)/bin/pypto-offline examples/example.onnx --target kirin9050 --input-shape x=1,3,64,64

test: $(STAMP) graphviz chromium
	$(PY) -m pytest -q tests

# The tier without the ``pypto`` and ``browser`` markers (setup.cfg): planning, views, codegen
# text, blobs, CLI parsing; every test that compiles a kernel with PyPTO or opens a page in
# Chromium is marked and left out, so the tier needs no browser installed (``test`` installs it).
test-fast: $(STAMP) graphviz
	$(PY) -m pytest -q -m "not pypto and not browser" tests

# Debian packages, installed when missing: Graphviz's dot lays out the report's graph; the report
# test renders pages in headless Chromium (Playwright drives it and downloads no browser of its own).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_INSTALL = $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq

graphviz:
	@command -v dot >/dev/null || { $(APT_INSTALL) graphviz >/dev/null; }

chromium:
	@command -v chromium >/dev/null || { $(APT_INSTALL) chromium >/dev/null; }

clean:
	rm -rf $(VENV) build *.egg-info
