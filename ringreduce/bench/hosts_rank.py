"""One rank of the benchmark across emulated hosts (ringreduce/bench/across_hosts.py), joined through
env://. Times every row at every size, trial by trial with the rows in turn, and rank 0 prints the
slowest rank's time per call of each row and trial as one line of JSON per size."""

import json
import statistics
import sys
import time

import torch
import torch.distributed as dist

import ringreduce
from ringreduce.bench.run import auto_decided, auto_ran

# Rows: (name, call). gloo is torch.distributed's own all-reduce on the default (gloo) group.
ROWS = {
    "gloo": lambda t: dist.all_reduce(t),
    "ring": lambda t: ringreduce.all_reduce(t, algorithm="ring"),
    "hierarchical": lambda t: ringreduce.all_reduce(t, algorithm="hierarchical"),
    "auto": lambda t: ringreduce.all_reduce(t, algorithm="auto"),
}
# Untimed calls of auto before its row is timed, while it still explores the size class (each
# exploration round is a few calls of every candidate).
MAX_AUTO_WARMUP_CALLS = 400


def calls_for(nbytes, seconds_per_call, row_seconds, trials):
    return max(1, int(row_seconds / trials / max(seconds_per_call, 1e-6)))


def main():
    options = json.loads(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    rows = [r for r in ROWS if r in options["rows"]]
    for nbytes in options["sizes"]:
        tensor = torch.ones(nbytes // 4)
        expected = float(dist.get_world_size())
        for name in rows:  # warm-up, and the check: every row sums ones
            tensor.fill_(1.0)
            ROWS[name](tensor)
            assert torch.all(tensor == expected), f"{name} at {nbytes} B gave a wrong sum"
        warmup = 0
        while "auto" in rows and warmup < MAX_AUTO_WARMUP_CALLS and not auto_decided(None, "cpu", nbytes):
            ROWS["auto"](tensor)
            warmup += 1
        # One probe call per row sizes the trials (the slowest rank's time decides for every rank).
        probe = torch.zeros(len(rows), dtype=torch.float64)
        for i, name in enumerate(rows):
            begin = time.perf_counter()
            ROWS[name](tensor)
            probe[i] = time.perf_counter() - begin
        dist.all_reduce(probe, op=dist.ReduceOp.MAX)
        iters = [calls_for(nbytes, p.item(), options["row_seconds"], options["trials"]) for p in probe]
        times = torch.zeros(options["trials"], len(rows), dtype=torch.float64)
        for trial in range(options["trials"]):
            for step in range(len(rows)):
                i = (step + trial) % len(rows)  # each trial starts one row later
                dist.barrier()
                begin = time.perf_counter()
                for _ in range(iters[i]):
                    ROWS[rows[i]](tensor)
                times[trial, i] = (time.perf_counter() - begin) / iters[i]
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        if rank == 0:
            record = {"bytes": nbytes, "rows": {}}
            for i, name in enumerate(rows):
                column = times[:, i].tolist()
                record["rows"][name] = {"median_s": statistics.median(column), "fastest_s": min(column),
                                        "calls": iters[i]}
            if "auto" in rows:
                record["rows"]["auto"]["ran"] = auto_ran(None, "cpu", nbytes)
            print(json.dumps(record), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
