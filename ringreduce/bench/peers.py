"""The OpenMPI row: MPI_Allreduce through mpi4py, timed in the benchmark's own processes.

When mpi4py and mpirun are present, mpirun launches the benchmark's ranks (one MPI process each),
so the OpenMPI row runs in the same processes as ringreduce's rows and its trials interleave with
theirs: the machine's load and the ranks' places on the cores are the same for both. Timed as a
separate mpirun job after ringreduce's, the two sides of the ratio were measured seconds apart;
on this shared 2-core machine a 2-rank 4 KiB call moves between about 2.4 and 5 us from one launch
to the next, so that ratio moved by 2x between runs.

`make bench-peers` installs OpenMPI and mpi4py; without them the row is left out with a note.
"""

import contextlib
import json
import os
import shutil
import subprocess
import sys

# MPI has no standard 16-bit float types and no AVG, so those rows are left out.
MPI_DTYPES = ("float32", "float64", "int8", "uint8", "int32", "int64")
MPI_OPS = {"sum": "SUM", "prod": "PROD", "min": "MIN", "max": "MAX"}  # the bench's op names -> mpi4py's

def mpirun_command(args):
    """The mpirun command line that launches args.world ranks, or None (and a note why) when the
    OpenMPI row cannot be timed."""
    why = None
    if args.dtype not in MPI_DTYPES or args.op not in MPI_OPS:
        why = f"MPI has no {args.dtype if args.dtype not in MPI_DTYPES else args.op.upper()}"
    else:
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            why = "mpi4py is not installed (make bench-peers installs it)"
    mpirun = shutil.which("mpirun")
    if why is None and mpirun is None:
        why = "no mpirun on PATH (make bench-peers installs OpenMPI)"
    if why is not None:
        sys.stderr.write(f"# OpenMPI row left out: {why}\n")
        return None
    # --bind-to none: the ranks float over the cores, as the spawned ones do.
    command = [mpirun, "-np", str(args.world), "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        command.append("--allow-run-as-root")
    return command


def run_under_mpirun(command, argv, store_path, out_path):
    """Runs the benchmark's ranks as MPI processes; rank 0 writes its result to `out_path`."""
    done = subprocess.run(command + [sys.executable, "-m", "ringreduce.bench.mpi_rank", json.dumps(argv), store_path,
                                     out_path])
    if done.returncode != 0:
        raise SystemExit(f"the benchmark's ranks under mpirun failed (exit status {done.returncode}; their errors are "
                         "above); --no-mpi runs them without OpenMPI")


def mpi_row(args):
    """The OpenMPI row (as run.process_rows makes its rows), or None outside mpirun's processes."""
    MPI = sys.modules.get("mpi4py.MPI")  # imported, and MPI initialised, only by mpi_rank.py
    if MPI is None or not MPI.Is_initialized():
        return None
    mpi_op = getattr(MPI, MPI_OPS[args.op])
    comm = MPI.COMM_WORLD
    last = [None, None]  # the tensor of the previous call and its NumPy view: one view per buffer

    def all_reduce(inp, out, op):
        if inp is not last[0]:
            last[:] = [inp, inp.numpy()]
        comm.Allreduce(MPI.IN_PLACE, last[1], op=mpi_op)

    return ("OpenMPI", "-", "mpi4py", "cpu", all_reduce, contextlib.nullcontext)

