"""One rank of the benchmark across emulated hosts (ringreduce/bench/across_hosts.py), joined through
env://. Times every row of the collective at every size, trial by trial with the rows in turn, and rank 0 prints the
slowest rank's time per call of each row and trial, and the CPU time per call of every rank together (user,
system: every thread of the process, gloo's included), as one line of JSON per size."""

import json
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist

import ringreduce
from ringreduce.bench.run import auto_decided, auto_ran

# Rows of each collective: (name, call on a Buffers). gloo is torch.distributed's own collective on
# the default (gloo) group.
ROWS = {
    "all_reduce": {
        "gloo": lambda b: dist.all_reduce(b.whole),
        "ring": lambda b: ringreduce.all_reduce(b.whole, algorithm="ring"),
        "hierarchical": lambda b: ringreduce.all_reduce(b.whole, algorithm="hierarchical"),
        "doubling": lambda b: ringreduce.all_reduce(b.whole, algorithm="doubling"),
        "halving_doubling": lambda b: ringreduce.all_reduce(b.whole, algorithm="halving_doubling"),
        "auto": lambda b: ringreduce.all_reduce(b.whole, algorithm="auto"),
        "bf16": lambda b: ringreduce.all_reduce(b.whole, compress="bf16"),
        "fp16": lambda b: ringreduce.all_reduce(b.whole, compress="fp16"),
        "int8": lambda b: ringreduce.all_reduce(b.whole, compress="int8"),
        # int8 keeping its rounding errors, as error feedback does (the same sum, the same bytes)
        "int8+fb": lambda b: ringreduce.all_reduce(b.whole, compress="int8", residual=b.residual),
    },
    "reduce_scatter": {
        "gloo": lambda b: dist.reduce_scatter_tensor(b.piece, b.whole),
        "ring": lambda b: ringreduce.reduce_scatter_tensor(b.piece, b.whole, algorithm="ring"),
        "hierarchical": lambda b: ringreduce.reduce_scatter_tensor(b.piece, b.whole, algorithm="hierarchical"),
        "bf16": lambda b: ringreduce.reduce_scatter_tensor(b.piece, b.whole, compress="bf16"),
        "fp16": lambda b: ringreduce.reduce_scatter_tensor(b.piece, b.whole, compress="fp16"),
    },
    "all_gather": {
        "gloo": lambda b: dist.all_gather_into_tensor(b.whole, b.piece),
        "ring": lambda b: ringreduce.all_gather_into_tensor(b.whole, b.piece, algorithm="ring"),
        "hierarchical": lambda b: ringreduce.all_gather_into_tensor(b.whole, b.piece, algorithm="hierarchical"),
    },
}


