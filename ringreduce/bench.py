"""nccl-tests-style all-reduce benchmark: ringreduce's ring and central reducer beside torch.distributed.

    python -m ringreduce.bench                    # 2 local CPU ranks, the default sweep
    python -m ringreduce.bench --world 4 -b 4K -e 64M -f 4 --json bench.json --plot bench.png
    torchrun --nproc_per_node 2 -m ringreduce.bench

Every row of one run shares the same processes, so the ratios between rows are measured side by
side. time_us is the slowest rank's mean time per call; algbw = bytes / time and
busbw = algbw * 2(n-1)/n, as in nccl-tests. #wrong counts wrong elements in a separate, untimed
pass that checks the result against its closed form.
"""

import argparse
import contextlib
import functools
import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import ringreduce
from ringreduce import _bench_report as report
from ringreduce import _bench_peers as peers

R = dist.ReduceOp
OPS = {"sum": R.SUM, "avg": R.AVG, "min": R.MIN, "max": R.MAX, "prod": R.PRODUCT}
DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int32": torch.int32,
    "int64": torch.int64,
}
DEFAULT_SIZES = "4K,64K,1M,16M,64M"
# With --iters 0 each (row, size) is timed for about this long in all, within these bounds on the
# calls per trial: long enough to average out the scheduler on a shared 2-core machine, short
# enough that the default sweep stays under two minutes.
TARGET_SECONDS_PER_ROW = 0.5
MIN_ITERS, MAX_ITERS = 3, 2000
# Trials per row; the table reports the median trial.
DEFAULT_TRIALS = 5
# Pause before each row's trial. gloo's traffic leaves work behind in the kernel (TCP on loopback)
# for tens of milliseconds: 4 KiB shm calls timed right after 200 gloo calls took 10 us instead of
# 3 us, and 2.7 us again after a pause. Without it, rows that follow gloo rows pay for them.
ROW_SETTLE_SECONDS = 0.05


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def size_sweep(args) -> list:
    if args.minbytes is not None or args.maxbytes is not None:
        low = parse_size(args.minbytes or "4K")
        high = parse_size(args.maxbytes or "64M")
        if args.stepfactor < 2:
            raise SystemExit("-f/--stepfactor must be at least 2")
        sizes = []
        while low <= high:
            sizes.append(low)
            low *= args.stepfactor
        return sizes
    return [parse_size(s) for s in args.sizes.split(",") if s.strip()]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ringreduce.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--world", type=int, default=2, help="local ranks to launch (ignored under torchrun)")
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="comma-separated sizes in bytes, e.g. 4K,1M,64M")
    parser.add_argument("-b", "--minbytes", help="smallest size (with -e and -f, like nccl-tests)")
    parser.add_argument("-e", "--maxbytes", help="largest size")
    parser.add_argument("-f", "--stepfactor", type=int, default=4, help="size multiplier between rows")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--op", choices=sorted(OPS), default="sum")
    parser.add_argument("--iters", type=int, default=0, help="timed calls per row (0: about 0.5 s per row)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls before timing")
    parser.add_argument("--trials", type=int, default=DEFAULT_TRIALS, help="timed trials per row (median reported)")
    parser.add_argument("--check", type=int, choices=(0, 1), default=1, help="run the untimed correctness pass")
    parser.add_argument("--algorithms", default="ring,central")
    parser.add_argument("--transports", default=None, help="CPU transports to time (default: all in this build)")
    parser.add_argument("--no-torch", action="store_true", help="skip the torch.distributed rows")
    parser.add_argument("--unchecked", action="store_true",
                        help="add ring rows that skip the cross-rank check of each call (RINGREDUCE_CHECK_CALLS=0)")
    parser.add_argument("--lanes", default="", metavar="LIST",
                        help="add ring rows run with RINGREDUCE_LANES set to each count, e.g. 1,2 (GPU default 2, CPU 1)")
    parser.add_argument("--no-mpi", action="store_true", help="skip the OpenMPI rows even when mpi4py is present")
    parser.add_argument("--gpu", choices=("auto", "off", "only"), default="auto",
                        help="GPU rows: NCCL across processes with a GPU each, else virtual ranks on one GPU")
    parser.add_argument("--json", metavar="PATH", help="write the records as a JSON list")
    parser.add_argument("--plot", metavar="PATH", help="draw busbw against size (PNG)")
    parser.add_argument("--progress", type=int, choices=(0, 1), default=1, help="progress bar on stderr")
    return parser.parse_args(argv)


