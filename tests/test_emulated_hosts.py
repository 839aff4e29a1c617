"""Ranks on emulated hosts (ringreduce/bench/hosts.py): network namespaces with their own hostname
and /dev/shm, joined by rate-limited links. What a job on several real hosts meets: host detection
through the store, shared memory inside each host, gloo across, a link that goes down, a host that dies."""

import io
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from hosts_worker import SCALE_VICTIM
from ringreduce.bench import hosts as emulated

pytestmark = pytest.mark.skipif(emulated.available() is not None, reason=str(emulated.available()))

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
WORKER = [sys.executable, os.path.join(TESTS, "hosts_worker.py")]
ENV = {"PYTHONPATH": TESTS}
# Placements by name: ranks of each host. (Ranks placed round-robin: tests/test_hierarchy.py, with
# hosts named by RINGREDUCE_HOST_NAME.)
PLACEMENTS = {"2x2": [[0, 1], [2, 3]], "2+1+2": [[0, 1], [2], [3, 4]]}
DESCRIBED = {"2x2": "2 hosts x 2 ranks", "2+1+2": "3 hosts (2+1+2 ranks)"}
# A whole launch (start, rendezvous, the checks) on 2 cores shared by every rank.
LAUNCH_TIMEOUT_S = 180
# Survivors must raise within the group's timeout plus this (issue: timeout + 5 s).
FAULT_MARGIN_S = 5


@pytest.fixture(autouse=True)
def nothing_left_behind():
    yield
    mine = [name for name in emulated.leftovers() if name.startswith(f"rr{os.getpid():x}")]
    assert not mine, f"emulated hosts left behind: {mine}"


