"""Error feedback: all_reduce(compress=..., residual=...) keeps what each rounding on the link
between hosts dropped, and ringreduce.hooks.compressed_hook adds it to the next step's gradient.
2 emulated hosts x 2 ranks (RINGREDUCE_HOST_NAME), as in tests/test_compression.py.

What is checked in closed form: each rank adds the errors of the roundings it made, so the residuals
summed over the ranks gain exactly the float64 sum minus the result, up to float32's own additions.
Over T steps of a fixed gradient the hook then applies T times the exact average minus the residuals
left (one step's rounding), while without feedback the same rounding is lost T times."""

import functools

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import ringreduce
from multiproc import run_ranks

R = dist.ReduceOp
LAYOUT = "aabb"
FLOAT32_STEP = 2.0 ** -23  # float32's relative spacing: each addition rounds within it
STEPS = 8


def _host_env(rank):
    return {"RINGREDUCE_HOST_NAME": f"host-{LAYOUT[rank]}"}


def _gathered(tensor):
    everyone = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, tensor)
    return torch.stack(everyone).double()


def _residuals(rank, world):
    for compress in ("int8", "bf16"):
        for numel in (1, 1003, 99_991, 1_100_003):  # the last in two pipeline blocks
            gen = torch.Generator().manual_seed(11 * rank + numel % 83)
            data = torch.randn(numel, generator=gen)
            inputs = _gathered(data)
            exact, magnitudes = inputs.sum(0), inputs.abs().sum(0)
            start = 0.5  # residuals gain: what was there stays
            residual = torch.full((numel,), start)
            mine, without = data.clone(), data.clone()
            ringreduce.all_reduce(mine, compress=compress, residual=residual)
            ringreduce.all_reduce(without, compress=compress)
            assert torch.equal(mine, without), f"{compress} numel={numel}: the residual changed the sum"
            dropped = exact - mine.double()
            kept = _gathered(residual).sum(0) - world * start
            tolerance = (magnitudes * (world + 2) + world * start) * FLOAT32_STEP
            assert ((kept - dropped).abs() <= tolerance).all(), \
                f"{compress} numel={numel}: kept {(kept - dropped).abs().max().item()} off what was dropped"
            if numel > 1:  # rounding did happen: what was kept is far above the tolerance
                assert dropped.abs().max() > 100 * tolerance.max(), (compress, numel)

    tensor = torch.arange(5000, dtype=torch.float32) / 3 + rank
    residual = torch.zeros(5000)
    # Exact sums drop nothing: a group inside one host, and a dtype that is not compressed.
    host_groups = {host: dist.new_group([r for r in range(world) if LAYOUT[r] == host]) for host in sorted(set(LAYOUT))}
    ringreduce.all_reduce(tensor.clone(), group=host_groups[LAYOUT[rank]], compress="int8", residual=residual)
    ringreduce.all_reduce(tensor.double(), compress="int8", residual=residual)
    assert torch.equal(residual, torch.zeros(5000))
    # Bad residuals are refused, naming what is wrong, and leave the tensor as it was.
    before = tensor.clone()
    for bad, op, wrong in ((residual, R.AVG, "keeps the rounding errors of a SUM only"),
                           (residual.double(), R.SUM, "must be a contiguous float32 CPU tensor"),
                           (residual[::2], R.SUM, "must be a contiguous float32 CPU tensor"),
                           (residual[:10], R.SUM, "must hold as many elements as the tensor"),
                           (tensor, R.SUM, "must not share memory with the tensor")):
        with pytest.raises(ValueError, match=wrong):
            ringreduce.all_reduce(tensor, op, compress="int8", residual=bad)
    with pytest.raises(TypeError, match="residual must be a torch.Tensor"):
        ringreduce.all_reduce(tensor, compress="int8", residual=[0.0] * 5000)
    assert torch.equal(tensor, before)
    return True


def test_residuals_keep_exactly_what_rounding_dropped():
    assert run_ranks(len(LAYOUT), _residuals, env=_host_env) == [True] * len(LAYOUT)