# ---- data with a closed-form result -------------------------------------------------------------


def bench_inputs(rank, world, numel, dtype, op):
    """Rank `rank`'s input; every value and every partial result is exact in `dtype`."""
    i = torch.arange(numel, dtype=torch.int64)
    if op == R.PRODUCT:
        values = torch.where((i + rank) % 5 == 0, 2, torch.where((i + rank) % 3 == 0, -1, 1))
    elif op in (R.MIN, R.MAX):
        values = (i * 7 + rank * 13) % 100 - 50
    elif op == R.AVG:
        return ((i % 5).double() + (rank - (world - 1) / 2)).to(dtype)
    else:
        values = i % 3 + (i + rank) % 2
    return values.to(dtype)


def expected_result(world, numel, dtype, op):
    wide = [bench_inputs(r, world, numel, dtype, op).double() for r in range(world)]
    if op in (R.SUM, R.AVG):
        out = sum(wide)
        out = out / world if op == R.AVG else out
    elif op == R.PRODUCT:
        out = torch.stack(wide).prod(0)
    elif op == R.MIN:
        out = torch.stack(wide).min(0).values
    else:
        out = torch.stack(wide).max(0).values
    return out.to(dtype)


# ---- timing ---------------------------------------------------------------------------------------


def _slowest(seconds: float) -> float:
    value = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(value, op=R.MAX)
    return value.item()


def _agree(iters: int) -> int:
    """Rank 0's choice, so that every rank runs the same number of calls."""
    value = torch.tensor([iters], dtype=torch.int64)
    dist.broadcast(value, src=0)
    return int(value.item())


def iterations_for(one_call_seconds: float, args) -> int:
    """Calls per trial: --iters, or enough to fill the row's time budget split over the trials."""
    if args.iters > 0:
        return args.iters
    budget = TARGET_SECONDS_PER_ROW / args.trials
    return max(MIN_ITERS, min(MAX_ITERS, int(budget / max(one_call_seconds, 1e-7))))


def _nothing():
    pass


