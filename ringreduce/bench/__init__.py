"""The nccl-tests-style benchmark, run as ``python -m ringreduce.bench``.

- ``options``: the command line, dtypes and ops;
- ``inputs``: data whose result has a closed form (the #wrong column);
- ``timing``: rows timed side by side in interleaved trials;
- ``run``: the rows, the ranks and the main program;
- ``report``: records, the table and the plot;
- ``peers``: rows from other libraries (OpenMPI through mpi4py).
"""
