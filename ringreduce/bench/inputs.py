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


def collective_buffers(collective, rank, world, numel, dtype, op, device="cpu"):
    """(input, output) of one rank for a collective over a buffer of `numel` elements (a multiple of
    the world size), filled with bench_inputs; output is None where the collective works in place."""
    share = numel // world
    if collective == "reduce_scatter":
        return bench_inputs(rank, world, numel, dtype, op).to(device), torch.empty(share, dtype=dtype, device=device)
    if collective == "all_gather":
        own = bench_inputs(rank, world, share, dtype, op).to(device)
        return own, torch.empty(numel, dtype=dtype, device=device)
    return bench_inputs(rank, world, numel, dtype, op).to(device), None


def collective_expected(collective, rank, world, numel, dtype, op):
    """What rank `rank` must hold after the collective (the output, or the input when in place);
    None where the collective leaves it unspecified (a reduce's other ranks)."""
    share = numel // world
    if collective == "reduce_scatter":
        return expected_result(world, numel, dtype, op)[rank * share:(rank + 1) * share]
    if collective == "all_gather":
        return torch.cat([bench_inputs(r, world, share, dtype, op) for r in range(world)])
    if collective == "broadcast":
        return bench_inputs(0, world, numel, dtype, op)
    if collective == "reduce" and rank != 0:
        return None
    return expected_result(world, numel, dtype, op)
