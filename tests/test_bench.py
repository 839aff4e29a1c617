"""The benchmark runs every collective it offers, checks each row's result, and reports it."""

import json
import shutil
import subprocess
import sys

import pytest

from ringreduce.bench import options, timing
from ringreduce.bench.options import COLLECTIVES
from ringreduce.bench.report import BUS_FACTORS

BENCH_TIMEOUT_S = 240


def test_bench_rows_of_every_collective_are_checked_and_correct(tmp_path):
    """One launch times every collective in turn (--collective all): a table each, every row checked."""
    out, picture = tmp_path / "bench.json", tmp_path / "bench.png"
    done = subprocess.run([sys.executable, "-m", "ringreduce.bench", "--world", "2", "--sizes", "4K,300K",
                           "--collective", "all", "--trials", "3", "--iters", "3", "--no-mpi", "--progress", "0",
                           "--json", str(out), "--plot", str(picture)], capture_output=True, text=True,
                          timeout=BENCH_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    records = json.loads(out.read_text())
    assert [r["collective"] for r in records] == sorted((r["collective"] for r in records), key=COLLECTIVES.index)
    for collective in COLLECTIVES:
        rows = [r for r in records if r["collective"] == collective]
        names = {(r["impl"], r["transport"]) for r in rows}
        assert {("ringreduce", "shm"), ("ringreduce", "torch.distributed"), ("torch.distributed", "gloo")} <= names, (
            collective, names)
        assert {r["bytes"] for r in rows} >= {4096}, collective
        for r in rows:
            assert r["wrong"] == 0, r
            assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * BUS_FACTORS[collective][1](2)), r
            assert 0 < r["fastest_us"] <= r["time_us"], r
        assert done.stdout.count(f"# {collective}, 2 ranks") == 1, done.stdout
    algorithms = {r["algorithm"] for r in records if r["transport"] == "shm" and r["collective"] == "all_reduce"}
    assert algorithms == {"ring", "central", "one_shot", "auto"}, algorithms
    assert "# auto/shm against the best of ring, central, one_shot" in done.stdout
    assert picture.stat().st_size > 0


def _refused(argument, capsys):
    """What the option parser says as it refuses `argument` (exit status 2, argparse's usage error)."""
    with pytest.raises(SystemExit) as refused:
        options.parse_args([argument])
    assert refused.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("argument, said", [
    ("--collective=reduce,gather", "argument --collective: gather is not one of all_reduce, reduce_scatter, "
                                   "all_gather, broadcast, reduce (or all)"),
    ("--collective=,", "argument --collective: nothing is not one of"),
])
def test_collectives_not_offered_are_refused_by_name(argument, said, capsys):
    assert said in _refused(argument, capsys)


def test_a_list_of_collectives_is_kept_in_order_once_each():
    assert options.parse_args(["--collective", "reduce, all_reduce,reduce"]).collectives == ["reduce", "all_reduce"]
    assert options.parse_args(["--collective", "all"]).collectives == list(COLLECTIVES)
    assert options.parse_args([]).collectives == ["all_reduce"]


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
    assert "# speed-up over OpenMPI (mpi4py) (its time / ours; > 1 is faster; median trials)" in done.stdout


class FakeClock:
    """perf_counter and sleep of the timing module, advanced only by the calls under test."""

    def __init__(self):
        self.now, self.pauses = 0.0, []

    def perf_counter(self):
        return self.now

    def sleep(self, seconds):
        self.pauses.append(seconds)


def test_trials_interleave_in_a_rotating_order_and_give_each_rows_median_and_fastest(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(timing, "time", clock)
    # Row 0's calls take 1, 5, 2, 4, 3 ms in its successive trials; row 1's always 10 ms.
    durations = [[0.001, 0.005, 0.002, 0.004, 0.003], [0.010] * 5]
    made = []

    def call_of(row):
        def call():
            timed = [r for r in made if r == row]
            made.append(row)
            warmup = 1  # no calibration calls: --iters is given
            trial = (len(timed) - warmup) // 4 if len(timed) >= warmup else 0
            clock.now += durations[row][trial]
        return call

    class Args:
        iters, warmup, trials = 4, 1, 5

    times = timing.timed_trials([call_of(0), call_of(1)], Args, timing.nothing, lambda t: t, lambda n: n,
                                settles=[False, True])
    assert [t._asdict() for t in times] == [{"median": pytest.approx(0.003), "fastest": pytest.approx(0.001)},
                                            {"median": pytest.approx(0.010), "fastest": pytest.approx(0.010)}]
    timed = made[2:]  # after each row's warm-up call
    assert timed == [0] * 4 + [1] * 4 + [1] * 4 + [0] * 4 + [0] * 4 + [1] * 4 + [1] * 4 + [0] * 4 + [0] * 4 + [1] * 4
    assert clock.pauses == [timing.TCP_SETTLE_SECONDS] * 5  # after each trial of the TCP row only


@pytest.mark.parametrize("durations, calls_made, per_call", [
    ([0.006] + [0.00003] * 2, 3, 0.00003),  # a first call stalled for 6 ms does not size the trials
    ([0.001] * 7, 7, 0.001),                # blocks of 1, 2 and 4 calls: 7 ms in all
])
def test_trials_are_sized_from_blocks_of_calls_not_from_one_call(monkeypatch, durations, calls_made, per_call):
    clock = FakeClock()
    monkeypatch.setattr(timing, "time", clock)
    made = []

    def call():
        clock.now += durations[len(made)]
        made.append(1)

    assert timing.seconds_per_call(call, timing.nothing, lambda t: t) == pytest.approx(per_call)
    assert len(made) == calls_made

    class Args:
        iters, warmup, trials, row_seconds = 0, 0, 1, 0.5

    made.clear()
    budget_calls = int(Args.row_seconds / 0.00003)
    durations = [0.006] + [0.00003] * (2 + budget_calls)  # the stalled call, then a probe of 2 and the trial
    timing.timed_trials([call], Args, timing.nothing, lambda t: t, lambda n: n)
    assert len(made) == 3 + budget_calls


@pytest.mark.parametrize("argument", ["--trials=0", "--iters=-1", "--warmup=-2", "--row-seconds=0"])
def test_counts_below_their_bound_are_refused_with_the_option_named(argument, capsys):
    said = _refused(argument, capsys)
    assert f"argument {argument.split('=')[0]}: " in said and "is below" in said, said
