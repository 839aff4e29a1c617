"""Body of each process mpirun launches for the benchmark (see peers.py): rank and world size from
MPI, then the same rank as a spawned one, which adds the OpenMPI row as MPI is initialised."""

import json
import sys

from mpi4py import MPI

from ringreduce.bench import options, run

argv, store_path, out_path = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
world = MPI.COMM_WORLD
run.spawned_rank(world.Get_rank(), world.Get_size(), store_path, options.parse_args(argv), out_path)