def timed_trials(calls, args, barrier, slowest, agree, sync=_nothing, settings=None) -> list:
    """Median seconds per call of each of `calls`, over args.trials trials run round-robin.

    Interleaving the rows trial by trial means a burst of load from elsewhere on the machine hits
    every row alike instead of one row, so the ratios between rows hold up; the median drops bursts.
    `sync` ends a trial (torch.cuda.synchronize for GPU rows, whose calls only queue work);
    `settings[i]`, a context manager factory, is entered around row i's calls.
    """
    settings = settings or [contextlib.nullcontext] * len(calls)
    iters = []
    for call, setting in zip(calls, settings):
        with setting():
            for _ in range(args.warmup):
                call()
            sync()
            barrier()
            start = time.perf_counter()
            call()
            sync()
        iters.append(agree(iterations_for(slowest(time.perf_counter() - start), args)))
    samples = [[] for _ in calls]
    for _ in range(args.trials):
        for call, setting, n, row in zip(calls, settings, iters, samples):
            time.sleep(ROW_SETTLE_SECONDS)
            with setting():
                barrier()
                start = time.perf_counter()
                for _ in range(n):
                    call()
                sync()
                elapsed = time.perf_counter() - start
            row.append(slowest(elapsed / n))
    return [sorted(row)[len(row) // 2] for row in samples]


@contextlib.contextmanager
def environment(name, value):
    """Rows run with one engine setting changed, to show what it is worth beside the default rows."""
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


# Transports that run one lane whatever RINGREDUCE_LANES asks (shm matches slots in posting order):
# --lanes rows would only repeat their default row.
ONE_LANE_TRANSPORTS = ("shm",)


def setting_variants(args, transport=None):
    """(algorithm label, setting) of the extra ring rows that --unchecked and --lanes ask for."""
    lanes = [n for n in args.lanes.split(",") if n] if transport not in ONE_LANE_TRANSPORTS else []
    variants = [(f"ring lanes={n}", functools.partial(environment, "RINGREDUCE_LANES", n)) for n in lanes]
    if args.unchecked:
        variants.append(("ring unchecked", functools.partial(environment, "RINGREDUCE_CHECK_CALLS", "0")))
    return variants


def count_wrong(call, rank, world, numel, dtype, op, device="cpu") -> int:
    tensor = bench_inputs(rank, world, numel, dtype, op).to(device)
    call(tensor)
    total = torch.tensor([int((tensor.cpu() != expected_result(world, numel, dtype, op)).sum())], dtype=torch.int64)
    dist.all_reduce(total)
    return int(total.item())


def gpus_for_processes(args, world) -> bool:
    """Whether every rank can have a GPU of its own (then the NCCL rows run across processes)."""
    return args.gpu != "off" and torch.cuda.is_available() and torch.cuda.device_count() >= world


def process_rows(args, rank, world):
    """(impl, algorithm, transport, device, fn(tensor, op), setting) for every row the ranks run together."""
    algorithms = [a for a in args.algorithms.split(",") if a]
    rows = []
    if args.gpu != "only":
        available = [t for t in ringreduce.build_info()["transports"] if t not in ("local", "nccl")]
        for transport in args.transports.split(",") if args.transports else available:
            for algorithm in algorithms:
                rows.append(("ringreduce", algorithm, transport, "cpu",
                             lambda t, op, a=algorithm, tr=transport: ringreduce.all_reduce(t, op, algorithm=a, transport=tr),
                             contextlib.nullcontext))
            for label, setting in setting_variants(args, transport):
                rows.append(("ringreduce", label, transport, "cpu",
                             lambda t, op, tr=transport: ringreduce.all_reduce(t, op, transport=tr), setting))
        if not args.no_torch:
            rows.append(("torch.distributed", "-", dist.get_backend(), "cpu", lambda t, op: dist.all_reduce(t, op),
                         contextlib.nullcontext))
    if gpus_for_processes(args, world):
        # One GPU per rank: ringreduce over NCCL beside torch.distributed's NCCL backend.
        torch.cuda.set_device(rank)
        nccl_group = dist.new_group(backend="nccl")
        for algorithm in algorithms:
            rows.append(("ringreduce", algorithm, "nccl", f"cuda:{rank}",
                         lambda t, op, a=algorithm: ringreduce.all_reduce(t, op, algorithm=a, transport="nccl"),
                         contextlib.nullcontext))
        for label, setting in setting_variants(args):
            rows.append(("ringreduce", label, "nccl", f"cuda:{rank}",
                         lambda t, op: ringreduce.all_reduce(t, op, transport="nccl"), setting))
        rows.append(("torch.distributed", "-", "nccl", f"cuda:{rank}",
                     lambda t, op: dist.all_reduce(t, op, group=nccl_group), contextlib.nullcontext))
    return rows


def run_sweep(args, rank, world):
    dtype, op = DTYPES[args.dtype], OPS[args.op]
    rows = process_rows(args, rank, world)
    sizes = size_sweep(args) if rows else []
    progress = report.Progress(len(sizes), enabled=args.progress and rank == 0)
    sync = torch.cuda.synchronize if any(row[3] != "cpu" for row in rows) else _nothing
    records = []
    for size in sizes:
        progress.step(f"{report.human_bytes(size)}: {len(rows)} rows x {args.trials} trials")
        numel = max(1, size // torch.empty((), dtype=dtype).element_size())
        tensors = [torch.zeros(numel, dtype=dtype, device=row[3]) for row in rows]
        calls = [lambda fn=row[4], t=t: fn(t, op) for row, t in zip(rows, tensors)]
        seconds = timed_trials(calls, args, dist.barrier, _slowest, _agree, sync, [row[5] for row in rows])
        for (impl, algorithm, transport, device, fn, setting), row_seconds in zip(rows, seconds):
            with setting():
                wrong = count_wrong(lambda t, fn=fn: fn(t, op), rank, world, numel, dtype, op, device) if args.check else -1
            records.append(
                report.record(impl, algorithm, transport, world, args.dtype, args.op, size, numel, row_seconds, wrong)
            )
    progress.done()
    return records


def virtual_gpu_rows(args, world):
    """Ring and central with `world` virtual ranks on one GPU (threads, streams of their own), timed here.

    NCCL refuses two ranks on one GPU, so on a single-GPU machine this is how the GPU ring runs.
    """
    dtype, op = DTYPES[args.dtype], OPS[args.op]
    rows = [(a, a, contextlib.nullcontext) for a in args.algorithms.split(",") if a]
    rows += [(label, "ring", setting) for label, setting in setting_variants(args)]
    local = ringreduce.LocalWorld(world, device="cuda")
    records = []
    for size in size_sweep(args):
        numel = max(1, size // torch.empty((), dtype=dtype).element_size())
        tensor_sets = [[torch.zeros(numel, dtype=dtype, device="cuda") for _ in range(world)] for _ in rows]
        calls = [lambda a=row[1], ts=ts: local.all_reduce(ts, op, algorithm=a) for row, ts in zip(rows, tensor_sets)]
        seconds = timed_trials(calls, args, _nothing, lambda t: t, lambda n: n, torch.cuda.synchronize,
                               [row[2] for row in rows])
        for (label, algorithm, setting), row_seconds in zip(rows, seconds):
            wrong = -1
            if args.check:
                inputs = [bench_inputs(r, world, numel, dtype, op).cuda() for r in range(world)]
                with setting():
                    local.all_reduce(inputs, op, algorithm=algorithm)
                expected = expected_result(world, numel, dtype, op)
                wrong = sum(int((t.cpu() != expected).sum()) for t in inputs)
            records.append(report.record("ringreduce", label, "local-cuda", world, args.dtype, args.op, size, numel,
                                         row_seconds, wrong))
    return records


def memcpy_roof(nbytes: int, repeats: int = 5) -> float:
    """One thread's memcpy bandwidth in GB/s (bytes copied per second) at `nbytes`."""
    import numpy as np

    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return nbytes / best / 1e9


# ---- launching ----------------------------------------------------------------------------------


def bench_rank(rank, world, args):
    """Body of every rank. Returns the records on rank 0, None elsewhere."""
    torch.set_num_threads(1)  # one core per rank, as the transports assume
    roof = None
    if rank == 0:
        roof = memcpy_roof(max(size_sweep(args)))
    dist.barrier()
    records = run_sweep(args, rank, world)
    if rank == 0 and args.gpu != "off" and torch.cuda.is_available() and not gpus_for_processes(args, world):
        records += virtual_gpu_rows(args, world)
    dist.barrier()
    ringreduce.destroy()
    return (records, roof) if rank == 0 else None


def _spawned(rank, world, store_path, args, out_path):
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    try:
        result = bench_rank(rank, world, args)
        if result is not None:
            with open(out_path, "w") as out:
                json.dump(result, out)
    finally:
        dist.destroy_process_group()


def launch(args):
    """Records and the memcpy roof, from torchrun's ranks or from ranks this process spawns."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")
        result = bench_rank(dist.get_rank(), dist.get_world_size(), args)
        dist.destroy_process_group()
        return result
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "records.json")
        mp.start_processes(
            _spawned, args=(args.world, os.path.join(tmp, "store"), args, out_path), nprocs=args.world, start_method="spawn"
        )
        with open(out_path) as f:
            records, roof = json.load(f)
    return records, roof


def main(argv=None):
    args = parse_args(argv)
    if args.world < 1:
        raise SystemExit("--world must be at least 1")
    result = launch(args)
    if result is None:  # a non-zero torchrun rank
        return
    records, roof = result
    if not records:
        raise SystemExit("no rows to time: --gpu only needs a CUDA GPU, and the CPU rows were switched off")
    if not args.no_mpi and args.gpu != "only" and "RANK" not in os.environ:
        records += peers.mpi_rows(args, size_sweep(args))
    report.print_table(records, roof, sys.stdout)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
    if args.plot:
        report.plot(records, args.plot)
    if any(r["wrong"] > 0 for r in records):
        raise SystemExit("some rows returned wrong results (#wrong > 0)")


if __name__ == "__main__":
    main()
