"""python -m ringreduce.tune: measure where each all-reduce algorithm wins on this machine, and
write the table that algorithm="auto" reads.

    python -m ringreduce.tune                       # shm at 2 and 4 ranks, local at 2 and 4
    python -m ringreduce.tune --worlds 2,8 -o tuning.json
    torchrun --nproc_per_node 4 -m ringreduce.tune  # the launcher's world (and transport choice)

Ring, central and one-shot are timed side by side at each size (the benchmark's timing: rows
interleaved trial by trial, the median trial), and each size goes to the fastest. The table is
written to ~/.cache/ringreduce/tuning.json unless -o says otherwise; ringreduce reads it on import
(RINGREDUCE_TUNING_FILE names another). Every rank of a job must read the same table.
"""

import argparse
import datetime
import json
import os
import platform
import sys

import torch

import ringreduce
from ringreduce import tuning
from ringreduce.bench import options, run, timing

CANDIDATES = ("ring", "central", "one_shot")
# Sizes from 4 KiB to 64 MiB, doubling: fine enough to place a crossover within a factor of 2.
DEFAULT_SIZES = ("4K", "64M", 2)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ringreduce.tune", description=__doc__.split("\n")[0])
    parser.add_argument("--worlds", default="2,4", help="world sizes to measure (ignored under torchrun)")
    parser.add_argument("--transports", default="shm,local", help="transports to measure: shm, pg and local")
    parser.add_argument("-b", "--minbytes", default=DEFAULT_SIZES[0])
    parser.add_argument("-e", "--maxbytes", default=DEFAULT_SIZES[1])
    parser.add_argument("-f", "--stepfactor", type=int, default=DEFAULT_SIZES[2])
    parser.add_argument("--trials", type=options.at_least(1), default=options.DEFAULT_TRIALS)
    parser.add_argument("--iters", type=options.at_least(0), default=0, help="calls per trial (0: about 0.5 s per row)")
    parser.add_argument("-o", "--output", default=None, help=f"where to write the table (default {tuning.default_path()})")
    return parser.parse_args(argv)


def bench_argv(args, world, transports):
    """The benchmark's command line for one world size: the candidates only, no peers, no GPU."""
    return ["--world", str(world), "-b", args.minbytes, "-e", args.maxbytes, "-f", str(args.stepfactor), "--trials",
            str(args.trials), "--iters", str(args.iters), "--algorithms", ",".join(CANDIDATES), "--transports",
            transports, "--no-torch", "--no-mpi", "--gpu", "off", "--progress", "0"]


def local_records(bargs, world):
    """Records of the candidates on `world` local ranks (threads of this process)."""
    local = ringreduce.LocalWorld(world)
    records = []
    for size in options.size_sweep(bargs):
        numel = max(1, size // 4)
        tensor_sets = [[torch.ones(numel) for _ in range(world)] for _ in CANDIDATES]
        calls = [lambda a=a, ts=ts: local.all_reduce(ts, algorithm=a) for a, ts in zip(CANDIDATES, tensor_sets)]
        times = timing.timed_trials(calls, bargs, timing.nothing, lambda t: t, lambda n: n)
        records += [{"transport": "local", "world": world, "bytes": numel * 4, "algorithm": a, "time_us": t.median * 1e6}
                    for a, t in zip(CANDIDATES, times)]
    return records


# Going up in size, the candidate chosen for the smaller sizes keeps the next size while it is
# within this factor of the fastest there. Rows on this shared 2-core machine move by 10-20% from
# run to run, so a closer win is as likely noise as a crossover, and fewer lines are easier to read.
KEEP_WITHIN = 1.10


def winners(times):
    """{bytes: {algorithm: us}} -> the candidate chosen at each size, in ascending size."""
    chosen = []
    for size in sorted(times):
        row = times[size]
        fastest = min(row, key=row.get)
        keep = chosen[-1][1] if chosen else fastest
        chosen.append((size, keep if row.get(keep, float("inf")) <= KEEP_WITHIN * row[fastest] else fastest))
    return chosen


def times_by_group(records):
    """{(transport, world): {bytes: {algorithm: us}}}, in transport and world order."""
    groups = {}
    for r in sorted(records, key=lambda r: (r["transport"], r["world"])):
        groups.setdefault((r["transport"], r["world"]), {}).setdefault(r["bytes"], {})[r["algorithm"]] = r["time_us"]
    return groups


def lines_from(records):
    """The table's lines: per transport and world, the chosen candidate at each size, runs merged."""
    lines = []
    for (transport, world), times in times_by_group(records).items():
        chosen = winners(times)
        for i, (size, algorithm) in enumerate(chosen):
            if i + 1 < len(chosen) and chosen[i + 1][1] == algorithm:
                continue  # the run goes on
            last = i + 1 == len(chosen)
            lines.append({"transport": transport, "world": world, "up_to_bytes": None if last else size,
                          "algorithm": algorithm})
    return lines


def print_times(records):
    """The measured times, a table per transport and world size: what the lines were chosen from."""
    for (transport, world), times in times_by_group(records).items():
        print(f"# {transport}, {world} ranks, float32 SUM: median us per call")
        print(f"# {'bytes':>10s}" + "".join(f"{a:>11s}" for a in CANDIDATES))
        for size in sorted(times):
            print(f"  {size:>10d}" + "".join(f"{times[size][a]:11.1f}" for a in CANDIDATES))


def measure(args):
    """Records of every candidate, per transport and world."""
    transports = [t for t in args.transports.split(",") if t]
    process_transports = ",".join(t for t in transports if t != "local")
    under_launcher = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    worlds = [int(os.environ["WORLD_SIZE"])] if under_launcher else [int(w) for w in args.worlds.split(",") if w]
    records = []
    for world in worlds:
        argv = bench_argv(args, world, process_transports or "shm")
        bargs = options.parse_args(argv)
        if process_transports:
            print(f"# timing {process_transports} with {world} ranks", file=sys.stderr, flush=True)
            result = run.launch(bargs, argv)
            if result is None:  # a non-zero rank under the launcher
                return None
            records += [r for r in result[0] if r["impl"] == "ringreduce"]
        if "local" in transports and (not under_launcher or os.environ["RANK"] == "0"):
            print(f"# timing local with {world} ranks", file=sys.stderr, flush=True)
            records += local_records(bargs, world)
    return records


def main(argv=None):
    args = parse_args(argv)
    records = measure(args)
    if records is None:
        return
    lines = lines_from(records)
    table = {"format": tuning.FORMAT,
             "measured": f"{datetime.date.today()} on {platform.node()}, {os.cpu_count()} cores, torch {torch.__version__}",
             "lines": lines}
    tuning.validate(table, "the measured table")
    path = args.output or tuning.default_path()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(table, f, indent=1)
    print_times(records)
    for line in lines:
        up_to = "any size" if line["up_to_bytes"] is None else f"up to {line['up_to_bytes']} B"
        print(f"{line['transport']:6s} {line['world']:3d} ranks  {up_to:>20s}: {line['algorithm']}")
    print(f"# wrote {path}")


if __name__ == "__main__":
    main()
