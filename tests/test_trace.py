"""RINGREDUCE_TRACE and the profiler ranges: the files' format, their step counts, the merge and
plot commands on a real multi-process run, and ringreduce:<collective> ranges in torch.profiler."""

import gc
import json
import os
import subprocess
import sys

import pytest
import torch

import ringreduce
from multiproc import run_ranks
from ringreduce import _C
from ringreduce import trace as trace_tool

WORLD = 4
SEGMENT_BYTES = 4096
SEGMENTS_PER_CHUNK = 3
NUMEL = WORLD * SEGMENTS_PER_CHUNK * SEGMENT_BYTES // 4  # float32: each chunk is 3 segments
TOOL_TIMEOUT_S = 120


def traced_local_run(folder, monkeypatch, algorithm):
    """One all-reduce on 4 local ranks with tracing on; returns the files' contents by rank."""
    monkeypatch.setenv("RINGREDUCE_TRACE", str(folder))
    local = ringreduce.LocalWorld(WORLD)
    tensors = [torch.full((NUMEL,), float(r)) for r in range(WORLD)]
    local.all_reduce(tensors, algorithm=algorithm, segment_bytes=SEGMENT_BYTES)
    assert all(torch.equal(t, torch.full((NUMEL,), 6.0)) for t in tensors)
    ringreduce.destroy()
    del local
    gc.collect()  # the communicators go, and write their files
    files = sorted(folder.glob("ringreduce-local-rank*of4-*.json"))
    assert len(files) == WORLD, files
    return {json.loads(f.read_text())["otherData"]["rank"]: json.loads(f.read_text()) for f in files}


def receives(events):
    return [e for e in events if e.get("cat") == "transfer" and e["name"] in trace_tool.RECEIVES]


def test_a_ring_trace_has_2_n_minus_1_steps_per_segment_nested_in_its_collective(tmp_path, monkeypatch):
    by_rank = traced_local_run(tmp_path, monkeypatch, "ring")
    for rank, data in by_rank.items():
        assert data["otherData"] == {"rank": rank, "world": WORLD, "transport": "local", "clock": "CLOCK_REALTIME",
                                     "dropped_events": 0}
        events = data["traceEvents"]
        (call,) = [e for e in events if e.get("cat") == "collective"]
        assert call["name"] == "all_reduce" and call["ph"] == "X"
        assert call["args"] == {"bytes": NUMEL * 4, "sequence": 0, "algorithm": "ring", "transport": "local",
                                "dtype": "float32", "op": "SUM"}
        steps = receives(events)
        assert len(steps) == 2 * (WORLD - 1) * SEGMENTS_PER_CHUNK, [e["name"] for e in steps]
        reducing = [e for e in steps if e["name"] in trace_tool.REDUCING]
        assert len(reducing) == (WORLD - 1) * SEGMENTS_PER_CHUNK  # the reduce-scatter half
        for e in steps:
            assert e["args"]["bytes"] == SEGMENT_BYTES and e["args"]["peer"] == (rank - 1) % WORLD
            assert call["ts"] <= e["ts"] and e["ts"] + e["dur"] <= call["ts"] + call["dur"] + 1e-3
            assert e["pid"] == rank and e["tid"] == e["args"]["lane"] == 0


@pytest.mark.parametrize("algorithm, steps_of", [
    ("central", lambda rank: (WORLD - 1 if rank == 0 else 1) * WORLD * SEGMENTS_PER_CHUNK),
    ("one_shot", lambda rank: WORLD - 1),
])
def test_central_and_one_shot_steps_are_traced_too(algorithm, steps_of, tmp_path, monkeypatch):
    for rank, data in traced_local_run(tmp_path, monkeypatch, algorithm).items():
        assert len(receives(data["traceEvents"])) == steps_of(rank), (algorithm, rank)


