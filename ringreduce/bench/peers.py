"""Rows for peer libraries that need their own launcher: OpenMPI's MPI_Allreduce through mpi4py.

`make bench-peers` installs OpenMPI and mpi4py; without them the rows are skipped with a note.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

# MPI has no standard 16-bit float types, so those rows are skipped.
MPI_TYPES = {"float32": "float32", "float64": "float64", "int8": "int8", "uint8": "uint8", "int32": "int32",
             "int64": "int64"}
# The whole mpirun sweep must finish in this time, or its rows are dropped.
MPI_RUN_TIMEOUT_S = 600


def mpi_rows(args, sizes):
    """Run the same sweep under mpirun and return its records ([] when OpenMPI is not installed)."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        sys.stderr.write("# OpenMPI rows skipped: mpi4py is not installed (make bench-peers installs it)\n")
        return []
    mpirun = shutil.which("mpirun")
    if mpirun is None or args.dtype not in MPI_TYPES:
        sys.stderr.write(f"# OpenMPI rows skipped: {'no mpirun on PATH' if mpirun is None else 'no MPI type for ' + args.dtype}\n")
        return []
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "mpi.json")
        command = [mpirun, "-np", str(args.world), "--oversubscribe", "--bind-to", "none"]
        if os.geteuid() == 0:
            command.append("--allow-run-as-root")
        command += [sys.executable, "-m", "ringreduce.bench.peers", out, ",".join(map(str, sizes)), args.dtype,
                    args.op, str(args.iters), str(args.warmup), str(args.trials), str(args.check)]
        try:
            subprocess.run(command, check=True, timeout=MPI_RUN_TIMEOUT_S, stdout=subprocess.DEVNULL)
        except (subprocess.SubprocessError, OSError) as error:
            sys.stderr.write(f"# OpenMPI rows skipped: {error}\n")
            return []
        with open(out) as f:
            return json.load(f)


def _mpi_main(out, sizes, dtype_name, op_name, iters, warmup, trials, check):
    """Body of each mpirun rank."""
    import numpy as np
    from mpi4py import MPI

    from ringreduce.bench.inputs import bench_inputs, expected_result
    from ringreduce.bench.options import DTYPES, OPS, parse_args
    from ringreduce.bench.report import record
    from ringreduce.bench.timing import timed_trials

    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    mpi_op = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}.get(op_name)
    if mpi_op is None:  # MPI has no AVG
        mpi_op = MPI.SUM
    dtype = np.dtype(MPI_TYPES[dtype_name])
    args = parse_args(["--iters", str(iters), "--warmup", str(warmup), "--trials", str(trials)])
    records = []
    for size in sizes:
        numel = max(1, size // dtype.itemsize)
        buffer = np.zeros(numel, dtype=dtype)

        def call(buf=buffer):
            comm.Allreduce(MPI.IN_PLACE, buf, op=mpi_op)

        (seconds,) = timed_trials(
            [call], args, comm.Barrier, lambda t: comm.allreduce(t, op=MPI.MAX), lambda n: comm.bcast(n, root=0)
        )
        wrong = -1
        if check and op_name != "avg":
            torch_dtype = DTYPES[dtype_name]
            data = bench_inputs(rank, world, numel, torch_dtype, OPS[op_name]).numpy().copy()
            call(data)
            expected = expected_result(world, numel, torch_dtype, OPS[op_name]).numpy()
            wrong = comm.allreduce(int((data != expected).sum()), op=MPI.SUM)
        records.append(record("OpenMPI", "-", "mpi4py", world, dtype_name, op_name, size, numel, seconds, wrong))
    if rank == 0:
        with open(out, "w") as f:
            json.dump(records, f)


if __name__ == "__main__":
    out, sizes, dtype_name, op_name, iters, warmup, trials, check = sys.argv[1:9]
    _mpi_main(out, [int(s) for s in sizes.split(",")], dtype_name, op_name, int(iters), int(warmup), int(trials),
              int(check))
