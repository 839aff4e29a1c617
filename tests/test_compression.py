"""all_reduce(compress=...): float32 values cross the link between hosts in bf16 or fp16, exact
inside each host. Hosts are emulated with RINGREDUCE_HOST_NAME, as in tests/test_hierarchy.py.

The error bound checked: a value is rounded to the 16-bit format once per host on its way round the
ring between hosts (H hosts: H roundings, each at most u relative to the partial sum it rounds,
u = 2^-8 for bf16 and 2^-11 for fp16), and float32 adds at most 2^-24 per addition (the sums inside a
host, each hop's addition, an AVG's division). Without cancellation the partial sums are at most
the final sum, so the result is within (1 + u)^H (1 + 2^-24)^(N+1) - 1 of it; with cancellation the
same bound holds against the sum of magnitudes instead."""

import contextlib
import functools
import io

import pytest
import torch
import torch.distributed as dist

import ringreduce
from ringreduce import _C
from multiproc import run_ranks

R = dist.ReduceOp
UNIT_ROUNDOFF = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}
WIDE = {"bf16": torch.bfloat16, "fp16": torch.float16}
# Element counts: empty, one, ragged around the world size, one block of many segments, and more
# than one pipeline block on 2 hosts x 2 (4 MiB of float32: 1,048,576 elements; one block on
# 2+1+2, whose blocks are 6 MiB).
SIZES = (0, 1, 6, 99_991, 1_300_007)


def _host_env(layout, rank):
    return {"RINGREDUCE_HOST_NAME": f"host-{layout[rank]}", "RINGREDUCE_DEBUG": "INFO"}


def _gathered(tensor):
    everyone = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, tensor)
    return everyone


def _bound(compress, hosts, world):
    return (1 + UNIT_ROUNDOFF[compress]) ** hosts * (1 + 2.0 ** -24) ** (world + 1) - 1


def _check_sizes(rank, world, hosts, compress, op, signed):
    """Every size compressed: the same bits on every rank, values of the 16-bit format, within the
    bound of the float64 sum (or of the sum of magnitudes, with cancellation). Returns the largest
    error seen, relative to its bound's scale."""
    worst = 0.0
    for numel in SIZES:
        gen = torch.Generator().manual_seed(100 * rank + numel % 97)
        data = torch.randn(numel, generator=gen) if signed else torch.rand(numel, generator=gen) + 0.25
        inputs = _gathered(data)
        exact = torch.stack([t.double() for t in inputs]).sum(0)
        scale = torch.stack([t.double().abs() for t in inputs]).sum(0) if signed else exact
        if op == R.AVG:
            exact, scale = exact / world, scale / world
        mine = data.clone()
        ringreduce.all_reduce(mine, op, compress=compress, segment_bytes=8192 if numel < 200_000 else None)
        assert torch.equal(mine, mine.to(WIDE[compress]).float()), f"{compress} numel={numel}: not {compress} values"
        for theirs in _gathered(mine):
            assert torch.equal(theirs, mine), f"{compress} numel={numel}: ranks hold different bits"
        if numel:
            error = ((mine.double() - exact).abs() / scale).max().item()
            assert error <= _bound(compress, hosts, world), f"{compress} {op} numel={numel}: error {error}"
            worst = max(worst, error)
    return worst


def _check_rounding(rank, compress):
    """With every other rank's values zero, the result is rank 0's values rounded once, as torch
    rounds them: infinities, NaN, ties to even, overflow, subnormals, through the vector loops and
    the ragged tail alike."""
    special = torch.tensor([float("inf"), -float("inf"), float("nan"), 1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -11,
                            1 + 3 * 2 ** -11, 65504.0, 65520.0, -1e6, 3.4e38, 1e-40, -1e-6, 3e-8, 2.5, -0.1])
    gen = torch.Generator().manual_seed(5)
    values = torch.cat([special.repeat(40), torch.randn(363, generator=gen) * 1e3])  # 1003: a ragged tail
    data = values.clone() if rank == 0 else torch.zeros_like(values)
    ringreduce.all_reduce(data, compress=compress)
    expected = values.to(WIDE[compress]).float()
    assert torch.equal(data.isnan(), expected.isnan()), compress
    assert torch.equal(data[~data.isnan()], expected[~expected.isnan()]), compress


INT8_BLOCK = 256  # values sharing a scale (kInt8BlockValues)


def _int8_bound(hosts, world, magnitudes):
    """Per element: H roundings of half a step each, a step being 1/127 of the largest partial sum
    of the element's block, at most the largest sum of magnitudes within a block's reach of it
    (grown by the earlier roundings); and float32's own additions."""
    reach = torch.nn.functional.max_pool1d(magnitudes.view(1, 1, -1), 2 * INT8_BLOCK - 1, stride=1,
                                           padding=INT8_BLOCK - 1).view(-1)
    return reach * (hosts / 254 * (1 + hosts / 254) + world * 2.0 ** -23)