def test_nothing_is_written_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv("RINGREDUCE_TRACE", raising=False)
    monkeypatch.chdir(tmp_path)
    local = ringreduce.LocalWorld(2)
    local.all_reduce([torch.ones(10), torch.ones(10)])
    ringreduce.destroy()
    del local
    gc.collect()
    assert list(tmp_path.iterdir()) == []


def _traced_shm_job(rank, world):
    t = torch.full((NUMEL,), float(rank))
    ringreduce.all_reduce(t, algorithm="ring", transport="shm", segment_bytes=SEGMENT_BYTES)
    ringreduce.all_reduce(t, algorithm="central", transport="shm", segment_bytes=SEGMENT_BYTES)
    ringreduce.destroy()  # writes the file
    return float(t[0])


def test_merge_and_plot_a_real_four_process_run(tmp_path):
    folder = tmp_path / "traces"
    assert run_ranks(WORLD, _traced_shm_job, env={"RINGREDUCE_TRACE": str(folder)}) == [24.0] * WORLD
    merged_path, png = tmp_path / "trace.json", tmp_path / "ring.png"
    for command in (["merge", str(folder), "-o", str(merged_path)], ["plot", str(merged_path), "-o", str(png)]):
        done = subprocess.run([sys.executable, "-m", "ringreduce.trace", *command], capture_output=True, text=True,
                              timeout=TOOL_TIMEOUT_S)
        assert done.returncode == 0, done.stderr[-3000:]
    merged = json.loads(merged_path.read_text())
    assert merged["otherData"]["ranks"] == WORLD and merged["otherData"]["dropped_events"] == 0
    names = {e["args"]["name"] for e in merged["traceEvents"] if e["name"] == "process_name"}
    assert names == {f"rank {r}" for r in range(WORLD)}
    calls = trace_tool.collectives(merged)
    assert sorted(c["args"]["algorithm"] for c in calls.values()) == ["central"] * WORLD + ["ring"] * WORLD
    for rank in range(WORLD):
        ring_steps = [e for e in receives(merged["traceEvents"]) if e["pid"] == rank and e["args"]["sequence"] == 0]
        assert len(ring_steps) == 2 * (WORLD - 1) * SEGMENTS_PER_CHUNK
    assert png.stat().st_size > 10_000


def _traced_pg_ring(rank, world):
    t = torch.full((1024,), float(rank))
    ringreduce.all_reduce(t, transport="pg", algorithm="ring")
    ringreduce.destroy()  # writes the file
    return t.tolist()


def test_a_pg_call_is_checked_in_log_n_messages_per_rank_not_n_minus_1(tmp_path):
    """The pg transport's messages carry no header: each call is checked by recursive doubling first.
    At 6 ranks (4 in the rounds, 2 handed over) that is 3, 3, 2, 2, 1, 1 messages, against 5 each for
    a header sent to every peer; the ring's own 2(N-1) messages follow."""
    world = 6
    assert run_ranks(world, _traced_pg_ring, env={"RINGREDUCE_TRACE": str(tmp_path)}) == [[15.0] * 1024] * world
    checking = [sum(role in ("hand_over", "exchange", "hand_back") for _, role in _C._testing.doubling_schedule(world, r))
                for r in range(world)]
    assert checking == [3, 3, 2, 2, 1, 1]
    for rank in range(world):
        (path,) = tmp_path.glob(f"ringreduce-pg-rank{rank}of{world}-*.json")
        transfers = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("cat") == "transfer"]
        assert all(e["args"]["sequence"] == 0 for e in transfers)
        sent = sum(e["name"] in ("send", "forward", "forward_reduce") for e in transfers)  # a forward sends on
        assert sent == 2 * (world - 1) + checking[rank], (rank, [e["name"] for e in transfers])


def _traced_pg_doubling(rank, world, numel):
    t = torch.full((numel,), float(rank))
    ringreduce.all_reduce(t, transport="pg", algorithm="doubling")
    ringreduce.destroy()  # writes the file
    return t.unique().tolist()


