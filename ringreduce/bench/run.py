"""The benchmark's rows and ranks: ringreduce's ring and central reducer beside torch.distributed.

    python -m ringreduce.bench                    # 2 local CPU ranks, the default sweep
    python -m ringreduce.bench --world 4 -b 4K -e 64M -f 4 --json bench.json --plot bench.png
    torchrun --nproc_per_node 2 -m ringreduce.bench

Every row of one run shares the same processes, so the ratios between rows are measured side by
side. time_us is the slowest rank's mean time per call in the median trial, fastest_us in the
fastest trial; algbw = bytes / time_us and
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
from ringreduce import _groups
from ringreduce.bench import across_hosts, peers, report
from ringreduce.bench.inputs import bench_inputs, collective_buffers, collective_expected, expected_result
from ringreduce.bench.options import DTYPES, HOST_ONLY_ALGORITHMS, NATIVE_ALGORITHM, OPS, parse_args, size_sweep
from ringreduce.bench.timing import always, nothing, timed_trials

R = dist.ReduceOp


# Rows whose traffic goes over TCP on loopback (torch's gloo rows, ringreduce's pg transport): a
# pause follows each of their trials (timing.TCP_SETTLE_SECONDS).
TCP_TRANSPORTS = ("gloo", "pg")


def _slowest(seconds: list) -> list:
    """The group's slowest of each of this rank's times."""
    value = torch.tensor(seconds, dtype=torch.float64)
    dist.all_reduce(value, op=R.MAX)
    return value.tolist()


def _agree(iters: int) -> int:
    """Rank 0's choice, so that every rank runs the same number of calls."""
    value = torch.tensor([iters], dtype=torch.int64)
    dist.broadcast(value, src=0)
    return int(value.item())


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


def collective_call(lib, collective, **kwargs):
    """fn(input, output, op) running `collective` through `lib` (ringreduce or torch.distributed)."""
    if collective == "all_reduce":
        return lambda inp, out, op: lib.all_reduce(inp, op, **kwargs)
    if collective == "reduce_scatter":
        return lambda inp, out, op: lib.reduce_scatter_tensor(out, inp, op, **kwargs)
    if collective == "all_gather":
        return lambda inp, out, op: lib.all_gather_into_tensor(out, inp, **kwargs)
    if collective == "reduce":
        return lambda inp, out, op: lib.reduce(inp, 0, op, **kwargs)
    return lambda inp, out, op: lib.broadcast(inp, src=0, **kwargs)


