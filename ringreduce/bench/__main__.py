"""python -m ringreduce.bench: see ringreduce/bench/run.py."""

from ringreduce.bench.run import main

main()
