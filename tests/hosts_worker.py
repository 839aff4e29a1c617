"""One rank on an emulated host (tests/test_emulated_hosts.py), joined through env:// (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT, or torchrun's). It prints one line of JSON: what it saw.

    hosts_worker.py check     every collective against a float64 reference, and each rank's bits
    hosts_worker.py backend   dist.* calls on init_process_group("ringreduce")
    hosts_worker.py fault     a 64 MiB hierarchical all-reduce while the test cuts a link or kills a host
    hosts_worker.py every     every collective of the backend at 4 KiB and 16 MiB, against closed forms
    hosts_worker.py stall     all-reduces on the backend while the test stops a host past the loss bound
    hosts_worker.py scale     every collective on a large group, then a rank killed: named, and the group shrunk
"""

import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import ringreduce
from reference import R, exact_inputs, reference

# A short group timeout for the fault runs: survivors must raise within it (plus a margin).
FAULT_TIMEOUT_S = 10
# How long the survivors of a stall run wait for the stopped ranks to say what they raised.
TOLD_WAIT_S = 60


def check(rank, world):
    dist.init_process_group("gloo")
    checks = 0
    for numel in (1, 99_991, 1 << 20):
        for dtype, op in ((torch.float32, R.SUM), (torch.float32, R.AVG), (torch.bfloat16, R.SUM),
                          (torch.int64, R.MAX)):
            inputs = exact_inputs(world, numel, dtype, op)  # every rank's, and their sum: made once per case
            expected = reference(inputs, op)
            for algorithm in ("hierarchical", "ring", "auto"):
                mine = inputs[rank].clone()
                ringreduce.all_reduce(mine, op, algorithm=algorithm)
                assert torch.equal(mine, expected), f"{algorithm} {numel} {dtype} {op}"
                checks += 1
    gen = torch.Generator().manual_seed(rank)
    data = torch.randn(1 << 20, generator=gen)
    everyone = [torch.empty_like(data) for _ in range(world)]
    dist.all_gather(everyone, data)
    exact = torch.stack([t.double() for t in everyone]).sum(0)
    bits = {}
    for algorithm in ("hierarchical", "ring"):
        mine = data.clone()
        ringreduce.all_reduce(mine, algorithm=algorithm)
        torch.testing.assert_close(mine.double(), exact, rtol=1e-5, atol=1e-5)
        bits[algorithm] = mine.view(torch.int32).double().sum().item()
    # The ring's halves (hierarchical on even placements, in several blocks here) and the broadcast.
    chunk = (1 << 20) + 3
    inputs = exact_inputs(world, chunk * world, torch.float32, R.SUM)
    out = torch.empty(chunk)
    ringreduce.reduce_scatter_tensor(out, inputs[rank])
    assert torch.equal(out, reference(inputs, R.SUM)[rank * chunk:(rank + 1) * chunk])
    gathered = torch.empty(chunk * world)
    ringreduce.all_gather_into_tensor(gathered, torch.full((chunk,), float(rank)))
    assert torch.equal(gathered, torch.arange(world).float().repeat_interleave(chunk))
    sent = torch.arange(5000.0) if rank == world - 1 else torch.zeros(5000)
    ringreduce.broadcast(sent, src=world - 1)
    assert torch.equal(sent, torch.arange(5000.0))
    comm = next(iter(ringreduce._groups.group_state(None).communicators.values()))
    return {"checks": checks, "bits": bits, "hosts": comm.hosts, "transport": comm.transport}


def backend(rank, world):
    dist.init_process_group("ringreduce")
    results = []
    for numel in (3, 1 << 20):
        for op in (R.SUM, R.AVG):
            inputs = exact_inputs(world, numel, torch.float32, op)
            mine = inputs[rank].clone()
            dist.all_reduce(mine, op)
            results.append(torch.equal(mine, reference(inputs, op)))
    return {"ok": results, "local_rank": int(os.environ["LOCAL_RANK"])}


def every(rank, world, sizes=(4 << 10, 16 << 20)):
    dist.init_process_group("ringreduce")
    failed = []
    for nbytes in sizes:
        numel = nbytes // 4
        for op in (R.SUM, R.AVG, R.MAX):
            inputs = exact_inputs(world, numel, torch.float32, op)
            expected = reference(inputs, op)
            mine = inputs[rank].clone()
            dist.all_reduce(mine, op)
            if not torch.equal(mine, expected):
                failed.append(f"all_reduce {op} {nbytes} B")
            doubled = inputs[rank].clone()
            ringreduce.all_reduce(doubled, op, algorithm="doubling")  # log-step
            if not torch.equal(doubled, expected):
                failed.append(f"all_reduce doubling {op} {nbytes} B")
        chunk = numel // world
        inputs = exact_inputs(world, chunk * world, torch.float32, R.SUM)
        out = torch.empty(chunk)
        dist.reduce_scatter_tensor(out, inputs[rank])
        if not torch.equal(out, reference(inputs, R.SUM)[rank * chunk:(rank + 1) * chunk]):
            failed.append(f"reduce_scatter_tensor {nbytes} B")
        everyone = torch.arange(world, dtype=torch.float32).repeat_interleave(chunk)
        gathered = torch.empty(chunk * world)
        dist.all_gather_into_tensor(gathered, torch.full((chunk,), float(rank)))
        if not torch.equal(gathered, everyone):
            failed.append(f"all_gather_into_tensor {nbytes} B")
        listed = [torch.empty(chunk) for _ in range(world)]
        dist.all_gather(listed, torch.full((chunk,), float(rank)))
        if not torch.equal(torch.cat(listed), everyone):
            failed.append(f"all_gather {nbytes} B")
        sent = torch.arange(float(numel)) if rank == world - 1 else torch.zeros(numel)
        dist.broadcast(sent, src=world - 1)
        if not torch.equal(sent, torch.arange(float(numel))):
            failed.append(f"broadcast {nbytes} B")
        summed = torch.full((numel,), float(rank + 1))
        dist.reduce(summed, dst=1)
        if rank == 1 and not torch.equal(summed, torch.full((numel,), world * (world + 1) / 2)):
            failed.append(f"reduce {nbytes} B")
        dist.barrier()
    return {"failed": failed, "host": ringreduce._groups.host_identity(), "pid": os.getpid()}