def _check_int8(rank, world, hosts):
    """int8 blocks on the link: the same bits on every rank, each element within its bound; returns
    the largest error relative to its bound (so the test sees that rounding happened)."""
    worst = 0.0
    for numel in SIZES:
        for op, signed in ((R.SUM, False), (R.AVG, False), (R.SUM, True)):
            gen = torch.Generator().manual_seed(31 * rank + numel % 89)
            data = torch.randn(numel, generator=gen) if signed else torch.rand(numel, generator=gen) + 0.25
            inputs = _gathered(data)
            exact = torch.stack([t.double() for t in inputs]).sum(0)
            magnitudes = torch.stack([t.double().abs() for t in inputs]).sum(0)
            if op == R.AVG:
                exact, magnitudes = exact / world, magnitudes / world
            mine = data.clone()
            ringreduce.all_reduce(mine, op, compress="int8", segment_bytes=8192 if numel < 200_000 else None)
            for theirs in _gathered(mine):
                assert torch.equal(theirs, mine), f"int8 numel={numel}: ranks hold different bits"
            if numel:
                ratio = ((mine.double() - exact).abs() / _int8_bound(hosts, world, magnitudes)).max().item()
                assert ratio <= 1, f"int8 {op} numel={numel} signed={signed}: error {ratio} of its bound"
                worst = max(worst, ratio)
    # A non-finite value makes its block NaN, on every rank alike, and only its block.
    data = torch.ones(3000)
    if rank == 0:
        data[1234] = float("inf")
    ringreduce.all_reduce(data, compress="int8")
    for theirs in _gathered(data):
        assert torch.equal(theirs.isnan(), data.isnan())
    assert data[1234].isnan() and 0 < int(data.isnan().sum()) <= INT8_BLOCK
    return worst


def _check_reduce_scatter(rank, world, hosts, compress, op):
    """Reduce-scatters compressed: each rank's share within the bound, of the 16-bit format."""
    for chunk in (1, 7, 99_991, 300_007):  # the last in two pipeline blocks
        gen = torch.Generator().manual_seed(7 * rank + chunk)
        data = torch.rand(chunk * world, generator=gen) + 0.25
        exact = torch.stack([t.double() for t in _gathered(data)]).sum(0).view(world, chunk)[rank]
        if op == R.AVG:
            exact = exact / world
        mine = torch.empty(chunk)
        ringreduce.reduce_scatter_tensor(mine, data, op, compress=compress)
        assert torch.equal(mine, mine.to(WIDE[compress]).float()), f"{compress} chunk={chunk}: not {compress} values"
        error = ((mine.double() - exact).abs() / exact).max().item()
        assert error <= _bound(compress, hosts, world), f"reduce_scatter {compress} {op} chunk={chunk}: error {error}"


def _compressed(rank, world, layout):
    hosts = len(set(layout))
    worst = {}
    for compress in ("bf16", "fp16"):
        for op in (R.SUM, R.AVG):
            worst[compress, str(op), False] = _check_sizes(rank, world, hosts, compress, op, signed=False)
        worst[compress, "sum", True] = _check_sizes(rank, world, hosts, compress, R.SUM, signed=True)
        _check_rounding(rank, compress)
        if _C.chunked_hierarchy_pays([ord(h) for h in layout]):  # a hierarchical reduce-scatter
            _check_reduce_scatter(rank, world, hosts, compress, R.AVG if compress == "fp16" else R.SUM)

    # A reduce-scatter over 2+1+2 runs flat (hierarchical would move no fewer bytes), and exact.
    if not _C.chunked_hierarchy_pays([ord(h) for h in layout]):
        data = torch.arange(world * 100, dtype=torch.float32) / 7 + rank
        compressed, plain = torch.empty(100), torch.empty(100)
        said = io.StringIO()
        with contextlib.redirect_stderr(said):
            ringreduce.reduce_scatter_tensor(compressed, data, compress="bf16")
        ringreduce.reduce_scatter_tensor(plain, data)
        assert torch.equal(compressed, plain)
        assert "only where that moves fewer bytes across hosts than the ring" in said.getvalue(), said.getvalue()

    worst["int8", "any", None] = _check_int8(rank, world, hosts)

    # Where compression does not apply the call runs exact, bit for bit the uncompressed call's.
    for dtype, op in ((torch.float64, R.SUM), (torch.float32, R.MAX), (torch.bfloat16, R.SUM)):
        data = (torch.arange(1000, dtype=torch.float64) * 0.37 + rank).to(dtype)
        compressed, plain = data.clone(), data.clone()
        ringreduce.all_reduce(compressed, op, algorithm="hierarchical", compress="bf16")
        ringreduce.all_reduce(plain, op, algorithm="hierarchical")
        assert torch.equal(compressed, plain), f"{dtype} {op} with compress changed the result"

    # Only the hierarchical all-reduce compresses: other algorithms and names are refused, the tensor untouched.
    tensor = torch.full((10,), float(rank))
    with pytest.raises(ValueError, match="algorithm 'ring' moves every value exact"):
        ringreduce.all_reduce(tensor, algorithm="ring", compress="bf16")
    with pytest.raises(ValueError, match="unknown compress 'int4'"):
        ringreduce.all_reduce(tensor, compress="int4")
    assert torch.equal(tensor, torch.full((10,), float(rank)))

    # A group inside one host has no link to compress: exact, and said under RINGREDUCE_DEBUG=INFO.
    host_groups = {host: dist.new_group([r for r in range(world) if layout[r] == host]) for host in sorted(set(layout))}
    data = torch.rand(5000, generator=torch.Generator().manual_seed(rank))
    compressed, plain = data.clone(), data.clone()
    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        ringreduce.all_reduce(compressed, group=host_groups[layout[rank]], compress="bf16")
    ringreduce.all_reduce(plain, group=host_groups[layout[rank]], algorithm="ring")
    assert torch.equal(compressed, plain)
    if layout.count(layout[rank]) > 1:
        assert "there is no link between hosts to compress" in said.getvalue(), said.getvalue()

    # Ranks that disagree on compression all raise, naming it.
    tensor = torch.ones(4096)
    with pytest.raises(RuntimeError, match="compressed to bf16 across hosts"):
        ringreduce.all_reduce(tensor, compress="bf16" if rank == 0 else None, algorithm="hierarchical")
    return worst


