# Two commands on a fresh machine: `make test` and `make bench`. Both set up first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
INSTALLED := $(VENV)/.ringreduce-installed
BUILT := $(VENV)/.ringreduce-built
# Parallel compile jobs for the extension (this machine has 2 cores).
export MAX_JOBS ?= 2
# The build sees the venv's tools first: its ninja, without which torch's build falls back to a slow
# serial one wherever the system has no ninja of its own.
IN_VENV := PATH="$(CURDIR)/$(VENV)/bin:$$PATH"
# The oldest Python the set-up installs on (setup.py says why).
OLDEST_PYTHON := 3.11

.PHONY: install build test bench bench-peers gpu-check clean

# Set-up: a virtual environment with torch (the default, CUDA-enabled wheel) and the development tools.
install: $(INSTALLED)

$(INSTALLED): requirements.txt requirements-dev.txt pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < tuple(map(int, "$(OLDEST_PYTHON)".split("."))))' || \
		{ echo "ringreduce needs Python $(OLDEST_PYTHON) or newer, and $(PYTHON) is $$($(PYTHON) --version 2>&1);" \
		"run make PYTHON=python3.11 (or newer)" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -r requirements-dev.txt
	touch $(INSTALLED)

# The wheel, built against the environment's torch (no build isolation, which would pull in a second torch)
# and installed into it, so that tests and benchmarks run what a user installs; the engine is also placed in
# the source folder, so that `python -m ringreduce.<tool>` works from here. Built again when a source or the
# set-up changed (a deleted module changes its folder; the staged copies in build/lib* go before each build);
# the compiler's objects in build/temp* are reused, so a Python-only change costs a link.
SOURCES := csrc ringreduce ringreduce_autoload.py setup.py pyproject.toml $(INSTALLED)
build: install
	@if [ ! -e $(BUILT) ] || [ -n "$$(find $(SOURCES) -newer $(BUILT) -not -path '*__pycache__*' \
			-not -name '_built_for.py' -not -name '*.so' 2>/dev/null)" ]; then \
		rm -rf dist/ringreduce-*.whl build/lib.* build/bdist.* && \
		$(IN_VENV) $(PIP) wheel -q --no-build-isolation --no-deps -w dist . && \
		$(PIP) install -q --no-deps --force-reinstall dist/ringreduce-*.whl && \
		PYTHONSAFEPATH=1 $(IN_VENV) $(PY) setup.py -q build_ext --inplace && touch $(BUILT); fi

# PYTHONSAFEPATH: the source folder is not put on sys.path, so `import ringreduce` finds the installed wheel.
# Two pytest-xdist workers, each taking whole files: the suite's ranks leave about a quarter of the two cores
# idle (waiting on timeouts, links, process start); on 2026-12-03 one worker took 13:20, two 10:07.
# A third only adds contention: on 2026-12-07 three took 16:37 of tests, two 15:48 (the suite is CPU-bound).
TEST_WORKERS ?= 2
test: build
	PYTHONSAFEPATH=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

bench: build
	PYTHONSAFEPATH=1 $(PY) -m ringreduce.bench --json bench.json --plot bench.png

# Optional peers for the benchmark: OpenMPI (Debian packages) and mpi4py, for the MPI_Allreduce rows.
bench-peers: install
	command -v mpirun >/dev/null || (apt-get update -q && apt-get install -y -q openmpi-bin libopenmpi-dev)
	$(PIP) install -q mpi4py

# The GPU checks, for a GPU machine with torch, nvcc and NCCL installed (no set-up, no network).
gpu-check:
	bash benchmarks/gpu_check.sh

clean:
	rm -rf build dist ringreduce/*.so ringreduce/_built_for.py *.egg-info $(BUILT)
