"""The hierarchical all-reduce on groups that span hosts. Each process names its host with
RINGREDUCE_HOST_NAME, so one machine holds several "hosts": ranks of one name meet in shared memory,
the hosts through gloo. (tests/test_emulated_hosts.py runs real network namespaces.)"""

import functools

import pytest
import torch
import torch.distributed as dist

import ringreduce
from ringreduce import _C
from multiproc import run_ranks
from reference import ALL_DTYPES, R, exact_inputs, ops_for, reference

# Host names by rank: two hosts of two; hosts of 2, 1 and 2 ranks; ranks placed round-robin.
LAYOUTS = {
    "2x2": "aabb",
    "2+1+2": "aabcc",
    "interleaved": "abab",
}
DESCRIBED = {"2x2": "2 hosts x 2 ranks", "2+1+2": "3 hosts (2+1+2 ranks)", "interleaved": "2 hosts x 2 ranks"}
# Where the reduce-scatter and all-gather run hierarchical: even hosts, and hosts of 3 and 2 ranks
# placed round-robin (the host of 2 carries the third column across too; 2+1+2 runs them flat).
CHUNKED_LAYOUTS = {"2x2": "aabb", "3+2 interleaved": "aabab"}


def _host_env(layout, extra, rank):
    return {"RINGREDUCE_HOST_NAME": f"host-{layout[rank]}", **extra}


def _hosts(layout, **extra):
    """Each rank's environment: its host's name (and `extra`)."""
    return functools.partial(_host_env, layout, extra)


def _every_dtype_and_op(rank, world, algorithms):
    checks = 0
    # 30,011: 4 to 29 segments of 8 KiB by dtype, through every stage; 99,991 took twice as long for no more paths.
    for numel in sorted({0, 1, world - 1, world + 1, 30_011}):
        for dtype in ALL_DTYPES:
            for op in ops_for(dtype):
                inputs = exact_inputs(world, numel, dtype, op)
                expected = reference(inputs, op)
                for algorithm in algorithms:  # (flat ones, doubling among them, on pg: tests/test_processes.py)
                    mine = inputs[rank].clone()
                    ringreduce.all_reduce(mine, op, algorithm=algorithm, segment_bytes=8192)
                    assert torch.equal(mine, expected), f"{algorithm} numel={numel} {dtype} {op}"
                    checks += 1
    comm = ringreduce._groups.group_state(None).communicators
    (transport, _), = comm
    return checks, transport, next(iter(comm.values())).hosts


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_dtype_and_op_is_exact_on_every_layout(layout):
    # auto (whose first calls try every candidate) on the uneven layout only: the others add nothing to it.
    algorithms = ("hierarchical", "auto") if layout == "2+1+2" else ("hierarchical",)
    outcomes = run_ranks(len(LAYOUTS[layout]), _every_dtype_and_op, algorithms, env=_hosts(LAYOUTS[layout]))
    assert {o[0] for o in outcomes} == {outcomes[0][0]} and outcomes[0][0] > 0
    assert {o[1:] for o in outcomes} == {("pg", DESCRIBED[layout])}


def _random_floats(rank, world):
    """This rank's bits of each algorithm on random floats, each checked against the float64 sum:
    3 Mi floats cut into shards of several shared-memory segments; 300,007 in many segments across."""
    digests = {}
    for numel, segment_bytes in ((3 << 20, None), (300_007, 4096)):
        gen = torch.Generator().manual_seed(1000 + rank)
        data = torch.randn(numel, generator=gen)
        everyone = [torch.empty_like(data) for _ in range(world)]
        dist.all_gather(everyone, data)
        exact = torch.stack([t.double() for t in everyone]).sum(0)
        for algorithm in ("hierarchical", "doubling", "ring", "central"):
            mine = data.clone()
            ringreduce.all_reduce(mine, algorithm=algorithm, segment_bytes=segment_bytes)
            torch.testing.assert_close(mine.double(), exact, rtol=1e-5, atol=1e-5)
            digests[algorithm, numel] = mine.view(torch.int32).double().sum().item()
    # Async calls in flight together complete in issue order with their own results.
    tensors = [torch.full((4097 + i,), float(rank + i)) for i in range(6)]
    works = [ringreduce.all_reduce(t, algorithm="hierarchical", async_op=True) for t in tensors]
    for i, work in enumerate(works):
        work.wait()
        assert torch.equal(tensors[i], torch.full((4097 + i,), float(sum(r + i for r in range(world)))))
    return digests


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_random_floats_are_bitwise_identical_on_every_rank(layout):
    digests = run_ranks(len(LAYOUTS[layout]), _random_floats, env=_hosts(LAYOUTS[layout]))
    assert all(d == digests[0] for d in digests), f"ranks hold different bits: {digests}"


