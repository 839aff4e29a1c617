"""Command-line options of the benchmark, and the dtypes and ops it names."""

import argparse

import torch
import torch.distributed as dist

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
# What --collective can time (one launch times several in turn); sizes are the whole buffer (a
# reduce-scatter's input, an all-gather's output), as in nccl-tests.
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce")
# The one algorithm each collective but all_reduce runs on (broadcast: a chain along the ring;
# reduce: the central reducer's first half, into rank 0).
NATIVE_ALGORITHM = {"reduce_scatter": "ring", "all_gather": "ring", "broadcast": "ring", "reduce": "central"}
# With --iters 0 each (row, size) is timed for about this long in all (--row-seconds): long enough
# to average out the scheduler on a shared 2-core machine, short enough that the default sweep
# stays under two minutes.
DEFAULT_ROW_SECONDS = 0.5
# Trials per row; the table reports the median trial and the fastest. 21: trials of about 24 ms
# (DEFAULT_ROW_SECONDS / 21), far shorter than this host's slow spells, and an odd count has a
# middle trial.
DEFAULT_TRIALS = 21
# Algorithms that run on host memory only, left out of the GPU rows.
HOST_ONLY_ALGORITHMS = ("one_shot",)
DESCRIPTION = "nccl-tests-style benchmark: ringreduce's collectives beside torch.distributed's."


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


def at_least(low, kind=int):
    """An argparse type: a number (`kind`) of at least `low`, else an error that names the bound."""

    def parse(text: str):
        value = kind(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below {low}")
        return value

    parse.__name__ = f"{'integer' if kind is int else 'number'} of at least {low}"  # argparse's name for the type
    return parse


def collective_list(text: str) -> list:
    """An argparse type: collectives, comma-separated (each timed in turn by the same ranks), or "all"."""
    names = list(COLLECTIVES) if text.strip() == "all" else [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in COLLECTIVES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{', '.join(unknown) or 'nothing'} is not one of {', '.join(COLLECTIVES)} "
                                         f"(or all)")
    return list(dict.fromkeys(names))


collective_list.__name__ = "list of collectives"  # argparse's name for the type


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ringreduce.bench", description=DESCRIPTION)
    parser.add_argument("--world", type=int, default=2, help="local ranks to launch (ignored under torchrun)")
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="comma-separated sizes in bytes, e.g. 4K,1M,64M")
    parser.add_argument("-b", "--minbytes", help="smallest size (with -e and -f, like nccl-tests)")
    parser.add_argument("-e", "--maxbytes", help="largest size")
    parser.add_argument("-f", "--stepfactor", type=int, default=4, help="size multiplier between rows")
    parser.add_argument("--collective", dest="collectives", type=collective_list, default=["all_reduce"],
                        metavar="LIST", help=f"the collectives to time, one table each: {', '.join(COLLECTIVES)}, "
                        "comma-separated, or all (all but all_reduce: one algorithm each, CPU transports only)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--op", choices=sorted(OPS), default="sum")
    parser.add_argument("--iters", type=at_least(0), default=0,
                        help="timed calls per row and trial (0: about --row-seconds per row in all)")
    parser.add_argument("--row-seconds", type=at_least(0.01, float), default=DEFAULT_ROW_SECONDS,
                        help="with --iters 0, the seconds each row and size is timed for over its trials")
    parser.add_argument("--warmup", type=at_least(0), default=3, help="untimed calls before timing")
    parser.add_argument("--trials", type=at_least(1), default=DEFAULT_TRIALS,
                        help="timed trials per row (the median and the fastest reported)")
    parser.add_argument("--check", type=int, choices=(0, 1), default=1, help="run the untimed correctness pass")
    parser.add_argument("--algorithms", default="ring,central,one_shot,auto",
                        help="all-reduce algorithms to time (one_shot: CPU rows only)")
    parser.add_argument("--transports", default=None, help="CPU transports to time (default: all in this build)")
    parser.add_argument("--no-torch", action="store_true", help="skip the torch.distributed rows")
    parser.add_argument("--unchecked", action="store_true",
                        help="add ring rows that skip the cross-rank check of each call (RINGREDUCE_CHECK_CALLS=0)")
    parser.add_argument("--lanes", default="", metavar="LIST",
                        help="add ring rows run with RINGREDUCE_LANES set to each count, e.g. 1,2 (GPU default 2, CPU 1)")
    parser.add_argument("--no-mpi", action="store_true", help="skip the OpenMPI rows even when mpi4py is present")
    parser.add_argument("--gpu", choices=("auto", "off", "only"), default="auto",
                        help="GPU rows: NCCL across processes with a GPU each, else virtual ranks on one GPU")
    parser.add_argument("--hosts", metavar="LAYOUT",
                        help="run on emulated hosts instead (root; e.g. 2x2, or 2+1+2 ranks per host): gloo, the "
                             "flat ring, hierarchical and auto across hosts, beside the links' bounds (sizes as above; "
                             "--collective all_reduce, reduce_scatter or all_gather; its own trials and time per "
                             "row, ringreduce/bench/across_hosts.py)")
    parser.add_argument("--link", default="2gbit", help="with --hosts: each host's link rate, in tc's words")
    parser.add_argument("--json", metavar="PATH", help="write the records as a JSON list")
    parser.add_argument("--plot", metavar="PATH", help="draw busbw against size (PNG)")
    parser.add_argument("--progress", type=int, choices=(0, 1), default=1, help="progress bar on stderr")
    return parser.parse_args(argv)
