"""Synchronous DDP that outlives a dead rank, or a dead host: the survivors shrink the group and go
on from the last step they all hold, with no checkpoint and no restart.

    python examples/elastic_ddp.py --kill-rank 3 --kill-step 20 --plot elastic.png   # 4 CPU ranks here
    python examples/elastic_ddp.py --trials 50               # kills at random ranks, steps and moments
    python examples/elastic_ddp.py --trials 20 --optimizer adam
    # Several hosts: on each host h of H, host 0's address and a free port (host 0 keeps the store):
    python examples/elastic_ddp.py --nnodes H --node-rank h --master-addr A --master-port P --kill-node 1
    # The same on 2 emulated hosts of 2 ranks (root; ringreduce.bench.hosts), a host or a rank killed:
    python examples/elastic_ddp.py --emulated-hosts 2 --nproc 2 --trials 20

How it is launched matters. torchrun's agent stops every worker of a host when one fails, and
restarts them all; here each host's launcher (this script) waits for its own ranks only, so a dead
rank ends alone. Host 0's launcher keeps the group's store (a TCPStore): the store is the one thing
the group cannot lose, so it lives outside every rank.

Recovery: every survivor raises a DistBackendError (ringreduce.RanksLostError) naming the same lost
ranks, shrinks the default group (ringreduce.shrink), adopts the parameters, optimizer state and
step of the survivor furthest ahead (ringreduce.sync_state: a death can let some survivors finish
the step in flight while others fail it), and builds DDP again on the shrunk group. Nothing is lost
but the step in flight where no survivor finished it, and that is done again. Every rank keeps its
batch size, so the global batch shrinks with the group, and the learning rate follows it (the linear
scaling rule: lr in proportion to the global batch), so each sample weighs as much after the fault.
"""

import argparse
import datetime
import hashlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ringreduce

FEATURES, HIDDEN, CLASSES, SAMPLES = 32, 256, 10, 8192
# Where in a step a rank dies: while its peers wait for it in the backward's all-reduce, between two
# steps (its peers find out in the next step's first collective), or at a random instant of the step
# (anywhere: the forward, an all-reduce half done, the optimizer's step).
KILL_POINTS = ("backward", "between", "instant")
# The random instant is up to this long after the kill step starts: about ten steps here (about 2 ms
# a step, 4 CPU ranks), so the kill lands at any point of a step, the optimizer's too.
INSTANT_WITHIN_S = 0.02
# Store ports of the jobs on emulated hosts: one per trial, so a port still closing is never reused.
FIRST_TRIAL_PORT = 29600


def make_data():
    """Inputs from a fixed seed, labelled by a random teacher network: something to learn, nothing to download."""
    gen = torch.Generator().manual_seed(1234)
    teacher = nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, CLASSES))
    for p in teacher.parameters():
        p.data = torch.randn(p.shape, generator=gen)
    inputs = torch.randn(SAMPLES, FEATURES, generator=gen)
    with torch.no_grad():
        return inputs, teacher(inputs).argmax(1)


def die(store, point):
    """This rank's end, as a crash: SIGKILL, no cleanup. The fault's time goes to the store first."""
    store.compare_set("fault", "", json.dumps({"time": time.time(), "point": point}))
    os.kill(os.getpid(), signal.SIGKILL)


def train(local, args):
    torch.set_num_threads(1)
    rank = args.node_rank * args.nproc + local
    world = args.nnodes * args.nproc
    store = dist.TCPStore(args.master_addr, args.master_port, is_master=False,
                          timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("ringreduce", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    dying = rank == args.kill_rank or (args.kill_node is not None and rank // args.nproc == args.kill_node)
    inputs, labels = make_data()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))
    ddp = DDP(model)
    optimizer = (torch.optim.Adam(model.parameters(), lr=args.lr / 10) if args.optimizer == "adam" else
                 torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9))
    loss_fn = nn.CrossEntropyLoss()
    losses, done, fault_step, recovered = [], 0, None, None
    while done < args.steps:
        if dying and done == args.kill_step and args.kill_point == "between":
            die(store, "between")
        if dying and done == args.kill_step and args.kill_point == "instant":
            threading.Timer(args.kill_delay, die, (store, "instant")).start()
        try:
            group_rank, group_size = dist.get_rank(), dist.get_world_size()
            picks = torch.randint(SAMPLES, (args.batch,), generator=torch.Generator().manual_seed(done * 1000 + group_rank))
            optimizer.zero_grad()
            loss = loss_fn(ddp(inputs[picks]), labels[picks])
            if dying and done == args.kill_step and args.kill_point == "backward":
                die(store, "backward")
            loss.backward()
            optimizer.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean)
        except dist.DistBackendError as error:  # ringreduce.RanksLostError, or as torch's backward carries it
            lost = getattr(error, "lost_ranks", None) or ringreduce.lost_ranks()
            old_size, fault_step = group_size, done
            while True:
                try:
                    ringreduce.shrink(None, lost)
                    break
                except ringreduce.RanksLostError as more:  # another rank died meanwhile
                    lost = more.lost_ranks
            done = ringreduce.sync_state(done, model, optimizer)  # the state of the survivor furthest ahead
            ddp = DDP(model)
            for param_group in optimizer.param_groups:
                param_group["lr"] *= dist.get_world_size() / old_size
            recovered = "pending"
            continue
        losses.append((done, float(mean) / group_size))
        done += 1
        if recovered == "pending":
            recovered = time.time() - json.loads(store.get("fault"))["time"]
    store.set(f"result/{rank}", json.dumps({"losses": losses, "fault_step": fault_step, "recovery_s": recovered,
                                            "world": dist.get_world_size(), "state": state_digest(done, model, optimizer)}))
    dist.destroy_process_group()