def _one_rank_per_host(rank, world):
    comm_tensor = torch.arange(10.0) + rank
    before = comm_tensor.clone()
    with pytest.raises(ValueError, match="'hierarchical' needs a group whose ranks span several hosts, with several "
                                         "ranks on some host; this group's pg communicator has 3 hosts x 1 rank"):
        ringreduce.all_reduce(comm_tensor, algorithm="hierarchical")
    assert torch.equal(comm_tensor, before), "a refused call must leave the tensor alone"
    ringreduce.all_reduce(comm_tensor)  # auto: the flat algorithms only
    doubled = torch.arange(10.0) * (rank + 1)
    ringreduce.all_reduce(doubled, algorithm="doubling")  # flat: one rank per host, none to go through
    assert torch.equal(doubled, torch.arange(10.0) * 6)
    return comm_tensor.tolist()


def test_hierarchical_is_refused_where_it_cannot_help_and_auto_runs_flat():
    results = run_ranks(3, _one_rank_per_host, env=_hosts("abc"))
    assert all(r == [3.0 * i + 3.0 for i in range(10)] for r in results)


def _single_host_refusal(rank, world):
    tensor = torch.ones(5)
    with pytest.raises(ValueError, match="every rank on one host"):
        ringreduce.all_reduce(tensor, algorithm="hierarchical", transport="pg")
    assert torch.equal(tensor, torch.ones(5))
    return True


def test_hierarchical_is_refused_on_one_host():
    assert run_ranks(2, _single_host_refusal) == [True, True]


def _backend_collectives(rank, world):
    """The backend under RINGREDUCE_ALGORITHM=hierarchical: what torch's calls reach."""
    outcomes = []
    for numel in (1, 1000, 1 << 20):
        for op in (R.SUM, R.AVG, R.MAX):
            inputs = exact_inputs(world, numel, torch.float32, op)
            mine = inputs[rank].clone()
            dist.all_reduce(mine, op)
            outcomes.append(torch.equal(mine, reference(inputs, op)))
    return outcomes


def test_the_backend_runs_hierarchical_across_hosts():
    layout = LAYOUTS["2+1+2"]
    results = run_ranks(len(layout), _backend_collectives, backend="ringreduce",
                        env=_hosts(layout, RINGREDUCE_ALGORITHM="hierarchical"))
    assert all(all(r) for r in results) and len(results[0]) == 9


