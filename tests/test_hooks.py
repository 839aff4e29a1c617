"""DDP communication hooks against torch's built-in allreduce, on 2 and 3 ranks."""

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ringreduce
from multiproc import run_ranks

STEPS = 20
HOOKS = {"builtin": None, **ringreduce.hooks.BY_NAME}
# Documented tolerance of the 16-bit hooks on the first step's averaged gradient, relative to the
# tensor's largest gradient: float16 keeps 11 significant bits, bfloat16 8, and each of the world-1
# reductions and the compression rounds once.
WIRE_TOLERANCE = {"ring_fp16": 2e-3, "ring_bf16": 2e-2}


class Net(nn.Module):
    """An MLP plus tiny parameters, so some buckets hold fewer elements than there are ranks."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 3))
        self.scale = nn.Parameter(torch.ones(1))
        self.shift = nn.Parameter(torch.zeros(2))

    def forward(self, x):
        out = self.body(x) * self.scale
        return out + torch.cat([self.shift, self.shift[:1]])


def _train(rank, world, hook, bucket_cap_mb):
    torch.manual_seed(0)
    model = DDP(Net(), bucket_cap_mb=bucket_cap_mb)
    if hook is not None:
        model.register_comm_hook(None, hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3)
    gen = torch.Generator().manual_seed(100 + rank)
    first_grads, losses = None, []
    for step in range(STEPS):
        x = torch.randn(64, 32, generator=gen)
        y = (x[:, :3] * 2).softmax(1).argmax(1)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if step == 0:
            first_grads = [p.grad.clone() for p in model.parameters()]
        optimizer.step()
        losses.append(loss.item())
    return model, first_grads, [p.detach().clone() for p in model.parameters()], losses


def _parity(rank, world, bucket_cap_mb):
    runs = {name: _train(rank, world, hook, bucket_cap_mb) for name, hook in HOOKS.items()}
    _, base_grads, base_params, _ = runs["builtin"]
    for name in ("ring", "central", "auto"):
        _, grads, params, _ = runs[name]
        for g, b in zip(grads, base_grads):
            torch.testing.assert_close(g, b, rtol=1e-5, atol=1e-6 * b.abs().max().item(), msg=f"{name} first step")
        for p, b in zip(params, base_params):
            torch.testing.assert_close(p, b, rtol=1e-3, atol=1e-5 * b.abs().max().item(), msg=f"{name} after {STEPS}")
    for name, tolerance in WIRE_TOLERANCE.items():
        _, grads, _, losses = runs[name]
        for g, b in zip(grads, base_grads):
            error = (g - b).abs().max().item()
            assert error <= tolerance * b.abs().max().item() + 1e-12, f"{name}: first-step error {error}"
        base_losses = runs["builtin"][3]
        assert losses[-1] < 0.8 * losses[0], f"{name}: loss did not fall: {losses[0]} -> {losses[-1]}"
        assert abs(losses[-1] - base_losses[-1]) < 0.05 * base_losses[-1], f"{name}: {losses[-1]} vs {base_losses[-1]}"
    # Registering a second hook is torch's error, not a crash of ours.
    model = runs["ring"][0]
    with pytest.raises(RuntimeError, match="can only be called once"):
        model.register_comm_hook(None, ringreduce.hooks.ring_hook)
    # The loss fell with the ring hook too, and every rank holds the same parameters.
    digest = torch.cat([p.flatten() for p in runs["ring"][2]])
    gathered = [torch.empty_like(digest) for _ in range(world)]
    dist.all_gather(gathered, digest)
    assert all(torch.equal(g, digest) for g in gathered)
    return runs["ring"][3][-1] < runs["ring"][3][0]


@pytest.mark.parametrize("world", [2, 3])
def test_hooks_match_the_builtin_allreduce(world):
    assert all(run_ranks(world, _parity, 0.05))


def test_one_bucket_per_parameter_including_buckets_smaller_than_the_world():
    # A tiny cap puts every parameter in its own bucket: sizes 1, 2, 3, 256, ...
    assert all(run_ranks(3, _parity, 1e-6))


def _hook_returns_before_the_reduction_finishes(rank, world):
    tensor = torch.ones(1 << 22)

    class Bucket:
        def buffer(self):
            return tensor

    future = ringreduce.hooks.ring_hook(None, Bucket())
    pending = not future.done()  # 16 MiB cannot have crossed the ring yet
    future.wait()
    assert torch.equal(future.value(), torch.ones(1 << 22))
    return pending


def test_hooks_are_asynchronous():
    assert any(run_ranks(2, _hook_returns_before_the_reduction_finishes))


def test_hook_state_is_checked():
    with pytest.raises(TypeError, match="HookState"):
        ringreduce.hooks.ring_hook("nccl", None)