def state_digest(done, model, optimizer):
    """A hash of every bit of the step, the parameters and the optimizer's state (momentum, Adam's moments)."""
    def bits(state):
        if isinstance(state, torch.Tensor):
            return state.detach().reshape(-1).view(torch.uint8).numpy().tobytes()
        if isinstance(state, dict):
            return b"".join(repr(key).encode() + bits(value) for key, value in state.items())
        if isinstance(state, (list, tuple)):
            return b"".join(bits(value) for value in state)
        return repr(state).encode()
    return hashlib.sha256(bits([done, model.state_dict(), optimizer.state_dict()])).hexdigest()


def run(args):
    """One job: this host's ranks (and, on host 0, the store); returns host 0's summary, or None."""
    store = None
    if args.node_rank == 0:  # the group's store, in the launcher: it outlives every rank
        store = dist.TCPStore(args.master_addr, args.master_port, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=60))
        args.master_port = store.port
    # forkserver: clean ranks, as spawn, forked from one process that has imported torch (train_ddp.launch).
    procs = mp.start_processes(train, args=(args,), nprocs=args.nproc, join=False, start_method="forkserver")
    for proc in procs.processes:
        proc.join(timeout=args.timeout)
    codes = [proc.exitcode for proc in procs.processes]
    for proc in procs.processes:
        if proc.is_alive():
            proc.kill()
    if store is None:
        return None
    world = args.nnodes * args.nproc
    results = {r: json.loads(store.get(f"result/{r}")) for r in range(world) if store.check([f"result/{r}"])}
    return {"exit_codes": codes, "results": results, "fault": json.loads(store.get("fault")) if store.check(["fault"]) else None}


def check(summary, args):
    """What a finished job must show: the survivors all finished with identical parameters, past the fault."""
    results = summary["results"]
    world = args.nnodes * args.nproc
    dead = {args.kill_rank} if args.kill_rank is not None else set(range(args.kill_node * args.nproc,
                                                                          (args.kill_node + 1) * args.nproc))
    survivors = sorted(set(range(world)) - dead)
    problems = []
    if sorted(results) != survivors:
        problems.append(f"results from ranks {sorted(results)}, survivors are {survivors}")
    if len({r["state"] for r in results.values()}) > 1:
        problems.append("survivors' step, parameters or optimizer state differ")
    for rank, result in results.items():
        if result["recovery_s"] is None or result["world"] != len(survivors):
            problems.append(f"rank {rank} did not recover onto {len(survivors)} ranks: {result}")
    return problems


