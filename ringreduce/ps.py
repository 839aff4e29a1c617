"""An asynchronous parameter server on ringreduce's transports.

    server = ringreduce.ps.ParameterServer(model.parameters(), lr=0.1, staleness=2)
    for batch in data:
        model.zero_grad()
        loss_fn(model(batch)).backward()
        server.step()          # push this rank's gradients, load the parameters to go on with
    stats = server.close()     # on the server rank: waits for every worker, then reports

One rank of the group (`server_rank`) holds the parameters, flat and float32; every rank is a
worker, the server's own included. A push is applied as it arrives, in arrival order, and answered
with the parameters as they are then: workers never wait for each other, except that none may run
more than `staleness` steps ahead of the slowest worker still pushing (0: synchronous rounds;
None: no bound). The engine (csrc/ps/) moves the bytes over shared memory on one host, or over a
private gloo group per worker across hosts, and applies SGD in C++; Python only checks and wraps.

A worker that dies or times out is dropped (the server says so on stderr and in `stats`) and the
others go on; if the server dies, every worker's next step raises within the group's timeout. The
server rank stops the server (`stop()`, an exception out of a `with` block, Ctrl-C in `close()`,
dropping it, exiting) at once, and every worker is told why.
"""

import datetime

import torch
import torch.distributed as dist

from ringreduce import _C, _groups
from ringreduce._flat import flat_views

TRANSPORTS = ("shm", "pg")
# close() waits for the workers in slices this long, so Ctrl-C reaches it between them.
_CLOSE_WAIT_SLICE_S = 0.1


def _check_params(params):
    params = list(params)
    if not params:
        raise ValueError("ParameterServer needs at least one parameter tensor")
    for i, p in enumerate(params):
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"parameter {i} is a {type(p).__name__}, not a tensor")
        if p.dtype != torch.float32 or p.device.type != "cpu":
            raise TypeError(f"parameter {i} is {p.dtype} on {p.device}; the parameter server holds float32 CPU "
                            "parameters (train a float32 CPU copy, or cast with model.float().cpu())")
    if sum(p.numel() for p in params) == 0:
        raise ValueError("the parameters have no elements: there is nothing to serve")
    return params


