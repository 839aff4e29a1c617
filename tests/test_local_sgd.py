"""Local SGD on the engine: torch's own post-local SGD (hook, optimizer and averager) on the
"ringreduce" backend, and ringreduce.LocalSGD, both against a float64 replay of the schedule."""

import pytest
import torch

from multiproc import run_ranks

STEPS, WARMUP, PERIOD, LR, NUMEL = 9, 2, 3, 0.1, 37


def _constant(rank):
    """Each rank's gradient, the same at every step (the loss is linear): the ranks drift apart."""
    return torch.linspace(0.0, 1.0, NUMEL, dtype=torch.float64) * (rank + 1) - rank


def _expected(world, ddp_warmup):
    """Every rank's parameters after each step, in float64."""
    params = [torch.ones(NUMEL, dtype=torch.float64) for _ in range(world)]
    history = []
    for step in range(STEPS):
        mean_grad = sum(_constant(r) for r in range(world)) / world
        for r in range(world):
            params[r] = params[r] - LR * (mean_grad if ddp_warmup and step < WARMUP else _constant(r))
        if step >= WARMUP and (step - WARMUP) % PERIOD == 0:
            mean = sum(params) / world
            params = [mean.clone() for _ in range(world)]
        history.append([p.clone() for p in params])
    return history


class _Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(NUMEL))

    def forward(self, x):
        return (self.weight * x).sum()


def _torch_post_local_sgd(rank, world):
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as post_local
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
    from torch.distributed.optim import PostLocalSGDOptimizer

    model = torch.nn.parallel.DistributedDataParallel(_Linear())
    # Subgroups of one rank: after the warmup, DDP leaves each rank's gradients its own.
    alone, _ = dist.new_subgroups(group_size=1)
    model.register_comm_hook(post_local.PostLocalSGDState(process_group=None, subgroup=alone,
                                                          start_localSGD_iter=WARMUP), post_local.post_localSGD_hook)
    optimizer = PostLocalSGDOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                      PeriodicModelAverager(period=PERIOD, warmup_steps=WARMUP))
    history = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        model(_constant(rank).float()).backward()
        optimizer.step()
        history.append(model.module.weight.detach().tolist())
    return history


def _ringreduce_local_sgd(rank, world, algorithm):
    import ringreduce
    import ringreduce.local_sgd

    calls = []
    reduce = ringreduce.local_sgd.all_reduce
    ringreduce.local_sgd.all_reduce = lambda *args, **kwargs: calls.append(1) or reduce(*args, **kwargs)
    weight = torch.nn.Parameter(torch.ones(NUMEL))
    untouched = torch.nn.Parameter(torch.full((5,), 2.0))  # no gradient: averaging keeps it as it is
    optimizer = torch.optim.SGD([weight], lr=LR)
    averager = ringreduce.LocalSGD([weight, untouched], period=PERIOD, warmup_steps=WARMUP, algorithm=algorithm)
    history = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        (weight * _constant(rank).float()).sum().backward()
        optimizer.step()
        averager.step()
        history.append(weight.detach().tolist())
    assert averager.averagings == len(calls) == len(range(WARMUP, STEPS, PERIOD))
    assert untouched.detach().tolist() == [2.0] * 5
    return history


def _check(histories, expected):
    world = len(histories)
    for step, want in enumerate(expected):
        for r in range(world):
            torch.testing.assert_close(torch.tensor(histories[r][step], dtype=torch.float64), want[r], rtol=0, atol=1e-5)
        if step >= WARMUP and (step - WARMUP) % PERIOD == 0:
            assert all(h[step] == histories[0][step] for h in histories), f"ranks differ after averaging at step {step}"


def test_torchs_post_local_sgd_runs_on_the_ringreduce_backend():
    _check(run_ranks(2, _torch_post_local_sgd, backend="ringreduce"), _expected(2, ddp_warmup=True))


@pytest.mark.parametrize("algorithm", ["ring", "auto"])
def test_local_sgd_averages_every_period_with_one_fused_all_reduce(algorithm):
    # No DDP here: during the warmup the ranks drift like after it; only the averaging keeps them together.
    _check(run_ranks(3, _ringreduce_local_sgd, algorithm), _expected(3, ddp_warmup=False))


def test_a_bad_period_is_refused():
    import ringreduce

    with pytest.raises(ValueError, match="period"):
        ringreduce.LocalSGD([], period=0)
    with pytest.raises(ValueError, match="warmup_steps"):
        ringreduce.LocalSGD([], period=2, warmup_steps=-1)


def _frozen_and_integer_parameters(rank, world):
    import ringreduce

    trained = torch.nn.Parameter(torch.full((4,), float(rank)))
    frozen = torch.nn.Parameter(torch.full((3,), float(rank)))
    trained.grad = torch.zeros(4)  # `frozen` has no gradient, as after a backward that did not reach it
    ringreduce.LocalSGD([trained, frozen], period=1).step()
    averaged = trained.tolist(), frozen.tolist()
    with torch.no_grad():
        trained.fill_(10.0 + rank)
    with pytest.raises(TypeError, match="parameter 1 is torch.int64: only floating-point parameters"):
        ringreduce.average_parameters([trained, torch.arange(3) + rank])
    return averaged, trained.tolist()


def test_local_sgd_skips_parameters_without_gradients_and_integers_are_refused_before_anything_moves():
    results = run_ranks(2, _frozen_and_integer_parameters)
    for rank, ((trained, frozen), after_refusal) in enumerate(results):
        assert trained == [0.5] * 4 and frozen == [float(rank)] * 3
        assert after_refusal == [10.0 + rank] * 4, "a refused call must leave every parameter alone"
