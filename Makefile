# Two entry points, each creating its own virtual environment when needed:
#   make run   compile (for now: import) the bundled example model
#   make test  run the test suite
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test clean

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first and pinned: the CPU wheel on disk, never a multi-GB CUDA build from a range.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test,corpus]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/pypto-offline examples/example.onnx --target kirin9050 --input-shape x=1,3,64,64

test: $(STAMP)
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) build *.egg-info