class ParameterServer:
    """Collective: every rank of `group` constructs one with the same arguments.

    lr: plain SGD on the server; each push moves the parameters by lr / world_size times its
        gradient, so one push from every worker is one synchronous step of learning rate lr.
    optimizer: instead of lr, a function that makes a torch optimizer for the server's flat
        parameter (e.g. `lambda p: torch.optim.SGD([p], lr=0.1, momentum=0.9)`); each push
        becomes that parameter's gradient, divided by world_size, and one optimizer step.
    staleness: how many steps a worker may run ahead of the slowest (0: synchronous; None: no bound).
    transport: "shm" (every rank on this host) or "pg" (torch.distributed's gloo, any hosts);
        None chooses shm on one host.
    record: keep every applied gradient (`gradients()`) for an exact replay.
    """

    def __init__(self, params, *, lr=None, optimizer=None, staleness=None, server_rank=0, group=None,
                 transport=None, record=False):
        self._params = _check_params(params)
        if (lr is None) == (optimizer is None):
            raise ValueError("pass exactly one of lr (plain SGD) and optimizer (a function making a torch optimizer)")
        if lr is not None and not lr > 0:
            raise ValueError(f"lr={lr!r} must be a positive number")
        if staleness is not None and (not isinstance(staleness, int) or staleness < 0):
            raise ValueError(f"staleness={staleness!r} must be None (no bound) or an int >= 0 (0: synchronous)")
        state = _groups.group_state(group)
        self.rank, self.world_size, self.server_rank = state.rank, state.size, server_rank
        if not 0 <= server_rank < state.size:
            raise ValueError(f"server_rank={server_rank} is not a rank of the group (0..{state.size - 1})")
        if transport is None:
            transport = "shm" if state.single_host() else "pg"
        if transport not in TRANSPORTS:
            raise ValueError(f"transport={transport!r}: the parameter server runs on {', '.join(TRANSPORTS)} (or None)")
        if transport == "shm" and not state.single_host():
            raise ValueError("transport 'shm' needs every rank of the group on one host; use 'pg' or None")
        self.transport = transport
        self.numel = sum(p.numel() for p in self._params)
        self._flat = torch.empty(self.numel)
        self._grad = torch.zeros(self.numel)
        self._flat_of_params = flat_views(self._flat, self._params)
        self._grad_of_params = flat_views(self._grad, self._params)
        store = state.fresh_store("ps")
        timeout_s = _groups.timeout_seconds(state.group)
        if self.rank == server_rank:
            with torch.no_grad():
                self.params = torch.cat([p.detach().reshape(-1) for p in self._params])
            self._server = _C.PsServer(self.params, state.size, self.rank, -1 if staleness is None else staleness,
                                       float(lr or 0.0), self._update(optimizer), record)
            for worker in range(state.size):
                if worker != server_rank:
                    self._server.add_link(worker, self._link(store, worker, 0, timeout_s), timeout_s)
            self._worker = self._server
        else:
            self._server = None
            self._worker = _C.PsWorker(self._link(store, self.rank, 1, timeout_s), self.numel, server_rank)
        self.version = self._worker.join(self._flat)
        self.pushes = 0
        self._closed = False
        self._load()

    def _update(self, optimizer):
        if optimizer is None:
            return None
        param = torch.nn.Parameter(self.params)  # the server's flat parameters, same memory
        made = optimizer(param)
        workers = self.world_size

        def update(grad):
            param.grad = grad / workers
            made.step()
            param.grad = None

        return update

    def _link(self, store, worker, side, timeout_s):
        """The transport between the server (side 0) and `worker` (side 1); collective for those two."""
        pair = dist.PrefixStore(f"{worker}/", store)
        if self.transport == "shm":
            link = _C.shm_transport(pair, side, 2, timeout_s)
        else:
            gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", pair), side, 2,
                                         datetime.timedelta(seconds=timeout_s))
            link = _C.pg_transport(gloo, dist.PrefixStore("notices/", pair), timeout_s)
        link.name_ranks([self.server_rank, worker])  # its errors name the group's ranks
        return link

    def _load(self):
        with torch.no_grad():
            for p, flat in zip(self._params, self._flat_of_params):
                p.copy_(flat)

    def step(self) -> int:
        """Pushes this rank's gradients (each parameter's .grad; None counts as zero), then loads the
        parameters the server answers with into the parameters. Returns their version."""
        self._check_open()
        with torch.no_grad():
            for p, grad in zip(self._params, self._grad_of_params):
                if p.grad is None:
                    grad.zero_()
                else:
                    grad.copy_(p.grad)
        return self._exchange(self._grad)

    def push(self, grad: torch.Tensor) -> torch.Tensor:
        """Pushes one flat float32 gradient of `numel` elements; returns the parameters to go on with (flat)."""
        self._check_open()
        if not isinstance(grad, torch.Tensor):
            raise TypeError(f"grad is a {type(grad).__name__}, not a tensor")
        if grad.dtype != torch.float32 or grad.device.type != "cpu":
            raise TypeError(f"grad is {grad.dtype} on {grad.device}; the server takes float32 CPU gradients")
        if grad.numel() != self.numel:
            raise ValueError(f"grad has {grad.numel()} elements; the server's parameters have {self.numel}")
        self._exchange(grad.detach().reshape(-1).contiguous())
        return self._flat.clone()

    def _exchange(self, grad):
        self.version = self._worker.push(grad, self._flat)
        self.pushes += 1
        self._load()
        return self.version

    def _check_open(self):
        if self._closed:
            raise RuntimeError("this ParameterServer is closed")

    def close(self) -> dict:
        """This rank pushes no more. On the server rank, waits until every worker has left or been
        lost; Ctrl-C during that wait stops the server (every worker is told). Returns stats()."""
        if not self._closed:
            self._closed = True
            self._worker.leave()
            if self._server is not None:
                try:
                    while not self._server.wait(_CLOSE_WAIT_SLICE_S):
                        pass
                except KeyboardInterrupt:
                    self.stop("the server rank was interrupted while waiting for its workers")
                    raise
        return self.stats()

    def stop(self, why="the server rank stopped it"):
        """Server rank: stops the server now, without waiting for the workers to finish: each is told
        at once, and its next step raises, saying `why`. On a worker's rank, the same as close()."""
        if self._server is None:
            self.close()
            return
        self._closed = True
        self._server.stop(f"ringreduce.ps: the parameter server has stopped: {why}")

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        elif self._server is not None:
            # Waiting would let the workers train on without this rank's bound; stop them instead.
            self.stop(f"the server rank left by {exc_type.__name__}: {exc}")
        elif not self._closed:
            self._closed = True
            try:
                self._worker.leave()
            except RuntimeError:
                pass  # the server is gone already; the exception on its way says what happened

    def stats(self) -> dict:
        """This rank's pushes and traffic; on the server rank also every worker's report, the staleness
        of the pushes applied (updates between a worker's read and its push being applied) and the
        workers lost, with why."""
        out = {"rank": self.rank, "pushes": self.pushes, "version": self.version,
               "bytes_sent": self._worker.bytes_sent, "bytes_received": self._worker.bytes_received}
        if self._server is None:
            return out
        workers = self._server.reports()
        applied = sum(w["pushes"] for w in workers)
        out.update(
            version=self._server.version,
            workers=workers,
            staleness_mean=sum(w["staleness_sum"] for w in workers) / applied if applied else 0.0,
            staleness_max=max(w["staleness_max"] for w in workers),
            lost={rank: w["lost"] for rank, w in enumerate(workers) if w["lost"] is not None},
        )
        return out

    def log(self):
        """Server rank: every applied push in order, as (worker, its step, version read, version applied to)."""
        return self._server_only("log")()

    def gradients(self):
        """Server rank, with record=True: the gradients applied, in log order."""
        return self._server_only("gradients")()

    def _server_only(self, name):
        if self._server is None:
            raise RuntimeError(f"{name}() is kept on the server rank ({self.server_rank}), not on rank {self.rank}")
        return getattr(self._server, name)
