# Two commands on a fresh machine: `make test` and `make bench`. Both set up first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
INSTALLED := $(VENV)/.ringreduce-installed
BUILT := $(VENV)/.ringreduce-built
# Parallel compile jobs for the extension (this machine has 2 cores).
export MAX_JOBS ?= 2

.PHONY: install build test bench bench-peers gpu-check clean

# Set-up: a virtual environment with torch (the default, CUDA-enabled wheel) and the extension,
# built against that torch (no build isolation, which would pull in a second torch).
install: $(INSTALLED)

$(INSTALLED): requirements.txt requirements-dev.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -r requirements-dev.txt
	$(PIP) install -q --no-build-isolation --no-deps -e .
	touch $(INSTALLED) $(BUILT)

# Incremental rebuild after editing csrc/ (the install above already built what it found).
build: install
	@if [ -n "$$(find csrc setup.py -newer $(BUILT) 2>/dev/null)" ]; then \
		$(PY) setup.py -q build_ext --inplace && touch $(BUILT); fi

test: build
	$(PY) -m pytest -q

bench: build
	$(PY) -m ringreduce.bench --json bench.json --plot bench.png

# Optional peers for the benchmark: OpenMPI (Debian packages) and mpi4py, for the MPI_Allreduce rows.
bench-peers: install
	command -v mpirun >/dev/null || (apt-get update -q && apt-get install -y -q openmpi-bin libopenmpi-dev)
	$(PIP) install -q mpi4py

# The GPU checks, for a GPU machine with torch, nvcc and NCCL installed (no set-up, no network).
gpu-check:
	bash benchmarks/gpu_check.sh

clean:
	rm -rf build ringreduce/*.so *.egg-info
