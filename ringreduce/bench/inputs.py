"""Benchmark data with a closed-form result, so every row's output can be checked exactly."""

import torch

from ringreduce.bench.options import R


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
