"""The all-reduce algorithms on the `local` transport (ranks as threads): every dtype and op, world sizes 1-16."""

import datetime

import pytest
import torch

import ringreduce
from reference import ALL_DTYPES, R, assert_bitwise_equal, exact_inputs, ops_for, reference

WORLDS = [1, 2, 3, 4, 5, 6, 7, 8, 16]
_worlds = {}


def world_of(size):
    """One LocalWorld per size, shared by the tests (each has its own worker threads)."""
    if size not in _worlds:
        _worlds[size] = ringreduce.LocalWorld(size, timeout=datetime.timedelta(seconds=60))
    return _worlds[size]


ALGORITHMS = ["ring", "central", "one_shot", "doubling", "halving_doubling", "auto"]


# The algorithms of the closed-form matrix. One-shot and the log-step ones stop at 99,991 elements
# (segment_for cuts every chunk into about five segments at any count, so a larger count only adds
# bytes: 1 Mi elements took 20 s per algorithm at 8 ranks and half a minute at 16, for nothing
# 262,147 does not reach for the ring and the central reducer).
ALGORITHMS_TO_262147 = ["ring", "central"]
ALGORITHMS_TO_99991 = ALGORITHMS_TO_262147 + ["one_shot", "doubling", "halving_doubling"]


def counts_for(world):
    """Element counts from empty to many segments, with the algorithms that run each."""
    counts = {0, 1, max(world - 1, 0), world, 99_991}
    return [(numel, ALGORITHMS_TO_99991) for numel in sorted(counts)] + [(262_147, ALGORITHMS_TO_262147)]