class Buffers:
    """The float32 buffers of one size: `whole` (an all-reduce's tensor, a reduce-scatter's input, an
    all-gather's output), `piece`, this rank's share of it, and `residual`, where an all-reduce with
    error feedback keeps its rounding errors."""

    def __init__(self, nbytes, world):
        numel = nbytes // 4 // world * world
        self.whole = torch.ones(numel)
        self.piece = torch.ones(numel // world)
        self.residual = torch.zeros(numel)

    def check(self, collective, name, call):
        """Runs `call` once on known inputs and checks the result."""
        world, rank = dist.get_world_size(), dist.get_rank()
        self.whole.fill_(1.0)
        self.piece.fill_(float(rank + 1))
        call(self)
        if collective == "all_reduce":
            good = torch.all(self.whole == world)
        elif collective == "reduce_scatter":
            good = torch.all(self.piece == world)
        else:
            by_rank = self.whole.view(world, -1)
            good = torch.equal(by_rank, torch.arange(1.0, world + 1).unsqueeze(1).expand_as(by_rank))
        assert good, f"{collective} {name} at {self.whole.numel() * 4} B gave a wrong result"


# The rows whose values cross hosts rounded, and whose error is measured.
COMPRESSED_ROWS = ("bf16", "fp16", "int8", "int8+fb")
# Elements of a compressed row's result checked against the float64 sum (every rank's inputs are
# gathered for it): enough for the max and RMS to settle, few enough to gather in a second over
# the emulated links. The rounding of an element does not depend on the buffer's size.
ERROR_SAMPLE = 1 << 20


def compression_error(collective, call, buffers):
    """(max, RMS) relative error of a compressed row against the float64 sum, over every rank's
    sample, on random inputs of one sign (no cancellation)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    gen = torch.Generator().manual_seed(rank)
    buffers.whole.copy_(torch.rand(buffers.whole.numel(), generator=gen) + 0.25)
    inputs = buffers.whole.view(world, -1)[:, :ERROR_SAMPLE].clone()  # of an all-reduce, what each chunk starts with
    call(buffers)
    if collective == "all_reduce":
        result, take = buffers.whole.view(world, -1)[:, :ERROR_SAMPLE], slice(None)
    else:  # reduce_scatter: this rank's share
        result, take = buffers.piece[:ERROR_SAMPLE].unsqueeze(0), slice(rank, rank + 1)
    everyone = [torch.empty_like(inputs) for _ in range(world)]
    dist.all_gather(everyone, inputs)
    exact = torch.stack(everyone).double().sum(0)[take]
    relative = (result.double() - exact).abs() / exact
    summary = torch.tensor([relative.max().item(), (relative ** 2).sum().item(), relative.numel()], dtype=torch.float64)
    largest = summary[:1].clone()
    dist.all_reduce(largest, op=dist.ReduceOp.MAX)
    dist.all_reduce(summary)
    return largest.item(), (summary[1] / summary[2]).sqrt().item()


# Untimed calls of auto before its row is timed, while it still explores the size class (each
# exploration round is a few calls of every candidate).
MAX_AUTO_WARMUP_CALLS = 400


def calls_for(nbytes, seconds_per_call, row_seconds, trials):
    return max(1, int(row_seconds / trials / max(seconds_per_call, 1e-6)))


def main():
    options = json.loads(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    calls = ROWS[options["collective"]]
    rows = [r for r in calls if r in options["rows"]]
    for nbytes in options["sizes"]:
        buffers = Buffers(nbytes, dist.get_world_size())
        for name in rows:  # warm-up, and the check
            buffers.check(options["collective"], name, calls[name])
        warmup = 0
        while "auto" in rows and warmup < MAX_AUTO_WARMUP_CALLS and not auto_decided(None, "cpu", nbytes):
            calls["auto"](buffers)
            warmup += 1
        # One probe call per row sizes the trials (the slowest rank's time decides for every rank).
        probe = torch.zeros(len(rows), dtype=torch.float64)
        for i, name in enumerate(rows):
            begin = time.perf_counter()
            calls[name](buffers)
            probe[i] = time.perf_counter() - begin
        dist.all_reduce(probe, op=dist.ReduceOp.MAX)
        iters = [calls_for(nbytes, p.item(), options["row_seconds"], options["trials"]) for p in probe]
        times = torch.zeros(options["trials"], len(rows), dtype=torch.float64)
        cpu = torch.zeros(len(rows), 2, dtype=torch.float64)  # this rank's user and system seconds per call
        for trial in range(options["trials"]):
            for step in range(len(rows)):
                i = (step + trial) % len(rows)  # each trial starts one row later
                dist.barrier()
                begin, cpu_begin = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
                for _ in range(iters[i]):
                    calls[rows[i]](buffers)
                times[trial, i] = (time.perf_counter() - begin) / iters[i]
                cpu_end = resource.getrusage(resource.RUSAGE_SELF)
                used = [cpu_end.ru_utime - cpu_begin.ru_utime, cpu_end.ru_stime - cpu_begin.ru_stime]
                cpu[i] += torch.tensor(used, dtype=torch.float64) / (iters[i] * options["trials"])
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        dist.all_reduce(cpu)
        if rank == 0:
            record = {"bytes": nbytes, "rows": {}}
            for i, name in enumerate(rows):
                column = times[:, i].tolist()
                record["rows"][name] = {"median_s": statistics.median(column), "fastest_s": min(column),
                                        "calls": iters[i], "cpu_s": cpu[i].tolist()}
            if "auto" in rows:
                record["rows"]["auto"]["ran"] = auto_ran(None, "cpu", nbytes)
        for name in (r for r in rows if r in COMPRESSED_ROWS):
            error = compression_error(options["collective"], calls[name], buffers)
            if rank == 0:
                record["rows"][name]["max_error"], record["rows"][name]["rms_error"] = error
        if rank == 0:
            print(json.dumps(record), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
