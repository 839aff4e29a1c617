"""The reduction kernel against torch's add_, CuPy's += and a device-to-device copy, in one run.

    python benchmarks/kernel_bench.py [--json PATH] [--sizes 1M,4M,...,1G]

GB/s counts every byte read and written: 3 x size for dst = dst + src (two reads, one write) and
2 x size for the copy, the roof. Each figure is the best of several CUDA-event-timed repetitions.
"""

import argparse
import json
import sys

import torch

from ringreduce import _C
from ringreduce.bench.options import parse_size

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_SIZES = "1M,4M,16M,64M,256M,1G"
SUM = 0  # engine code of ReduceOp.SUM
# Repetitions per measurement, and the calls timed in each: enough for a 1 MiB kernel (a few
# microseconds) to dwarf the event overhead, few enough that 1 GiB stays under a second.
REPEATS, CALLS_SMALL, CALLS_LARGE, LARGE_BYTES = 5, 50, 5, 256 << 20


def best_seconds(fn, calls):
    best = float("inf")
    for _ in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3 / calls)
    return best


def measure(dtype, nbytes):
    numel = nbytes // torch.empty((), dtype=dtype).element_size()
    dst = torch.randn(numel, device="cuda").to(dtype)
    src = torch.randn(numel, device="cuda").to(dtype)
    calls = CALLS_LARGE if nbytes >= LARGE_BYTES else CALLS_SMALL
    rows = {
        "ringreduce": best_seconds(lambda: _C._testing.cuda_reduce(dst, src, SUM, 1, False), calls),
        "torch add_": best_seconds(lambda: dst.add_(src), calls),
    }
    try:
        import cupy

        a, b = cupy.from_dlpack(dst), cupy.from_dlpack(src)

        def cupy_add():
            a.__iadd__(b)

        rows["cupy +="] = best_seconds(cupy_add, calls)
    except ImportError:
        pass
    rates = {name: 3 * nbytes / seconds / 1e9 for name, seconds in rows.items()}
    rates["copy (roof)"] = 2 * nbytes / best_seconds(lambda: dst.copy_(src), calls) / 1e9
    return rates


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default=DEFAULT_SIZES)
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("kernel_bench needs a CUDA GPU")
    print(f"# {torch.cuda.get_device_name()}: effective GB/s (bytes read + written), best of {REPEATS}")
    records = []
    for dtype_name in args.dtypes.split(","):
        for size in [parse_size(s) for s in args.sizes.split(",")]:
            rates = measure(DTYPES[dtype_name], size)
            record = {"dtype": dtype_name, "bytes": size, **{k: round(v, 1) for k, v in rates.items()}}
            record["vs_roof"] = round(rates["ringreduce"] / rates["copy (roof)"], 3)
            record["vs_torch"] = round(rates["ringreduce"] / rates["torch add_"], 3)
            records.append(record)
            cells = "  ".join(f"{k} {v:8.1f}" for k, v in rates.items())
            print(f"{dtype_name:>9} {size:>11}  {cells}  ours/roof {record['vs_roof']:.2f}  ours/torch {record['vs_torch']:.2f}")
            sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