def summarize(summary, args):
    first = summary["results"][min(summary["results"])]
    recovery = max(r["recovery_s"] for r in summary["results"].values())
    losses = first["losses"]
    print(f"fault at step {first['fault_step']} ({summary['fault']['point']}); recovery "
          f"{recovery:.2f} s (fault to the first step done on {first['world']} ranks)")
    print("loss by step: " + " ".join(f"{s}:{l:.3f}" for s, l in losses[:: max(1, len(losses) // 12)]))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"losses": losses, "fault_step": first["fault_step"], "recovery_s": recovery}, out)
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot([s for s, _ in losses], [l for _, l in losses], lw=1.2)
        ax.axvline(first["fault_step"], color="tab:red", ls="--",
                   label=f"rank lost at step {first['fault_step']}; back in {recovery:.2f} s")
        ax.set_xlabel("step")
        ax.set_ylabel("training loss (mean over ranks)")
        ax.set_title(f"elastic DDP on ringreduce: {args.nnodes * args.nproc} ranks, then {first['world']}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)


def run_on_emulated_hosts(args, hosts, port):
    """One job on `hosts`: this script on each with --node-rank h; returns host 0's summary."""
    kill = ["--kill-node", str(args.kill_node)] if args.kill_node is not None else ["--kill-rank", str(args.kill_rank)]
    procs = [hosts.start(h, [sys.executable, os.path.abspath(__file__), "--nnodes", str(hosts.count), "--node-rank",
                             str(h), "--nproc", str(args.nproc), "--master-addr", hosts.address(0), "--master-port",
                             str(port), "--steps", str(args.steps), "--kill-step", str(args.kill_step), "--kill-point",
                             args.kill_point, "--optimizer", args.optimizer, "--kill-delay", str(args.kill_delay), "--summary", *kill], stdout=subprocess.PIPE, text=True)
             for h in range(hosts.count)]
    outputs = [proc.communicate(timeout=args.timeout)[0] for proc in procs]
    lines = [line for line in outputs[0].splitlines() if line.startswith("{")]
    if not lines:
        return {"results": {}, "fault": None, "exit_codes": [proc.returncode for proc in procs]}
    summary = json.loads(lines[-1])
    summary["results"] = {int(rank): result for rank, result in summary["results"].items()}
    return summary


def trials(args):
    """Kills at random ranks (or hosts), steps and moments; prints how many finished and their recovery times."""
    rng = random.Random(args.seed)
    times, failed, apart = [], [], []
    hosts = None
    if args.emulated_hosts:
        from ringreduce.bench.hosts import EmulatedHosts
        hosts = EmulatedHosts(args.emulated_hosts).__enter__()
        args.nnodes = args.emulated_hosts
    try:
        for trial in range(args.trials):
            run_trial(args, rng, hosts, trial, times, failed, apart)
    finally:
        if hosts is not None:
            hosts.close()
    print(f"{len(times)} of {args.trials} trials finished; recovery s: min {min(times):.2f}, median "
          f"{statistics.median(times):.2f}, max {max(times):.2f}" if times else f"0 of {args.trials} finished")
    print(f"in {len(apart)} of them the survivors were a step apart when they caught the fault (trials {apart}); "
          "sync_state made them one")
    for failure in failed:
        print("failed:", failure)
    return not failed


def run_trial(args, rng, hosts, trial, times, failed, apart):
    """One job with a random kill: a rank, or (on several hosts, one trial in two) a whole host but host 0."""
    args.kill_node = rng.randrange(1, args.nnodes) if args.nnodes > 1 and rng.random() < 0.5 else None
    args.kill_rank = None if args.kill_node is not None else rng.randrange(args.nproc * args.nnodes)
    args.kill_step = rng.randrange(1, args.steps - 5)
    args.kill_point = rng.choice(KILL_POINTS)
    args.kill_delay = rng.uniform(0, INSTANT_WITHIN_S)
    if hosts is not None:
        summary = run_on_emulated_hosts(args, hosts, FIRST_TRIAL_PORT + trial)
    else:
        args.master_port = 0
        summary = run(args)
    problems = check(summary, args)
    what = (trial, f"kill {'host ' + str(args.kill_node) if args.kill_node is not None else 'rank ' + str(args.kill_rank)}",
            args.kill_step, args.kill_point)
    if problems:
        failed.append((*what, problems))
    else:
        times.append(max(r["recovery_s"] for r in summary["results"].values()))
        steps_at_fault = sorted({r["fault_step"] for r in summary["results"].values()})
        if len(steps_at_fault) > 1:
            apart.append(trial)
        print(*what, f"recovered in {times[-1]:.2f} s; steps done at the fault {steps_at_fault}", flush=True)
    leftovers = [n for n in os.listdir("/dev/shm") if n.startswith("ringreduce-")]
    if leftovers:
        failed.append((trial, "left in /dev/shm", leftovers))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=4, help="ranks on this host")
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--master-addr", default="127.0.0.1")
    parser.add_argument("--master-port", type=int, default=0, help="host 0's store port (0: any free one, one host)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=64, help="samples per rank and step")
    parser.add_argument("--lr", type=float, default=0.05, help="of momentum SGD; Adam's is a tenth of it")
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd", help="SGD with momentum 0.9, or Adam")
    parser.add_argument("--kill-rank", type=int, default=None, help="the rank that dies (global rank)")
    parser.add_argument("--kill-node", type=int, default=None, help="the host whose every rank dies")
    parser.add_argument("--kill-step", type=int, default=15)
    parser.add_argument("--kill-point", choices=KILL_POINTS, default="backward")
    parser.add_argument("--kill-delay", type=float, default=0.01, help="with --kill-point instant: seconds into the step")
    parser.add_argument("--trials", type=int, default=0, help="run this many jobs with random kills instead")
    parser.add_argument("--seed", type=int, default=0, help="of the random kills")
    parser.add_argument("--timeout", type=float, default=120, help="seconds a job may take")
    parser.add_argument("--emulated-hosts", type=int, default=0, help="with --trials: run on this many emulated hosts")
    parser.add_argument("--summary", action="store_true", help="host 0 prints the job's summary as one JSON line")
    parser.add_argument("--json", help="write host 0's losses and recovery time here")
    parser.add_argument("--plot", help="write the loss curve, with the fault marked, here (PNG)")
    args = parser.parse_args()
    if args.trials:
        sys.exit(0 if trials(args) else 1)
    if args.kill_rank is None and args.kill_node is None:
        args.kill_rank = args.nnodes * args.nproc - 1
    summary = run(args)
    if summary is None:
        return
    if args.summary:
        print(json.dumps(summary), flush=True)
        return
    problems = check(summary, args)
    if problems:
        sys.exit("FAILED: " + "; ".join(problems))
    summarize(summary, args)


if __name__ == "__main__":
    main()
