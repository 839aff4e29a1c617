"""Local SGD: every rank steps on its own gradients, and the parameters are averaged every `period` steps.

    averager = ringreduce.LocalSGD(model.parameters(), period=4)
    for batch in data:
        ...; loss.backward(); optimizer.step()
        averager.step()        # averages every 4th call, with one fused all-reduce per dtype

The same schedule as torch's PeriodicModelAverager (which also runs on the "ringreduce" backend):
after `warmup_steps` calls it averages on every `period`-th call, counting from the warmup's end.
"""

import torch
import torch.distributed as dist

from ringreduce._flat import flat_views
from ringreduce.collectives import all_reduce


def average_parameters(params, group=None, algorithm="ring", transport=None) -> None:
    """Replace each parameter by its mean over the ranks of `group`: one all-reduce per dtype, of
    every parameter of that dtype packed into one flat buffer. Collective."""
    by_dtype = {}
    for i, p in enumerate(params):
        if not p.dtype.is_floating_point:
            raise TypeError(f"parameter {i} is {p.dtype}: only floating-point parameters can be averaged; leave it "
                            "out (nothing was averaged)")
        by_dtype.setdefault(p.dtype, []).append(p)
    with torch.no_grad():
        for same in by_dtype.values():
            flat = torch.cat([p.detach().reshape(-1) for p in same])
            all_reduce(flat, dist.ReduceOp.AVG, group=group, algorithm=algorithm, transport=transport)
            for p, mean in zip(same, flat_views(flat, same)):
                p.copy_(mean)


class LocalSGD:
    """Averages `params` every `period` calls of step(), after `warmup_steps` calls (during which
    the caller is expected to keep the ranks in step some other way, e.g. DDP)."""

    def __init__(self, params, period, warmup_steps=0, group=None, algorithm="ring", transport=None):
        if not isinstance(period, int) or period < 1:
            raise ValueError(f"period={period!r} must be an int >= 1 (steps between averagings)")
        if not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"warmup_steps={warmup_steps!r} must be an int >= 0")
        self.params = list(params)
        self.period, self.warmup_steps = period, warmup_steps
        self.group, self.algorithm, self.transport = group, algorithm, transport
        self.steps = 0
        self.averagings = 0

    def step(self) -> bool:
        """Counts a step; averages when the schedule says so. Returns whether it averaged."""
        due = self.steps >= self.warmup_steps and (self.steps - self.warmup_steps) % self.period == 0
        self.steps += 1
        if due:
            # As torch's model averagers: parameters without a gradient (frozen, unused) are left alone.
            params = [p for p in self.params if p.grad is not None]
            average_parameters(params, self.group, self.algorithm, self.transport)
            self.averagings += 1
        return due