def segment_for(numel, world, elem_size):
    """About five segments per chunk, at an odd byte count so segments end ragged."""
    return max(1, numel * elem_size // world // 5) + 3


@pytest.mark.parametrize("world", WORLDS)
def test_every_dtype_and_op_matches_the_closed_form(world):
    """Each case's inputs and reference are made once, and every algorithm is checked against them."""
    local = world_of(world)
    for numel, algorithms in counts_for(world):
        for dtype in ALL_DTYPES:
            for op in ops_for(dtype):
                inputs = exact_inputs(world, numel, dtype, op)
                expected = reference(inputs, op)
                segment = segment_for(numel, world, inputs[0].element_size())
                for algorithm in algorithms:
                    tensors = [t.clone() for t in inputs]
                    local.all_reduce(tensors, op=op, algorithm=algorithm, segment_bytes=segment)
                    assert_bitwise_equal(tensors, expected, f"{algorithm} world={world} numel={numel} {dtype} {op}")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("world", [2, 3, 5, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_random_floats_close_to_float64_and_identical_on_every_rank(world, algorithm, dtype):
    gen = torch.Generator().manual_seed(world)
    numel = 30_011
    wide = [torch.randn(numel, generator=gen, dtype=torch.float64) for _ in range(world)]
    for op in (R.SUM, R.AVG):
        tensors = [w.to(dtype, copy=True) for w in wide]
        expected = reference([w.clone() for w in tensors], op).double()
        world_of(world).all_reduce(tensors, op=op, algorithm=algorithm, segment_bytes=4096)
        assert_bitwise_equal(tensors, context=f"{algorithm} {dtype} {op}")
        # Each of the world-1 reductions rounds once to the storage type.
        eps = torch.finfo(dtype).eps
        scale = torch.stack([w.to(dtype).double().abs() for w in wide]).sum(0)
        if op == R.AVG:
            scale = scale / world
        error = (tensors[0].double() - expected).abs()
        assert (error <= world * eps * scale + 1e-300).all(), f"{algorithm} {dtype} {op}: max error {error.max()}"


def test_float16_and_bfloat16_round_to_nearest_even():
    # 1 + 2^-11 is halfway between two float16 values (spacing 2^-10 at 1): it rounds to even, 1.0.
    # For bfloat16 the spacing at 1 is 2^-7, so 1 + 2^-8 rounds to 1.0 and 1 + 3*2^-8 to 1 + 2^-6.
    world = world_of(2)
    for dtype, a, b, expected in [
        (torch.float16, 1.0, 2.0**-11, 1.0),
        (torch.float16, 1.0 + 2.0**-10, 2.0**-11, 1.0 + 2.0**-9),
        (torch.bfloat16, 1.0, 2.0**-8, 1.0),
        (torch.bfloat16, 1.0 + 2.0**-7, 2.0**-8, 1.0 + 2.0**-6),
    ]:
        tensors = [torch.tensor([a], dtype=dtype), torch.tensor([b], dtype=torch.float32).to(dtype)]
        world.all_reduce(tensors)
        assert tensors[0].item() == expected and tensors[1].item() == expected, (dtype, a, b, tensors)


def test_float16_conversions_cover_subnormals_infinities_and_nan():
    # Every float16 bit pattern, reduced with MAX against -inf, must come back unchanged (NaNs as NaN).
    world = world_of(2)
    every = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.float16)
    tensors = [every.clone(), torch.full_like(every, float("-inf"))]
    world.all_reduce(tensors, op=R.MAX)
    nan = every.isnan()
    assert torch.equal(tensors[0][~nan], every[~nan]) and tensors[0][nan].isnan().all()
    # SUM of two halves: compare with float32 arithmetic rounded by torch.
    halves = every[~nan & ~every.isinf()]
    tensors = [halves.clone(), halves.flip(0).clone()]
    expected = (halves.float() + halves.flip(0).float()).half()
    world.all_reduce(tensors)
    assert torch.equal(tensors[0], expected)


def test_bfloat16_matches_torch_rounding_on_random_sums():
    world = world_of(2)
    gen = torch.Generator().manual_seed(5)
    a = (torch.randn(100_000, generator=gen) * 1e3).bfloat16()
    b = (torch.randn(100_000, generator=gen) * 1e-2).bfloat16()
    tensors = [a.clone(), b.clone()]
    world.all_reduce(tensors)
    assert torch.equal(tensors[0], (a.float() + b.float()).bfloat16())


def test_bool_min_max_product_are_logical():
    world = world_of(3)
    rows = [torch.tensor([True, True, False, False]), torch.tensor([True, False, True, False]),
            torch.tensor([True, True, True, False])]
    for op, expected in [(R.MIN, [True, False, False, False]), (R.MAX, [True, True, True, False]),
                         (R.PRODUCT, [True, False, False, False])]:
        tensors = [r.clone() for r in rows]
        world.all_reduce(tensors, op=op)
        assert all(t.tolist() == expected for t in tensors), (op, tensors)


def test_segment_size_from_the_environment_reaches_many_segments(monkeypatch):
    world = world_of(4)
    inputs = exact_inputs(4, 10_007, torch.float32, R.SUM)
    monkeypatch.setenv("RINGREDUCE_SEGMENT_BYTES", "100")
    for algorithm in ("ring", "central"):
        tensors = [t.clone() for t in inputs]
        world.all_reduce(tensors, algorithm=algorithm)
        assert_bitwise_equal(tensors, reference(inputs, R.SUM), algorithm)


@pytest.mark.parametrize("variable,value", [("RINGREDUCE_SEGMENT_BYTES", "lots"), ("RINGREDUCE_LANES", "0")])
def test_bad_environment_is_refused_before_any_data_moves(variable, value, monkeypatch):
    world = world_of(2)
    monkeypatch.setenv(variable, value)
    tensors = [torch.ones(10), torch.ones(10)]
    with pytest.raises(ValueError, match=variable):
        world.all_reduce(tensors)
    assert all(torch.equal(t, torch.ones(10)) for t in tensors)
    # The world is still usable once the setting is fixed.
    monkeypatch.delenv(variable)
    world.all_reduce(tensors)
    assert all(torch.equal(t, torch.full((10,), 2.0)) for t in tensors)


@pytest.mark.parametrize("world", [2, 3, 5])
@pytest.mark.parametrize("lanes", ["2", "3"])
def test_ring_in_several_lanes_gives_the_reference_bits(world, lanes, monkeypatch):
    # The hub keeps a channel per lane: the interleaved schedule must still pair every send with its receive.
    monkeypatch.setenv("RINGREDUCE_LANES", lanes)
    local = world_of(world)
    for numel in (0, 1, world, 10_007):
        for dtype in (torch.float32, torch.bfloat16, torch.int64):
            for op in (R.SUM, R.AVG if dtype.is_floating_point else R.MAX):
                inputs = exact_inputs(world, numel, dtype, op)
                tensors = [t.clone() for t in inputs]
                local.all_reduce(tensors, op=op, segment_bytes=1024)
                assert_bitwise_equal(tensors, reference(inputs, op), f"lanes={lanes} numel={numel} {dtype} {op}")


def test_more_lanes_than_the_hub_keeps_apart_are_capped(monkeypatch):
    monkeypatch.setenv("RINGREDUCE_LANES", "64")
    world = world_of(3)
    tensors = [torch.full((5000,), float(r)) for r in range(3)]
    world.all_reduce(tensors, segment_bytes=256)
    assert all(torch.equal(t, torch.full((5000,), 3.0)) for t in tensors)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("algorithm", ["ring", "central", "one_shot", "doubling", "halving_doubling"])
def test_nan_and_inf_propagate_as_ieee_says(dtype, algorithm):
    # Lengths that leave ragged tails after the 8- and 16-lane vector loops.
    world, numel = 3, 1003
    gen = torch.Generator().manual_seed(7)
    inputs = [torch.randn(numel, generator=gen, dtype=torch.float64) for _ in range(world)]
    inputs[0][::7] = float("nan")
    inputs[1][3::11] = float("inf")
    inputs[2][5::13] = float("-inf")
    inputs[1][::17] = float("nan")
    for op in (R.SUM, R.AVG, R.MIN, R.MAX, R.PRODUCT):
        tensors = [t.to(dtype) for t in inputs]
        expected = reference([t.clone() for t in tensors], op)
        world_of(world).all_reduce(tensors, op=op, algorithm=algorithm)
        for t in tensors:
            assert torch.equal(t.isnan(), expected.isnan()), (dtype, op)
            finite = ~expected.isnan()
            same_inf = torch.equal(t[finite].isinf(), expected[finite].isinf())
            assert same_inf and torch.equal(t[finite & expected.isinf()], expected[finite & expected.isinf()]), (dtype, op)


def test_bfloat16_and_float16_keep_subnormal_results():
    world = world_of(2)
    for dtype, tiny in [(torch.bfloat16, 2.0**-130), (torch.float16, 2.0**-20)]:
        a = (torch.arange(1, 40, dtype=torch.float32) * tiny).to(dtype)
        b = (torch.arange(40, 1, -1, dtype=torch.float32) * tiny).to(dtype)
        tensors = [a.clone(), b.clone()]
        world.all_reduce(tensors)
        expected = (a.float() + b.float()).to(dtype)
        assert (expected != 0).all() and torch.equal(tensors[0], expected), dtype
