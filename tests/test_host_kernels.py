"""The CUDA reduction kernel's body, compiled for the host and run over simulated grids: every dtype
and op, lengths around the 16-byte packs, alignment offsets, the fused copy and AVG's divide. It
needs no GPU, only a build with the CUDA part, so every CI run checks the kernel arithmetic."""

import pytest
import torch

from ringreduce import _C
from reference import ALL_DTYPES, R, kernel_reference, ops_for

pytestmark = [
    pytest.mark.host_kernels,
    pytest.mark.skipif(not hasattr(_C._testing, "host_reduce"), reason="built without the CUDA part"),
]
OP_CODES = {R.SUM: 0, R.AVG: 1, R.MIN: 2, R.MAX: 3, R.PRODUCT: 4}
PACK_BYTES = 16
WORLD = 3
# (blocks, threads per block): one thread alone, a warp, and grids whose thread count divides
# neither the packs nor the tails.
GRIDS = [(1, 1), (1, 32), (3, 7), (5, 64)]


def lengths(dtype):
    """0, 1, a pack minus one, a pack, a pack plus one, odd, and large (many packs per thread)."""
    pack = PACK_BYTES // dtype.itemsize
    return [0, 1, pack - 1, pack, pack + 1, 3 * pack + 5, 4099]


def offsets(dtype):
    """(dst, src, copy) element offsets from a 16-byte boundary: aligned, all shifted alike (a
    vectorised body after a scalar head), and shifted differently (all scalar)."""
    pack = PACK_BYTES // dtype.itemsize
    same = [(0, 0, 0)] + ([(1, 1, 1), (pack - 1, pack - 1, pack - 1)] if pack > 1 else [])
    return same + [(1, 0, 0), (0, 1, 1), (0, 0, 1)] if pack > 1 else same


def operand(values, offset):
    """`values` copied into a fresh buffer at `offset` elements from its (64-byte-aligned) start."""
    storage = torch.empty(offset + values.numel() + 1, dtype=values.dtype)
    view = storage[offset : offset + values.numel()]
    view.copy_(values)
    return view


def random_values(n, dtype, gen):
    if dtype.is_floating_point:
        values = (torch.randn(n, generator=gen, dtype=torch.float64) * 4).to(dtype)
        values[3::97] = float("nan")
        values[5::89] = float("inf")
        values[7::71] = -0.0
        return values
    info = torch.iinfo(dtype)
    low, high = max(info.min, -(2**62)), min(info.max, 2**62)
    return torch.randint(low, high + 1, (n,), generator=gen, dtype=torch.int64).to(dtype)


def bits(t):
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.dtype.itemsize])


def assert_same_values(actual, wanted, context):
    """Bitwise equal, except that a NaN may carry any payload."""
    if actual.dtype.is_floating_point:
        nan = wanted.isnan()
        assert torch.equal(actual.isnan(), nan), context
        actual, wanted = actual[~nan], wanted[~nan]
    assert torch.equal(bits(actual), bits(wanted)), context


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_kernel_body_matches_torch_for_every_op_length_alignment_and_grid(dtype):
    gen = torch.Generator().manual_seed(11)
    for op in ops_for(dtype):
        for n in lengths(dtype):
            a, b = random_values(n, dtype, gen), random_values(n, dtype, gen)
            for dst_at, src_at, copy_at in offsets(dtype):
                for last in (False, True) if op == R.AVG else (False,):
                    want = kernel_reference(a, b, op, WORLD, last)
                    for with_copy in (False, True):
                        for blocks, threads in GRIDS:
                            dst, src = operand(a, dst_at), operand(b, src_at)
                            copy = operand(torch.zeros_like(a), copy_at) if with_copy else None
                            _C._testing.host_reduce(dst, src, OP_CODES[op], WORLD, last, copy, blocks, threads)
                            context = (f"{dtype} {op} n={n} offsets={dst_at, src_at, copy_at} last={last} "
                                       f"copy={with_copy} grid={blocks}x{threads}")
                            assert_same_values(dst, want, context)
                            assert torch.equal(bits(src), bits(b)), context + " (src changed)"
                            if with_copy:
                                assert_same_values(copy, want, context + " (copy)")


def test_kernel_body_leaves_memory_outside_the_span_alone():
    base = torch.arange(64, dtype=torch.float32)
    dst = base.clone()
    src = torch.ones(64)
    _C._testing.host_reduce(dst[3:40], src[3:40], OP_CODES[R.SUM], WORLD, False, None, 2, 5)
    assert torch.equal(dst[:3], base[:3]) and torch.equal(dst[40:], base[40:])
    assert torch.equal(dst[3:40], base[3:40] + 1)


def test_kernel_body_refuses_avg_on_integers_and_an_empty_grid():
    t = torch.ones(8, dtype=torch.int32)
    with pytest.raises((TypeError, ValueError), match="AVG"):
        _C._testing.host_reduce(t, t.clone(), OP_CODES[R.AVG], WORLD, True, None, 1, 1)
    f = torch.ones(8)
    with pytest.raises(ValueError, match="grid"):
        _C._testing.host_reduce(f, f.clone(), OP_CODES[R.SUM], WORLD, False, None, 0, 32)


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=str)
def test_avg_premultiply_body_matches_torch_for_every_length_alignment_and_grid(dtype):
    gen = torch.Generator().manual_seed(5)
    for world in (2, 3, 8):
        factor = torch.tensor(1.0 / world, dtype=torch.float32).item()
        for n in lengths(dtype):
            values = random_values(n, dtype, gen)
            want = (values.float() * factor).to(dtype)
            for offset in (0, 1, 7):
                for blocks, threads in GRIDS:
                    data = operand(values, offset)
                    _C._testing.host_scale(data, factor, blocks, threads)
                    assert_same_values(data, want, f"{dtype} world={world} n={n} offset={offset} grid={blocks}x{threads}")


def test_avg_premultiply_keeps_float16_partial_sums_in_range():
    # Eight ranks' 16384s: their float16 sum (131072) overflows, their average does not. Summed
    # pairwise as the ring does, plain values reach inf; pre-multiplied ones land on the average
    # (every partial sum is a multiple of 2048, exact in float16).
    world = 8

    def pairwise_sum(contributions):
        total = contributions[0].clone()
        for c in contributions[1:]:
            _C._testing.host_reduce(total, c, OP_CODES[R.SUM], world, False, None, 2, 8)
        return total

    plain = [torch.full((33,), 16384.0, dtype=torch.float16) for _ in range(world)]
    assert torch.isinf(pairwise_sum(plain)).all()
    for c in plain:
        _C._testing.host_scale(c, 1.0 / world, 2, 8)
    assert torch.equal(pairwise_sum(plain), torch.full((33,), 16384.0, dtype=torch.float16))


def test_the_premultiply_is_refused_for_other_dtypes():
    with pytest.raises(ValueError, match="float16 and bfloat16"):
        _C._testing.host_scale(torch.ones(4), 0.5, 1, 1)
