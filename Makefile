# Everything a fresh machine needs. `make run` and `make test` create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TRITON_VENV := .venv-triton
TRITON_STAMP := $(TRITON_VENV)/.installed
OUT := out

.PHONY: run test test-fast gpu-test node-tests models clean help

help:
	@echo "make run        compile a shipped model and run it (GPU if present, else the CPU backend)"
	@echo "make test       the test suite (CPU-only machine; GPU tests skip with a reason); builds .venv-triton"
	@echo "                for the Triton serving test"
	@echo "make gpu-test   only the GPU tests (run on a machine with an NVIDIA GPU)"
	@echo "make node-tests ONNX backend node tests through grapec, with pass/fail counts"
	@echo "make models     rebuild the full-size model zoo into models/full (needs torch, transformers)"

$(STAMP): pyproject.toml requirements-dev.txt
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements-dev.txt
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $@

# Triton Inference Server for the serving test (tests/test_triton.py): numpy<2, so a venv of its own
$(TRITON_STAMP): pyproject.toml requirements-triton.txt
	$(PY) -m venv $(TRITON_VENV)
	$(TRITON_VENV)/bin/python -m pip install -q --upgrade pip
	$(TRITON_VENV)/bin/python -m pip install -q -r requirements-triton.txt
	$(TRITON_VENV)/bin/python -m pip install -q --no-deps -e .
	touch $@

run: $(STAMP)
	@mkdir -p $(OUT)
	$(BIN)/grapec compile models/tiny/gpt2.onnx -o $(OUT)/gpt2.grape --dim batch=1,seq=8
	$(BIN)/grapec inspect $(OUT)/gpt2.grape
	$(BIN)/grapec run $(OUT)/gpt2.grape --backend auto

# the suite over every core (pytest-xdist), a test file to a worker: a module's fixtures (the cost model's
# calibration bundle, the corpus's wheels) are made once, by one process. GPU tests stay serial: they share
# one device and time it.
test: $(STAMP) $(TRITON_STAMP)
	$(BIN)/python -m pytest -q -n auto --dist loadfile

gpu-test: $(STAMP) $(TRITON_STAMP)
	$(BIN)/python -m pytest -q -m gpu

node-tests: $(STAMP)
	$(BIN)/python -m grapec.tools.onnx_backend

models: $(STAMP)
	$(BIN)/python -m pip install -q torch==2.13.0 transformers onnxscript
	$(BIN)/python models/build.py --size full --out models/full

clean:
	rm -rf $(VENV) $(TRITON_VENV) $(OUT) .pytest_cache