def numel_for(collective, size, dtype, world) -> int:
    """Elements of the whole buffer at `size` bytes: a multiple of the world size but for all-reduce."""
    numel = max(1, size // torch.empty((), dtype=dtype).element_size())
    return numel if collective == "all_reduce" else max(world, numel // world * world)


def count_wrong(fn, collective, rank, world, numel, dtype, op, device="cpu") -> int:
    inp, out = collective_buffers(collective, rank, world, numel, dtype, op, device)
    fn(inp, out, op)
    result = (out if out is not None else inp).cpu()
    expected = collective_expected(collective, rank, world, numel, dtype, op)
    wrong = 0 if expected is None else int((result != expected).sum())
    total = torch.tensor([wrong], dtype=torch.int64)
    dist.all_reduce(total)
    return int(total.item())


def auto_communicator(transport, device):
    """The communicator the auto row's calls run on."""
    return _groups.communicator(None, torch.empty(0, device=device), transport, "auto")


def auto_ran(transport, device, nbytes):
    """What auto runs now for `nbytes` on this transport (None while it has not decided): read after
    the row's trials, so it is what the row ran once learning was over."""
    return auto_communicator(transport, device).auto_choices().get(1 << (nbytes.bit_length() - 1))


def is_auto_row(row, args) -> bool:
    """Whether a row (impl, algorithm, ...) is ringreduce's all-reduce with algorithm="auto"."""
    return row[0] == "ringreduce" and row[1] == "auto" and args.collective == "all_reduce"


def auto_decided(transport, device, nbytes):
    """Whether auto's row is ready to time: its first exploration of `nbytes`'s size class is over,
    or it does not learn there. Like the warm-up calls, the learning precedes the timed calls;
    what it costs is measured apart (benchmarks/RESULTS.md)."""
    learns = auto_communicator(transport, device).auto_learns(nbytes)
    return not learns or auto_ran(transport, device, nbytes) is not None


def gpus_for_processes(args, world) -> bool:
    """Whether every rank can have a GPU of its own (then the NCCL rows run across processes)."""
    return args.gpu != "off" and torch.cuda.is_available() and torch.cuda.device_count() >= world


def device_algorithms(algorithms):
    return [a for a in algorithms if a not in HOST_ONLY_ALGORITHMS]


def process_rows(args, rank, world):
    """(impl, algorithm, transport, device, fn(input, output, op), setting) for every row the ranks run together."""
    collective = args.collective
    algorithms = ([a for a in args.algorithms.split(",") if a] if collective == "all_reduce"
                  else [NATIVE_ALGORITHM[collective]])

    def ours(transport, algorithm=None):
        extra = {"algorithm": algorithm} if algorithm else {}
        return collective_call(ringreduce, collective, transport=transport, **extra)

    rows = []
    if args.gpu != "only":
        # CPU transports between processes; the simulated device ("sim") has no timing worth measuring.
        available = [t for t in ringreduce.build_info()["transports"] if t not in ("local", "nccl", "sim")]
        for transport in args.transports.split(",") if args.transports else available:
            for algorithm in algorithms:
                rows.append(("ringreduce", algorithm, transport, "cpu",
                             ours(transport, algorithm if collective == "all_reduce" else None),
                             contextlib.nullcontext))
            for label, setting in setting_variants(args, transport):
                rows.append(("ringreduce", label, transport, "cpu", ours(transport), setting))
        if not args.no_torch:
            # torch.distributed's own call on a group of the ringreduce backend (all-reduce: auto).
            backend_group = dist.new_group(backend="ringreduce")
            rows.append(("ringreduce", "backend", "torch.distributed", "cpu",
                         collective_call(dist, collective, group=backend_group), contextlib.nullcontext))
            rows.append(("torch.distributed", "-", dist.get_backend(), "cpu", collective_call(dist, collective),
                         contextlib.nullcontext))
    mpi = peers.mpi_row(args) if collective == "all_reduce" and wants_mpi_row(args) else None
    if mpi is not None:
        rows.append(mpi)
    if gpus_for_processes(args, world):
        # One GPU per rank: ringreduce over NCCL beside torch.distributed's NCCL backend.
        torch.cuda.set_device(rank)
        nccl_group = dist.new_group(backend="nccl")
        for algorithm in device_algorithms(algorithms):
            rows.append(("ringreduce", algorithm, "nccl", f"cuda:{rank}",
                         ours("nccl", algorithm if collective == "all_reduce" else None), contextlib.nullcontext))
        for label, setting in setting_variants(args):
            rows.append(("ringreduce", label, "nccl", f"cuda:{rank}", ours("nccl"), setting))
        rows.append(("torch.distributed", "-", "nccl", f"cuda:{rank}",
                     collective_call(dist, collective, group=nccl_group), contextlib.nullcontext))
    return rows


def run_sweep(args, rank, world):
    dtype, op = DTYPES[args.dtype], OPS[args.op]
    rows = process_rows(args, rank, world)
    sizes = size_sweep(args) if rows else []
    progress = report.Progress(len(sizes), enabled=args.progress and rank == 0)
    sync = torch.cuda.synchronize if any(row[3] != "cpu" for row in rows) else nothing
    records = []
    for size in sizes:
        progress.step(f"{report.human_bytes(size)}: {len(rows)} rows x {args.trials} trials")
        numel = numel_for(args.collective, size, dtype, world)
        buffers = [collective_buffers(args.collective, rank, world, numel, dtype, op, row[3]) for row in rows]
        calls = [lambda fn=row[4], b=b: fn(b[0], b[1], op) for row, b in zip(rows, buffers)]
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        ready = [functools.partial(auto_decided, row[2], row[3], nbytes) if is_auto_row(row, args) else always
                 for row in rows]
        times = timed_trials(calls, args, dist.barrier, _slowest, _agree, sync, [row[5] for row in rows],
                             [row[2] in TCP_TRANSPORTS for row in rows], ready)
        for (impl, algorithm, transport, device, fn, setting), row_time in zip(rows, times):
            with setting():
                wrong = count_wrong(fn, args.collective, rank, world, numel, dtype, op, device) if args.check else -1
            records.append(report.record(impl, algorithm, transport, world, args.dtype, args.op, nbytes, numel,
                                         row_time, wrong, args.collective))
            if is_auto_row((impl, algorithm), args):
                records[-1]["auto_ran"] = auto_ran(transport, device, nbytes)
    progress.done()
    return records


def virtual_gpu_rows(args, world):
    """Ring and central with `world` virtual ranks on one GPU (threads, streams of their own), timed here.

    NCCL refuses two ranks on one GPU, so on a single-GPU machine this is how the GPU ring runs.
    """
    dtype, op = DTYPES[args.dtype], OPS[args.op]
    rows = [(a, a, contextlib.nullcontext) for a in device_algorithms(args.algorithms.split(",")) if a]
    rows += [(label, "ring", setting) for label, setting in setting_variants(args)]
    local = ringreduce.LocalWorld(world, device="cuda")
    records = []
    for size in size_sweep(args):
        numel = max(1, size // torch.empty((), dtype=dtype).element_size())
        tensor_sets = [[torch.zeros(numel, dtype=dtype, device="cuda") for _ in range(world)] for _ in rows]
        calls = [lambda a=row[1], ts=ts: local.all_reduce(ts, op, algorithm=a) for row, ts in zip(rows, tensor_sets)]
        times = timed_trials(calls, args, nothing, lambda t: t, lambda n: n, torch.cuda.synchronize,
                             [row[2] for row in rows])
        for (label, algorithm, setting), row_time in zip(rows, times):
            wrong = -1
            if args.check:
                inputs = [bench_inputs(r, world, numel, dtype, op).cuda() for r in range(world)]
                with setting():
                    local.all_reduce(inputs, op, algorithm=algorithm)
                expected = expected_result(world, numel, dtype, op)
                wrong = sum(int((t.cpu() != expected).sum()) for t in inputs)
            records.append(report.record("ringreduce", label, "local-cuda", world, args.dtype, args.op, size, numel,
                                         row_time, wrong))
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


def for_collective(args, collective):
    """The options of one collective's sweep: `args` with args.collective set."""
    return argparse.Namespace(**{**vars(args), "collective": collective})


def bench_rank(rank, world, args):
    """Body of every rank. Returns the records on rank 0, None elsewhere."""
    torch.set_num_threads(1)  # one core per rank, as the transports assume
    roof = None
    if rank == 0:
        roof = memcpy_roof(max(size_sweep(args)))
    dist.barrier()
    records = []
    for collective in args.collectives:  # in turn, by the same ranks: one start-up for all
        records += run_sweep(for_collective(args, collective), rank, world)
    if (rank == 0 and "all_reduce" in args.collectives and args.gpu != "off" and torch.cuda.is_available()
            and not gpus_for_processes(args, world)):
        records += virtual_gpu_rows(args, world)
    dist.barrier()
    ringreduce.destroy()
    return (records, roof) if rank == 0 else None


def spawned_rank(rank, world, store_path, args, out_path):
    """Body of a rank this process launched (spawned, or an MPI process of mpirun's)."""
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    try:
        result = bench_rank(rank, world, args)
        if result is not None:
            with open(out_path, "w") as out:
                json.dump(result, out)
    finally:
        dist.destroy_process_group()


def wants_mpi_row(args) -> bool:
    return not args.no_mpi and "all_reduce" in args.collectives and args.gpu != "only"


def launch(args, argv):
    """Records and the memcpy roof, from torchrun's ranks or from ranks this process launches:
    mpirun's when the OpenMPI row can be timed, else spawned ones."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")
        result = bench_rank(dist.get_rank(), dist.get_world_size(), args)
        dist.destroy_process_group()
        return result
    mpirun = peers.mpirun_command(args) if wants_mpi_row(args) else None
    with tempfile.TemporaryDirectory() as tmp:
        store_path, out_path = os.path.join(tmp, "store"), os.path.join(tmp, "records.json")
        if mpirun is not None:
            peers.run_under_mpirun(mpirun, argv, store_path, out_path)
        else:
            mp.start_processes(spawned_rank, args=(args.world, store_path, args, out_path), nprocs=args.world,
                               start_method="spawn")
        with open(out_path) as f:
            records, roof = json.load(f)
    return records, roof


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.hosts:
        if len(args.collectives) > 1:
            raise SystemExit(f"--hosts times one collective per run; --collective names {len(args.collectives)}")
        across_hosts.main(for_collective(args, args.collectives[0]), size_sweep(args))
        return
    if args.world < 1:
        raise SystemExit("--world must be at least 1")
    result = launch(args, argv)
    if result is None:  # a non-zero torchrun rank
        return
    records, roof = result
    if not records:
        raise SystemExit("no rows to time: --gpu only needs a CUDA GPU, and the CPU rows were switched off")
    for index, collective in enumerate(args.collectives):
        sys.stdout.write("\n" if index else "")  # a blank line between the collectives' tables
        report.print_table([r for r in records if r["collective"] == collective], roof, sys.stdout)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
    if args.plot:
        report.plot(records, args.plot)
    if any(r["wrong"] > 0 for r in records):
        raise SystemExit("some rows returned wrong results (#wrong > 0)")
