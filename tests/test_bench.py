"""The benchmark runs every collective it offers, checks each row's result, and reports it."""

import json
import shutil
import subprocess
import sys

import pytest

from ringreduce.bench.options import COLLECTIVES
from ringreduce.bench.report import BUS_FACTORS

BENCH_TIMEOUT_S = 240


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_bench_rows_are_checked_and_correct(collective, tmp_path):
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, "-m", "ringreduce.bench", "--world", "2", "--sizes", "4K,300K",
                           "--collective", collective, "--trials", "1", "--iters", "3", "--no-mpi", "--progress", "0",
                           "--json", str(out)], capture_output=True, text=True, timeout=BENCH_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    records = json.loads(out.read_text())
    names = {(r["impl"], r["transport"]) for r in records}
    assert {("ringreduce", "shm"), ("ringreduce", "torch.distributed"), ("torch.distributed", "gloo")} <= names, names
    assert {r["bytes"] for r in records} >= {4096}
    for r in records:
        assert r["collective"] == collective and r["wrong"] == 0, r
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * BUS_FACTORS[collective][1](2)), r
    assert f"# {collective}, 2 ranks" in done.stdout
    if collective == "all_reduce":
        algorithms = {r["algorithm"] for r in records if r["transport"] == "shm"}
        assert algorithms == {"ring", "central", "one_shot", "auto"}, algorithms
        assert "# auto/shm against the best of ring, central, one_shot" in done.stdout


def test_the_openmpi_row_runs_in_the_benchmarks_own_processes(tmp_path):
    pytest.importorskip("mpi4py", reason="make bench-peers installs mpi4py and OpenMPI")
    if shutil.which("mpirun") is None:
        pytest.skip("no mpirun on PATH (make bench-peers installs OpenMPI)")
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, "-m", "ringreduce.bench", "--world", "2", "--sizes", "4K,64K", "--trials", "2",
                           "--iters", "3", "--no-torch", "--transports", "shm", "--progress", "0", "--json", str(out)],
                          capture_output=True, text=True, timeout=BENCH_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    records = json.loads(out.read_text())
    mpi = [r for r in records if r["impl"] == "OpenMPI"]
    assert [r["bytes"] for r in mpi] == [4096, 65536] and all(r["wrong"] == 0 for r in mpi), mpi
    assert "# speed-up over OpenMPI (mpi4py)" in done.stdout