def _json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _finish(procs):
    """Each process's JSON lines, after it exited 0 (else its stderr is the failure)."""
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
        assert proc.returncode == 0, f"exit {proc.returncode}:\n{err[-3000:]}"
        results += _json_lines(out)
    return results


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
def test_every_collective_is_exact_and_bitwise_identical_across_hosts(placement):
    with emulated.EmulatedHosts(len(PLACEMENTS[placement])) as hosts:
        procs = hosts.launch([*WORKER, "check"], PLACEMENTS[placement], env=ENV, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        results = _finish(procs)
    assert sorted(r["rank"] for r in results) == list(range(len(results)))
    assert {(r["hosts"], r["transport"], r["checks"]) for r in results} == {(DESCRIBED[placement], "pg", 36)}
    assert all(r["bits"] == results[0]["bits"] for r in results), "ranks hold different bits"


# A rank of launch's own test: where it runs, what it was given, and an exit status of its own
# ("torch": imported once, by the starter, before it forked the rank).
WHERE_AM_I = """
import json, os, socket, sys
open(f"/dev/shm/rank{os.environ['RANK']}", "w").close()
given = [os.environ[k] for k in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "MASTER_ADDR")]
print(json.dumps({"argv": sys.argv[1:], "host": socket.gethostname(), "shm": sorted(os.listdir("/dev/shm")),
                  "env": given, "folder": os.getcwd(), "torch": "torch" in sys.modules}), flush=True)
sys.exit(int(os.environ["RANK"]) + 3)
"""


def test_launch_forks_each_rank_into_its_host_with_its_arguments_and_exit_status(tmp_path):
    script = tmp_path / "where.py"
    script.write_text(WHERE_AM_I)
    with emulated.EmulatedHosts(2, link=None) as hosts:
        with pytest.raises(ValueError, match="python -m module"):
            hosts.launch([sys.executable, "-c", "pass"], [[0], [1]])
        procs = hosts.launch([sys.executable, str(script), "a b", "--c"], [[0, 2], [1]], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=tmp_path)
        outputs = [proc.communicate(timeout=LAUNCH_TIMEOUT_S) for proc in procs]
    said = [json.loads(out) for out, _ in outputs]
    assert [proc.returncode for proc in procs] == [3, 4, 5], [err for _, err in outputs]
    assert [s["host"] for s in said] == [f"rr{os.getpid():x}-host{h}" for h in (0, 1, 0)]
    # Each host's own /dev/shm: host 0's ranks may see each other's file (they run at once), never host 1's.
    assert "rank1" not in said[0]["shm"] + said[2]["shm"] and said[1]["shm"] == ["rank1"], said
    assert [s["env"] for s in said] == [["0", "0", "2", "3", "10.213.0.1"], ["1", "0", "1", "3", "10.213.0.1"],
                                        ["2", "1", "2", "3", "10.213.0.1"]]
    assert all(s["argv"] == ["a b", "--c"] and s["folder"] == str(tmp_path) and s["torch"] for s in said), said


def test_a_starter_that_cannot_start_is_named_and_nothing_waits_on_it(tmp_path):
    (tmp_path / "torch.py").write_text("raise ImportError('planted: no torch here')\n")
    with emulated.EmulatedHosts(1, link=None) as hosts:
        with pytest.raises(RuntimeError, match="the ranks' starter exited 1 before it forked rank 0"):
            hosts.launch([sys.executable, "x.py"], [[0]], env={"PYTHONPATH": str(tmp_path)},
                         stderr=subprocess.DEVNULL)


def _parent_of(pid):
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def test_a_launched_rank_whose_starter_died_still_ends_its_wait():
    """A module run as `python -m`; its starter (the parent) killed while it runs: the rank's wait
    does not hang, and ends once the rank is gone, with the starter's status."""
    with emulated.EmulatedHosts(1, link=None) as hosts:
        (proc,) = hosts.launch([sys.executable, "-m", "timeit", "-n", "1", "-r", "1", "import time; time.sleep(300)"],
                               [[0]], stdout=subprocess.DEVNULL)
        os.kill(_parent_of(proc.pid), signal.SIGKILL)
        time.sleep(0.5)
        assert proc.poll() is None, "the rank still runs"
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGKILL


def test_the_backend_under_torchrun_on_each_host():
    with emulated.EmulatedHosts(2) as hosts:
        procs = hosts.torchrun([os.path.join(TESTS, "hosts_worker.py"), "backend"], per_host=2, env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        results = _finish(procs)
    assert sorted(r["rank"] for r in results) == [0, 1, 2, 3]
    assert all(all(r["ok"]) and len(r["ok"]) == 4 for r in results)
    assert sorted(r["local_rank"] for r in results) == [0, 0, 1, 1]


def _losses(text):
    return [line.split("loss")[1].split()[0] for line in text.splitlines() if line.startswith("epoch")]


def test_ddp_on_ringreduce_across_hosts_gives_the_losses_of_gloo():
    train = [sys.executable, os.path.join(ROOT, "examples", "train_ddp.py"), "--hook", "builtin", "--epochs", "2",
             "--samples", "4096"]
    losses = {}
    for backend in ("gloo", "ringreduce"):
        with emulated.EmulatedHosts(2) as hosts:
            procs = hosts.launch([*train, "--backend", backend], PLACEMENTS["2x2"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
            outputs = []
            for proc in procs:
                out, err = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
                assert proc.returncode == 0, f"{backend}: exit {proc.returncode}:\n{err[-3000:]}"
                outputs.append(out)
        losses[backend] = _losses(outputs[0])
    assert len(losses["gloo"]) == 2 and losses["ringreduce"] == losses["gloo"]


def _reader(proc, lines):
    for line in proc.stdout:
        if line.startswith("{"):
            lines.put(json.loads(line))


def _run_fault(make_fault, survivors_of):
    """Launches 2x2 ranks reducing 64 MiB, makes the fault once all have finished one call, and
    returns (seconds from the fault to each survivor's error, the errors)."""
    placement = PLACEMENTS["2x2"]
    with emulated.EmulatedHosts(2) as hosts:
        procs = hosts.launch([*WORKER, "fault"], placement, env=ENV, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
        lines = queue.Queue()
        for proc in procs:
            threading.Thread(target=_reader, args=(proc, lines), daemon=True).start()
        ready = set()
        while len(ready) < len(procs):
            ready.add(lines.get(timeout=LAUNCH_TIMEOUT_S)["ready"])
        time.sleep(0.5)  # inside the next 64 MiB call
        fault_at = time.time()
        make_fault(hosts)
        survivors = survivors_of(placement)
        outcomes = {}
        deadline = fault_at + FAULT_TIMEOUT_S + FAULT_MARGIN_S + 30  # generous: the assertion below is the bound
        while set(outcomes) != set(survivors) and time.time() < deadline:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                continue
            if "raised_at" in line:
                outcomes[line["rank"]] = line
        for rank in survivors:
            assert rank in outcomes, f"rank {rank} did not raise within {deadline - fault_at:.0f} s of the fault"
            procs[rank].wait(timeout=30)
    return {r: o["raised_at"] - fault_at for r, o in outcomes.items()}, {r: o["error"] for r, o in outcomes.items()}


# The group timeout of the fault runs (tests/hosts_worker.py).
FAULT_TIMEOUT_S = 10


def test_a_link_going_down_makes_every_rank_raise_within_the_timeout():
    delays, errors = _run_fault(lambda hosts: hosts.set_link(1, up=False), lambda placement: [0, 1, 2, 3])
    assert max(delays.values()) < FAULT_TIMEOUT_S + FAULT_MARGIN_S, delays
    # Each names the wait that ran out: its link's, or its neighbour's in shared memory.
    assert all("Timed out" in e for e in errors.values()), errors


@pytest.mark.parametrize("host", [0, 1], ids=["the store's host", "the other host"])
def test_a_host_killed_makes_the_other_hosts_ranks_raise_naming_a_lost_rank(host):
    delays, errors = _run_fault(lambda hosts: hosts.kill_host(host), lambda placement: placement[1 - host])
    assert max(delays.values()) < FAULT_TIMEOUT_S + FAULT_MARGIN_S, delays
    lost = PLACEMENTS["2x2"][host]
    assert all(any(f"rank {r}" in e for r in lost) for e in errors.values()), errors


# The loss bound of the stall run (RINGREDUCE_LOST_AFTER), and how long host 1 stays stopped: past it.
STALL_BOUND_S = 3
STALL_S = 2 * STALL_BOUND_S


# "stop": its processes stopped (its kernel still answers the others' probes); "cut": its link
# down (the probes go unanswered).
@pytest.mark.parametrize("how", ["stop", "cut"])
def test_a_host_stopped_past_the_bound_is_fenced_and_its_ranks_told_when_it_resumes(how):
    placement = PLACEMENTS["2x2"]
    with emulated.EmulatedHosts(2) as hosts, tempfile.TemporaryFile("w+") as errors:
        procs = hosts.launch([*WORKER, "stall"], placement, env={**ENV, "RINGREDUCE_LOST_AFTER": str(STALL_BOUND_S)},
                             stdout=subprocess.PIPE, stderr=errors, text=True)
        lines = queue.Queue()
        readers = [threading.Thread(target=_reader, args=(proc, lines), daemon=True) for proc in procs]
        for reader in readers:
            reader.start()
        ready = set()
        while len(ready) < len(procs):
            ready.add(lines.get(timeout=LAUNCH_TIMEOUT_S)["ready"])
        time.sleep(0.5)  # inside the all-reduces
        pause, resume = {"stop": (lambda: hosts.stop_host(1), lambda: hosts.stop_host(1, stopped=False)),
                         "cut": (lambda: hosts.set_link(1, up=False), lambda: hosts.set_link(1, up=True))}[how]
        pause()
        time.sleep(STALL_S)
        resume()
        for proc in procs:
            proc.wait(timeout=LAUNCH_TIMEOUT_S)
        for reader in readers:
            reader.join(timeout=10)
        outcomes = {}
        while not lines.empty():
            line = lines.get()
            outcomes[line["rank"]] = line
        errors.seek(0)
        assert sorted(outcomes) == [0, 1, 2, 3], errors.read()[-3000:]
    assert all(o["lost"] == [2, 3] for o in outcomes.values()), outcomes
    assert [outcomes[r]["after"] for r in (0, 1)] == [1.0, 1.0], outcomes
    assert all(f"this rank ({r}) was excluded" in outcomes[r]["error"] for r in (2, 3)), outcomes


def test_elastic_ddp_goes_on_after_a_host_or_a_rank_dies():
    """examples/elastic_ddp.py on 2 emulated hosts x 2 ranks: trial 0 kills host 1 (both its ranks),
    trial 1 kills rank 0 (seed 3); the survivors shrink and finish with identical parameters (the
    script checks), and the emulated hosts are removed (the fixture checks)."""
    done = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "elastic_ddp.py"), "--emulated-hosts", "2",
                           "--nproc", "2", "--trials", "2", "--seed", "3", "--steps", "20"],
                          capture_output=True, text=True, timeout=2 * LAUNCH_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 of 2 trials finished" in done.stdout, done.stdout
    assert "kill host 1" in done.stdout and "kill rank 0" in done.stdout, done.stdout


def test_the_hosts_bench_rows_compressed_links_beside_exact_ones():
    """`python -m ringreduce.bench --hosts`: the bf16 and fp16 rows with their bound (half the
    hierarchical one) and their error against float64, within each format's bound at 2 hosts
    (the reduce-scatter's rows are the same code; tests/test_compression.py checks its errors)."""
    from ringreduce.bench import across_hosts

    (record,) = across_hosts.run([2, 2], "2gbit", [1 << 20], trials=1, row_seconds=0.05)
    assert {"gloo", "ring", "hierarchical", "doubling", "bf16", "fp16"} <= set(record["rows"])
    assert record["compressed_bounds_s"]["bf16"] == record["hierarchical_bound_s"] / 2
    for name, unit in (("bf16", 2.0 ** -8), ("fp16", 2.0 ** -11)):
        row = record["rows"][name]
        assert 0 < row["rms_error"] < row["max_error"] <= (1 + unit) ** 2 * (1 + 2.0 ** -24) ** 5 - 1, (name, row)
    # Keeping the rounding errors changes neither the sum nor the bytes.
    assert record["rows"]["int8+fb"]["max_error"] == record["rows"]["int8"]["max_error"] > 0
    assert record["compressed_bounds_s"]["int8+fb"] == record["compressed_bounds_s"]["int8"]
    # Every row's CPU time per call, user and system, of the 4 ranks together.
    assert all(len(row["cpu_s"]) == 2 and min(row["cpu_s"]) >= 0 and sum(row["cpu_s"]) > 0
               for row in record["rows"].values()), record["rows"]
    table = io.StringIO()
    across_hosts.print_table([record], [2, 2], "2gbit", out=table)
    assert "bf16 error vs float64 (max, RMS relative" in table.getvalue(), table.getvalue()
    assert f"1M gloo {sum(record['rows']['gloo']['cpu_s']):.3f}, ring" in table.getvalue(), table.getvalue()


# The scale run: 8 hosts x 2 ranks. Its group's loss bound is the default (10 s); a killed rank is
# named by the evidence that its process is gone (its pid on its host, its refused liveness port
# elsewhere) well within it.
SCALE_PLACEMENT = emulated.in_order([2] * 8)
SCALE_LOSS_BOUND_S = 10


def test_16_ranks_on_8_hosts_every_collective_then_a_kill_named_and_shrunk():
    """What a job leaving one machine meets: every collective of the backend right on 16 ranks over 8
    hosts (4 KiB and a ragged size, against closed forms), then a rank killed: every survivor names
    it within the loss bound, they shrink to 15, and the shrunk group all-reduces right."""
    world = sum(len(host) for host in SCALE_PLACEMENT)
    with emulated.EmulatedHosts(len(SCALE_PLACEMENT)) as hosts:
        procs = hosts.launch([*WORKER, "scale"], SCALE_PLACEMENT, env=ENV, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        results = {}
        for rank, proc in enumerate(procs):
            out, err = proc.communicate(timeout=2 * LAUNCH_TIMEOUT_S)
            if rank == SCALE_VICTIM:
                assert proc.returncode == -9, f"the victim exited {proc.returncode}:\n{err[-3000:]}"
                continue
            assert proc.returncode == 0, f"rank {rank}: exit {proc.returncode}:\n{err[-3000:]}"
            (results[rank],) = _json_lines(out)
    survivors = [r for r in range(world) if r != SCALE_VICTIM]
    assert sorted(results) == survivors
    assert all(r["failed"] == [] for r in results.values()), {r: o["failed"] for r, o in results.items()}
    assert len({r["host"] for r in results.values()}) == len(SCALE_PLACEMENT)
    assert all(r["lost"] == [SCALE_VICTIM] for r in results.values()), {r: o["lost"] for r, o in results.items()}
    delays = {r: round(o["raised_after"], 2) for r, o in results.items()}
    assert max(delays.values()) < SCALE_LOSS_BOUND_S, delays
    assert all(r["shrunk_size"] == world - 1 and r["after"] == [r["expected"]] == [float(sum(survivors))]
               for r in results.values()), results