# The rank the scale run kills once every collective has been checked: on a host with another rank,
# in the middle of the ring.
SCALE_VICTIM = 5
# Sizes of the scale run's collectives: one that every algorithm sends in one piece, and one whose
# chunks are uneven across 16 ranks.
SCALE_SIZES = (4 << 10, 4 * 99_991)


def scale(rank, world):
    """Every collective checked on a large group (`every`), then SCALE_VICTIM killed: each survivor
    says whom the group lost and how long after the kill it raised, shrinks, and all-reduces on the
    shrunk group."""
    checked = every(rank, world, SCALE_SIZES)
    store = dist.distributed_c10d._get_default_store()
    dist.barrier()
    if rank == SCALE_VICTIM:
        store.set("killed_at", repr(time.time()))
        os.kill(os.getpid(), 9)
    store.wait(["killed_at"])
    x = torch.ones(1000)
    try:
        while True:
            dist.all_reduce(x)
            x.fill_(1.0)
    except ringreduce.RanksLostError as error:
        raised_after = time.time() - float(store.get("killed_at"))
        lost = error.lost_ranks
    shrunk = ringreduce.shrink(None, lost)
    y = torch.full((99_991,), float(rank))
    dist.all_reduce(y, group=shrunk)
    survivors = [r for r in range(world) if r not in lost]
    # No survivor exits while another may still be in that call (an exited process is a lost rank),
    # and rank 0, whose process serves the store, exits last.
    store.set(f"done/{rank}", "1")
    store.wait([f"done/{r}" for r in survivors])
    store.set(f"leaving/{rank}", "1")
    if rank == 0:
        store.wait([f"leaving/{r}" for r in survivors])
    return {**checked, "lost": lost, "raised_after": raised_after, "after": sorted(set(y.tolist())),
            "expected": float(sum(survivors)), "shrunk_size": dist.get_world_size(shrunk)}


def _say(record):
    """One JSON line on stdout in one write: the ranks of a host share the pipe, and print's separate
    write of the newline let two ranks' lines run together. A write of at most PIPE_BUF (4 KiB) bytes
    to a pipe is never interleaved with another."""
    os.write(sys.stdout.fileno(), (json.dumps(record) + "\n").encode())


def fault(rank, world):
    """Reduces 64 MiB until the group fails; says how long after the test's fault it raised."""
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=FAULT_TIMEOUT_S))
    data = torch.ones(16 << 20)
    ringreduce.all_reduce(data, algorithm="hierarchical")  # one whole call before the fault
    _say({"ready": rank})
    try:
        while True:
            ringreduce.all_reduce(data, algorithm="hierarchical")
            data.fill_(1.0)
    except RuntimeError as error:
        return {"raised_at": time.time(), "error": str(error)[:2000]}


def stall(rank, world):
    """All-reduces (each checked) until the group fences a stopped host. A survivor shrinks, reduces on
    the shrunk group and keeps the store up until the fenced ranks have said what they raised."""
    dist.init_process_group("ringreduce")
    store = dist.distributed_c10d._get_default_store()
    calls = 0
    x = torch.ones(1 << 18)
    dist.all_reduce(x)
    _say({"ready": rank})
    try:
        while True:
            x = torch.full((1 << 18,), float(rank + calls))
            dist.all_reduce(x)
            assert torch.all(x == world * calls + world * (world - 1) / 2), f"call {calls}: {x[0]}"
            calls += 1
    except ringreduce.RanksLostError as error:
        outcome = {"lost": error.lost_ranks, "error": str(error)[:2000], "calls": calls}
    if rank in outcome["lost"]:
        store.set(f"told/{rank}", "1")
        return outcome
    survivors = [r for r in range(world) if r not in outcome["lost"]]
    shrunk = ringreduce.shrink(None, outcome["lost"])
    y = torch.full((100,), float(rank))
    dist.all_reduce(y, group=shrunk)
    store.wait([f"told/{r}" for r in outcome["lost"]], datetime.timedelta(seconds=TOLD_WAIT_S))
    store.set(f"read/{rank}", "1")
    if rank == 0:  # the store lives in this process: it stays up until every survivor's wait is over
        store.wait([f"read/{r}" for r in survivors], datetime.timedelta(seconds=TOLD_WAIT_S))
    return {**outcome, "after": float(y[0]), "expected": float(sum(survivors))}


def main():
    torch.set_num_threads(1)  # one core per rank, as torchrun sets for several ranks on a host
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    modes = {"check": check, "backend": backend, "fault": fault, "every": every, "stall": stall, "scale": scale}
    outcome = modes[sys.argv[1]](rank, world)
    _say({"rank": rank, **outcome})
    if sys.argv[1] in ("fault", "stall", "scale"):
        os._exit(0)  # the group is broken and rank 0's store may be gone: no teardown to wait for
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