# 2x2; 2+1+2 (a host of one rank; the reduce-scatter flat); 3+2 placed round-robin (the host of two
# carries the third column of the reduce-scatter across).
@pytest.mark.parametrize("layout", ["aabb", "aabcc", "aabab"])
def test_compressed_link_is_within_its_bound_and_the_same_on_every_rank(layout):
    worst = run_ranks(len(layout), _compressed, layout, env=functools.partial(_host_env, layout))
    assert all(w == worst[0] for w in worst)
    for (compress, op, signed), error in worst[0].items():
        # Compression did round: the errors reach a good part of the bound (int8's is already relative).
        bound = 1.0 if compress == "int8" else _bound(compress, len(set(layout)), len(layout))
        assert bound / 10 < error, (compress, op, signed, error)


def _backend_compresses(rank, world):
    """RINGREDUCE_COMPRESS=bf16 on the backend: torch's float32 all-reduce and reduce-scatter cross
    compressed (bf16 values within the bound), MAX stays exact."""
    data = torch.rand(50_000, generator=torch.Generator().manual_seed(rank)) + 0.25
    inputs = _gathered(data)
    exact = torch.stack([t.double() for t in inputs]).sum(0)
    mine = data.clone()
    dist.all_reduce(mine)
    assert torch.equal(mine, mine.bfloat16().float())
    assert ((mine.double() - exact).abs() / exact).max().item() <= _bound("bf16", 2, world)
    share = torch.empty(50_000 // world)
    dist.reduce_scatter_tensor(share, data)
    assert torch.equal(share, share.bfloat16().float())
    assert ((share.double() - exact.view(world, -1)[rank]).abs() / exact.view(world, -1)[rank]).max() <= _bound("bf16", 2, world)
    largest = data.clone()
    dist.all_reduce(largest, dist.ReduceOp.MAX)
    assert torch.equal(largest, torch.stack(inputs).max(0).values)
    return True


def _setting_env(settings, rank):
    """2 hosts x 2 ranks, rank r with RINGREDUCE_COMPRESS=settings[r]."""
    return {**_host_env("aabb", rank), "RINGREDUCE_COMPRESS": settings[rank]}


def test_the_backend_compresses_from_its_setting():
    env = functools.partial(_setting_env, ["bf16"] * 4)
    assert run_ranks(4, _backend_compresses, backend="ringreduce", env=env) == [True] * 4


def _disagreeing_backend(rank, world):
    with pytest.raises(ringreduce.MismatchError, match="compressed to bf16 across hosts"):
        dist.all_reduce(torch.ones(1000))
    return True


def test_ranks_that_set_different_compressions_all_raise():
    env = functools.partial(_setting_env, ["bf16", "none", "none", "none"])
    assert run_ranks(4, _disagreeing_backend, backend="ringreduce", env=env) == [True] * 4


@pytest.mark.parametrize("setting, algorithm, refused", [
    ("bf17", "auto", "RINGREDUCE_COMPRESS='bf17' is not a compression"),
    ("fp16", "ring", "RINGREDUCE_ALGORITHM=ring never crosses compressed"),
])
def test_the_backend_refuses_a_bad_setting(monkeypatch, setting, algorithm, refused):
    monkeypatch.setenv("RINGREDUCE_COMPRESS", setting)
    with pytest.raises(ValueError, match=refused):
        ringreduce.backend._compression(algorithm)
