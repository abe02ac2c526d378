# edged: two commands matter on a fresh machine — `make run` and `make test` (see README).
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
TEXT   ?= Hello from edged, speaking on the built-in tiny model.

.PHONY: run test install install-dev install-system system-deps bench lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# The runtime alone: numpy, onnxruntime, safetensors, tokenizers (no torch). silero-vad brings the
# VAD's ONNX model file; its Python code needs torch, so it is installed without its dependencies.
install: $(BIN)/python
	$(BIN)/pip install -q -e .
	$(BIN)/pip install -q --no-deps silero-vad==6.2.3

# The runtime + the front doors + the engine toolchain + the public reference (qwen-tts, without its demo deps).
install-dev: $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[export,test,systemd,doors,bench]'
	$(BIN)/pip install -q --no-deps qwen-tts==0.1.1
	$(BIN)/pip install -q --no-deps silero-vad==6.2.3

# edged as a systemd service (as root): a venv in /opt/edged, user edged, the unit, /etc/edged/edged.toml,
# started. PREFIX=DIR, DOORS=1 (the front doors), JETSON=1|0, START=0: scripts/install-system.sh, docs/daemon.md.
install-system:
	bash scripts/install-system.sh

# Starts the daemon on the built-in tiny artifact, speaks TEXT through it, stops it.
run: install
	BIN=$(BIN) TEXT="$(TEXT)" bash scripts/run-demo.sh

# Debian packages the tests need (systemd, journald, JACK, PortAudio): installed when root, else listed.
system-deps:
	bash scripts/install-system-deps.sh

# The suite in two parts: everything but the audio tests on TEST_WORKERS pytest-xdist workers (a
# module per worker; the tiny artifacts built once, tests/support/built_once.py), then the audio tests
# on as many workers of their own (each module its own jackd): they are paced by JACK's clock, mostly
# waiting on it, so they run beside each other but never beside the first part's exports.
# It starts with the CPU (the suite's time differs by class: docs/dev/tests.md), and each part ends
# with its slowest tests (--durations): where the time goes on this machine's CPU.
# Both parts always run; the target fails if either did.
TEST_WORKERS ?= 2
test: system-deps install-dev
	@$(BIN)/python -c 'import os; from edged.cpu import this_cpu; print(f"cpu: {this_cpu().line()}, {len(os.sched_getaffinity(0))} cores")'
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15 --ignore=tests/audio; cpu=$$?; \
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=10 tests/audio; audio=$$?; \
	test $$cpu -eq 0 -a $$audio -eq 0

lint: install-dev
	BIN=$(BIN) bash scripts/lint.sh

bench: install-dev
	$(BIN)/python scripts/bench/synth.py
	$(BIN)/python scripts/bench/daemon.py

clean:
	rm -rf $(VENV) out .pytest_cache