def _chunked_algorithm_ran(call):
    """The algorithm the profiler's range of `call()` names (what ran, auto resolved)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        call()
    (ran,) = {e.kwinputs["algorithm"] for e in prof.events() if e.name.startswith("ringreduce:")}
    return ran


def _chunked_every_dtype_and_op(rank, world, algorithms):
    """Reduce-scatter and all-gather of exact inputs against the float64 (int64) reference, with a
    contiguous input (read where it is) and a strided one (copied first), ragged chunk sizes."""
    checks = 0
    for algorithm in algorithms:
        for chunk in (0, 1, 3, 3_001):  # 3,001: up to 6 segments of 4 KiB a chunk (10,007 took 40% longer)
            for dtype in ALL_DTYPES:
                for op in ops_for(dtype):
                    inputs = exact_inputs(world, chunk * world, dtype, op)
                    expected = reference(inputs, op)[rank * chunk:(rank + 1) * chunk]
                    mine = inputs[rank].clone()
                    output = torch.full((chunk,), 7, dtype=dtype)
                    ringreduce.reduce_scatter_tensor(output, mine, op, algorithm=algorithm, segment_bytes=4096)
                    assert torch.equal(output, expected), f"{algorithm} chunk={chunk} {dtype} {op}"
                    assert torch.equal(mine, inputs[rank]), "the input must be left as it was"
                    strided = torch.stack([mine, mine]).t()[:, 0]
                    ringreduce.reduce_scatter_tensor(output, strided, op, algorithm=algorithm)
                    assert torch.equal(output, expected), f"{algorithm} strided chunk={chunk} {dtype} {op}"
                    checks += 1
                gathered = torch.zeros(chunk * world, dtype=dtype)
                ringreduce.all_gather_into_tensor(gathered, inputs[rank][:chunk], algorithm=algorithm,
                                                  segment_bytes=4096)
                assert torch.equal(gathered, torch.cat([t[:chunk] for t in inputs])), f"{algorithm} {chunk} {dtype}"
        # Dtypes moved as bytes (bool, complex) go through the same path.
        flags = torch.tensor([rank % 2 == 0, True, False])
        everyone = torch.empty(3 * world, dtype=torch.bool)
        ringreduce.all_gather_into_tensor(everyone, flags, algorithm=algorithm)
        assert everyone.tolist() == [v for r in range(world) for v in (r % 2 == 0, True, False)]
    piece = torch.ones(world * 5)
    ran = _chunked_algorithm_ran(lambda: ringreduce.reduce_scatter_tensor(torch.empty(5), piece))
    ran_gather = _chunked_algorithm_ran(lambda: ringreduce.all_gather_into_tensor(piece, torch.ones(5)))
    (comm,) = ringreduce._groups.group_state(None).communicators.values()
    return checks, ran, ran_gather, ringreduce._groups.host_summary(comm).split("; ")[-1]


@pytest.mark.parametrize("counts, pays", [
    ([2, 2], True), ([4, 4, 4], True), ([3, 2], True), ([4, 4, 3], True), ([8, 8, 7, 8], True),
    ([2, 1, 2], False), ([2, 2, 1], False), ([3, 3, 1], False), ([3, 2, 1], False), ([1, 1], False), ([4], False),
])
def test_reduce_scatter_and_all_gather_are_hierarchical_where_the_links_carry_fewer_chunks(counts, pays):
    """Each column's ring crosses a host's link with hosts - 1 chunks, widest x (hosts - 1) in all (a host
    short of ranks carries its missing columns too), against the flat ring's world - 1; the host labels'
    order does not matter."""
    host_of_rank = [host for host, count in enumerate(counts) for _ in range(count)]
    assert _C.chunked_hierarchy_pays(host_of_rank) == pays
    assert _C.chunked_hierarchy_pays(host_of_rank[::-1]) == pays


# (The flat ring's reduce-scatter and all-gather across hosts: the 2+1+2 layout's test below.)
@pytest.mark.parametrize("layout", sorted(CHUNKED_LAYOUTS))
def test_reduce_scatter_and_all_gather_are_exact_and_hierarchical_where_they_move_fewer_bytes(layout):
    hosts = CHUNKED_LAYOUTS[layout]
    outcomes = run_ranks(len(hosts), _chunked_every_dtype_and_op, ("hierarchical",), env=_hosts(hosts))
    assert {o[0] for o in outcomes} == {outcomes[0][0]} and outcomes[0][0] > 0
    assert {o[1:] for o in outcomes} == {("hierarchical", "hierarchical", "all-reduce hierarchical or flat, "
                                          "reduce-scatter and all-gather hierarchical")}, "auto: hierarchical here"


def _uneven_chunked(rank, world):
    mine = torch.arange(world * 4.0) + rank
    output = torch.full((4,), -1.0)
    with pytest.raises(ValueError, match=r"reduce_scatter_tensor: algorithm 'hierarchical' runs where it moves fewer "
                                         r"bytes across hosts than the ring: several hosts of 2 or more ranks, the most "
                                         r"ranks on a host times \(hosts - 1\) below ranks - 1 \(2x2, 3\+2, 4\+4\+3\); "
                                         r"this group's pg communicator has 3 hosts \(2\+1\+2 ranks\)"):
        ringreduce.reduce_scatter_tensor(output, mine, algorithm="hierarchical")
    with pytest.raises(ValueError, match="algorithm 'central' does not run here"):
        ringreduce.all_gather_into_tensor(mine, output, algorithm="central")
    assert torch.equal(output, torch.full((4,), -1.0)) and torch.equal(mine, torch.arange(world * 4.0) + rank)
    return _chunked_every_dtype_and_op(rank, world, ("auto",))


def test_where_hierarchical_chunks_move_no_fewer_bytes_they_are_refused_and_auto_runs_the_ring():
    """2+1+2: each column's ring would cross every host's link with 2 chunks, 4 in all, as the flat ring."""
    outcomes = run_ranks(5, _uneven_chunked, env=_hosts(LAYOUTS["2+1+2"]))
    assert {o[1:] for o in outcomes} == {("ring", "ring", "all-reduce hierarchical or flat, reduce-scatter and "
                                          "all-gather flat (on these hosts, hierarchical ones would move no fewer "
                                          "bytes)")} and outcomes[0][0] > 0


# kHierarchicalBlockBytes of float32 across the 4 chunks of 2x2 (HostLayout::column_slots; 3+2 has 6,
# so smaller blocks): a block holds this many of each chunk.
_BLOCK_ELEMS = (4 << 20) // 4 // 4
_CHUNK = 4 * _BLOCK_ELEMS + 12_345
_STAGED_BYTES = 3 * (4 << 20)  # kHierarchicalStagedBlocks blocks


def _many_blocks(rank, world):
    """A reduce-scatter and all-gather of more blocks than are staged at once (5 on 2x2, 7 on 3+2, the last
    ragged), so the staged blocks are reused."""
    chunk = _CHUNK
    inputs = [(torch.arange(chunk * world) % 1009 + 3 * r).float() for r in range(world)]
    mine = inputs[rank].clone()
    share = torch.full((chunk,), -1.0)
    ringreduce.reduce_scatter_tensor(share, mine, algorithm="hierarchical")
    exact = torch.stack([t.double() for t in inputs]).sum(0)[rank * chunk:(rank + 1) * chunk]
    assert torch.equal(share.double(), exact) and torch.equal(mine, inputs[rank])
    gathered = torch.full((chunk * world,), -1.0)
    ringreduce.all_gather_into_tensor(gathered, share, algorithm="hierarchical")
    assert torch.equal(gathered.double(), torch.stack([t.double() for t in inputs]).sum(0))
    # An output that is this rank's own chunk of the input: read and written in one buffer, so the
    # call works on a copy instead.
    whole = inputs[rank].clone()
    ringreduce.reduce_scatter_tensor(whole[rank * chunk:(rank + 1) * chunk], whole, algorithm="hierarchical")
    assert torch.equal(whole[rank * chunk:(rank + 1) * chunk].double(), exact)
    assert torch.equal(whole[:rank * chunk], inputs[rank][:rank * chunk])
    (comm,) = ringreduce._groups.group_state(None).communicators.values()
    return comm.working_bytes()


@pytest.mark.parametrize("layout", sorted(CHUNKED_LAYOUTS))
def test_reduce_scatter_and_all_gather_reuse_a_bounded_working_memory(layout):
    """17 MiB per rank through both on 2x2 (21 on 3+2), exact, with at most 12 MiB of working memory kept
    (not the buffer's size twice over, as when the pipeline ran ahead and the reduce-scatter reduced into a
    copy), beside the copy of the input that a reduce-scatter whose output lies inside its input needs."""
    hosts = CHUNKED_LAYOUTS[layout]
    kept = run_ranks(len(hosts), _many_blocks, env=_hosts(hosts))
    input_bytes = len(hosts) * _CHUNK * 4
    assert all(input_bytes < k <= input_bytes + _STAGED_BYTES for k in kept), kept


def _floats_through_the_backend(rank, world):
    """What FSDP and ZeRO call, through init_process_group("ringreduce"), on random floats: every
    rank's share against the float64 sum, and the gathered pieces bitwise."""
    gen = torch.Generator().manual_seed(rank)
    data = torch.randn(world * 300_007, generator=gen)
    everyone = [torch.empty_like(data) for _ in range(world)]
    dist.all_gather(everyone, data)
    exact = torch.stack([t.double() for t in everyone]).sum(0).chunk(world)[rank]
    share = torch.empty(300_007)
    dist.reduce_scatter_tensor(share, data)
    torch.testing.assert_close(share.double(), exact, rtol=1e-5, atol=1e-5)
    gathered = torch.empty(world * 300_007)
    dist.all_gather_into_tensor(gathered, share)
    return gathered.view(torch.int32).double().sum().item()


def test_the_backends_reduce_scatter_and_all_gather_across_hosts():
    layout = LAYOUTS["2x2"]
    digests = run_ranks(len(layout), _floats_through_the_backend, backend="ringreduce", env=_hosts(layout))
    assert len(set(digests)) == 1