@pytest.mark.parametrize("numel, segments", [(1024, 0), (1 << 20, 1)])
def test_a_pg_doubling_all_reduce_checks_the_call_in_its_own_log_n_messages(tmp_path, numel, segments):
    """4 KiB: each step one message each way, the check and the data together (3, 3, 2, 2, 1, 1 at 6
    ranks, against 5 for a header to every peer). 4 MiB: the first 64 KiB with the check, the rest in
    one segment more per step (the pg transport's segments are 4 MiB)."""
    world = 6
    assert run_ranks(world, _traced_pg_doubling, numel, env={"RINGREDUCE_TRACE": str(tmp_path)}) == [[15.0]] * world
    steps = [sum(role in ("hand_over", "exchange", "hand_back") for _, role in _C._testing.doubling_schedule(world, r))
             for r in range(world)]
    for rank in range(world):
        (path,) = tmp_path.glob(f"ringreduce-pg-rank{rank}of{world}-*.json")
        transfers = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("cat") == "transfer"]
        sent = sum(e["name"] == "send" for e in transfers)
        assert sent == steps[rank] * (1 + segments), (rank, [(e["name"], e["args"]["bytes"]) for e in transfers])


def test_each_collective_is_a_range_in_torch_profiler():
    local = ringreduce.LocalWorld(1)
    group = local.group(0)
    t = torch.ones(1000)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        ringreduce.all_reduce(t, group=group, algorithm="one_shot")
        ringreduce.reduce_scatter_tensor(torch.empty(1000), t, group=group)
        ringreduce.all_gather_into_tensor(torch.empty(1000), t, group=group)
        ringreduce.broadcast(t, group=group, group_src=0)
    ranges = {e.name: e for e in prof.events() if e.name.startswith("ringreduce:")}
    assert set(ranges) == {"ringreduce:all_reduce", "ringreduce:reduce_scatter", "ringreduce:all_gather",
                           "ringreduce:broadcast"}
    assert ranges["ringreduce:all_reduce"].input_shapes[0] == [1000]
    assert ranges["ringreduce:all_reduce"].kwinputs == {"algorithm": "one_shot", "transport": "local", "bytes": 4000}
    assert ranges["ringreduce:reduce_scatter"].kwinputs["algorithm"] == "ring"


EXITS_WITHOUT_DESTROY = """
import sys, tempfile, torch, torch.distributed as dist, ringreduce
dist.init_process_group("ringreduce", store=dist.FileStore(tempfile.mktemp(), 1), rank=0, world_size=1)
dist.all_reduce(torch.ones(10))
sys.exit(0)  # no destroy_process_group: the backend's communicator is never destroyed
"""


def test_a_process_that_never_destroys_its_group_still_writes_its_trace_at_exit(tmp_path):
    done = subprocess.run([sys.executable, "-c", EXITS_WITHOUT_DESTROY], capture_output=True, text=True,
                          timeout=TOOL_TIMEOUT_S, env={**os.environ, "RINGREDUCE_TRACE": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = tmp_path.glob("ringreduce-shm-rank0of1-*.json")
    calls = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("cat") == "collective"]
    assert [c["name"] for c in calls] == ["all_reduce"] and calls[0]["args"]["bytes"] == 40


@pytest.mark.parametrize("ns, text", [(0, "0.000"), (5, "0.005"), (1500, "1.500"), (-5, "-0.005"),
                                      (-1500, "-1.500"), (-1000, "-1.000"), (1234567891, "1234567.891"),
                                      (-(2**63), "-9223372036854775.808")])
def test_times_are_written_as_json_numbers_whatever_their_sign(ns, text):
    written = ringreduce._C._testing.trace_microseconds(ns)
    assert written == text
    assert json.loads(written) * 1000 == pytest.approx(ns, abs=1e-3 * abs(ns))