class Weights(torch.nn.Module):
    def __init__(self, numel):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(numel))

    def forward(self, c):
        return (self.w * c).sum()  # a fixed gradient: c


def _fixed_gradient(rank, world, compress, use_error_feedback):
    """STEPS of SGD (lr 1) on a gradient fixed per rank: returns the largest error of what was applied
    in all against STEPS times the exact average, and of that plus the residuals left, both relative
    to the largest exact value."""
    numel = 5003  # ragged: 19 full int8 blocks and a short one
    gradient = torch.randn(numel, generator=torch.Generator().manual_seed(rank)) * torch.linspace(0.1, 3, numel)
    model = DDP(Weights(numel))
    state = ringreduce.hooks.CompressionState(compress=compress, use_error_feedback=use_error_feedback)
    model.register_comm_hook(state, ringreduce.hooks.compressed_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    for _ in range(STEPS):
        optimizer.zero_grad()
        model(gradient).backward()
        optimizer.step()
    applied = -model.module.w.detach().double()
    exact = STEPS * _gathered(gradient).mean(0)
    residuals = sum(state.error_dict.values(), torch.zeros(numel)) if state.use_error_feedback else torch.zeros(numel)
    kept = _gathered(residuals).sum(0)
    scale = exact.abs().max().item()
    return ((applied - exact).abs().max().item() / scale, (applied + kept - exact).abs().max().item() / scale,
            state.use_error_feedback, len(state.error_dict))


def _feedback_converges(rank, world):
    with_feedback = _fixed_gradient(rank, world, "int8", None)
    without = _fixed_gradient(rank, world, "int8", False)
    bf16 = _fixed_gradient(rank, world, "bf16", None)
    return with_feedback, without, bf16


def test_feedback_applies_the_exact_sum_over_the_steps_and_without_it_the_error_grows():
    results = run_ranks(len(LAYOUT), _feedback_converges, env=_host_env)
    (error, closed, feedback, buckets), (error_without, _, feedback_without, _), bf16 = results[0]
    assert feedback and buckets == 1 and not feedback_without  # int8's default: feedback on
    assert not bf16[2] and bf16[3] == 0  # bf16's default: off, no residual kept
    # With feedback what was applied plus what is still kept is the exact sum (float32 additions
    # over the steps, a few per step); what is kept is one step's rounding, so the error does not
    # grow with the steps.
    assert closed <= 4 * STEPS * FLOAT32_STEP, closed
    # Without it each step drops the same rounding again: STEPS times as much.
    assert error * STEPS / 2 < error_without, (error, error_without)


class _Bucket:
    """What the hook state reads of DDP's GradBucket."""

    def __init__(self, index, parameters):
        self._index, self._parameters = index, parameters
        self._buffer = torch.zeros(sum(p.numel() for p in parameters))

    def index(self):
        return self._index

    def parameters(self):
        return self._parameters

    def buffer(self):
        return self._buffer


def test_a_residual_follows_its_parameters_when_the_buckets_are_rebuilt():
    a, b, c = (torch.nn.Parameter(torch.zeros(n)) for n in (3, 5, 2))
    state = ringreduce.hooks.CompressionState(compress="int8")
    assert state.use_error_feedback
    state.residual(_Bucket(0, [a, b])).copy_(torch.arange(1.0, 9.0))
    state.residual(_Bucket(1, [c])).copy_(torch.tensor([20.0, 30.0]))
    # Rebuilt: c joins b's bucket at index 0, a moves to index 1 on its own.
    assert torch.equal(state.residual(_Bucket(0, [c, b])), torch.tensor([20.0, 30, 4, 5, 6, 7, 8]))
    assert torch.equal(state.residual(_Bucket(1, [a])), torch.tensor([1.0, 2, 3]))
    assert state.residual(_Bucket(1, [a])) is state.error_dict[1]  # the same layout keeps its tensor
    with pytest.raises(ValueError, match="compress must be 'bf16', 'fp16' or 'int8'"):
        ringreduce.hooks.CompressionState(compress=None)
    with pytest.raises(TypeError, match="takes a ringreduce.hooks.CompressionState"):
        ringreduce.hooks.compressed_hook(None, _Bucket(0, [a]))
