"""Synchronous, local and asynchronous updates side by side, on one engine and one transport.

    python examples/sync_vs_async.py                      # 4 local CPU ranks, with and without a 3x straggler
    python examples/sync_vs_async.py --world 2 --straggler 1   # 2 ranks, no straggler run

The same model, data, seed and learning rate under:
- DDP whose gradients travel by the ring, and by the central reducer (ringreduce's hooks);
- local SGD, averaging the parameters every H = 4 and 16 steps (ringreduce.LocalSGD);
- the asynchronous parameter server (ringreduce.ps) with staleness bound 0, 2 and none.
Each rank takes --steps steps. With --straggler F > 1 a second pass slows the last rank: after
its forward pass it sleeps F - 1 times its own compute time of the step.

Each scheme runs --repeats times, round-robin; the table shows the run with the median time to
the target. Prints one table (time to the target loss, final loss, bytes sent, staleness) and writes a
plot of the loss against wall time, one line per scheme.
"""

import argparse
import datetime
import os
import queue as queue_module
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ringreduce
import ringreduce.ps

FEATURES, HIDDEN, BATCH, EVAL_SAMPLES = 32, 256, 256, 2048
# Evaluate rank 0's parameters every this many steps; the clock is paused meanwhile.
EVAL_EVERY = 5

SCHEMES = [
    ("DDP ring", "ddp", "ring"),
    ("DDP central", "ddp", "central"),
    ("local SGD H=4", "local", 4),
    ("local SGD H=16", "local", 16),
    ("async s=0", "ps", 0),
    ("async s=2", "ps", 2),
    ("async s=inf", "ps", None),
]


def make_model():
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                         nn.Linear(HIDDEN, 1))


def teacher_data(generator, samples):
    """Inputs and targets of a fixed random teacher: a regression with something real to learn."""
    teacher = torch.Generator().manual_seed(99)
    w1, w2 = torch.randn(FEATURES, 16, generator=teacher), torch.randn(16, 1, generator=teacher)
    x = torch.randn(samples, FEATURES, generator=generator)
    return x, torch.tanh(x @ w1 / FEATURES ** 0.5) @ w2 / 4


def compute_time(loss_fn, data, repeats=9):
    """The median time of one step's forward and backward pass on a model of our own."""
    model, times = make_model(), []
    for _ in range(repeats):
        x, y = teacher_data(data, BATCH)
        began = time.perf_counter()
        loss_fn(model(x), y).backward()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def bytes_per_step(kind, detail, rank, world, numel):
    """Bytes a rank sends per step in the synchronous schemes, from the algorithm's schedule (the
    parameter server's bytes are counted by the engine instead)."""
    size = 4 * numel
    if kind == "ddp" and detail == "central":
        return size * (world - 1) if rank == 0 else size  # the root broadcasts to everyone
    ring = 2 * (world - 1) / world * size
    return ring if kind == "ddp" else ring / detail  # local SGD: one ring all-reduce every H steps


def train(kind, detail, rank, world, args, straggle):
    torch.manual_seed(args.seed)
    model = make_model()
    numel = sum(p.numel() for p in model.parameters())
    data = torch.Generator().manual_seed(args.seed * 1000 + rank)
    eval_x, eval_y = teacher_data(torch.Generator().manual_seed(7), EVAL_SAMPLES)
    loss_fn = nn.MSELoss()
    server = averager = None
    if kind == "ddp":
        model = DDP(model)
        model.register_comm_hook(None, ringreduce.hooks.BY_NAME[detail])
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    elif kind == "local":
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
        averager = ringreduce.LocalSGD(model.parameters(), period=detail)
    else:
        server = ringreduce.ps.ParameterServer(model.parameters(), lr=args.lr, staleness=detail)
    # The straggler's extra time per step: F - 1 times its compute time (forward and backward, no
    # communication), measured while every rank measures, so sharing the cores is counted in.
    own = compute_time(loss_fn, data)
    extra = (args.straggler - 1) * own if straggle and rank == world - 1 else 0.0
    dist.barrier()
    curve, paused = [], 0.0
    start = time.perf_counter()
    for step in range(args.steps):
        if rank == 0 and step % EVAL_EVERY == 0:
            began = time.perf_counter()
            with torch.no_grad():
                curve.append((began - start - paused, loss_fn(model(eval_x), eval_y).item()))
            paused += time.perf_counter() - began
        x, y = teacher_data(data, BATCH)
        model.zero_grad()
        loss = loss_fn(model(x), y)
        if straggle and rank == world - 1:
            time.sleep(extra)
        loss.backward()
        if server is not None:
            server.step()
        else:
            optimizer.step()
            if averager is not None:
                averager.step()
    stats = {}
    if server is not None:
        stats = server.close()
    elif averager is not None:
        ringreduce.average_parameters(model.parameters())  # the model the run ends with
    wall = time.perf_counter() - start - paused
    if server is not None and rank == 0:
        with torch.no_grad():  # the server's parameters, every push applied
            torch.nn.utils.vector_to_parameters(server.params, model.parameters())
    with torch.no_grad():
        final = loss_fn(model(eval_x), eval_y).item()
    curve.append((wall, final))
    sent = stats["bytes_sent"] if server is not None else bytes_per_step(kind, detail, rank, world, numel) * args.steps
    return {"wall": wall, "curve": curve, "final": final, "sent": sent,
            "staleness": (stats.get("staleness_mean"), stats.get("staleness_max"))}


def rank_main(rank, world, store_path, args, queue):
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    torch.set_num_threads(1)
    runs = {}
    # Repeats go round all the schemes, so a slow spell of the machine hits every scheme alike.
    for _ in range(args.repeats):
        for straggle in ([False, True] if args.straggler > 1 else [False]):
            for name, kind, detail in SCHEMES:
                result = train(kind, detail, rank, world, args, straggle)
                everyone = [None] * world
                dist.all_gather_object(everyone, result["sent"])
                runs.setdefault((straggle, name), []).append({**result, "sent_all": everyone})
                dist.barrier()
    if rank == 0:
        queue.put([{"scheme": name, "straggler": straggle, **median_run(found, args.target)}
                   for (straggle, name), found in runs.items()])
    dist.destroy_process_group()


def time_to(curve, target):
    return next((t for t, loss in curve if loss <= target), None)


def median_run(runs, target):
    """The run with the median time to target (wall time where a run never reached it), and the
    range of the repeats' times to target."""
    def key(run):
        reached = time_to(run["curve"], target)
        return (reached is None, reached if reached is not None else run["wall"])

    ordered = sorted(runs, key=key)
    reached = [t for t in (time_to(r["curve"], target) for r in runs) if t is not None]
    return {**ordered[(len(ordered) - 1) // 2], "spread": (min(reached), max(reached)) if reached else None}


def spread(row):
    return "" if row["spread"] is None or row["spread"][0] == row["spread"][1] else " [{:.2f}-{:.2f}]".format(*row["spread"])


def report(rows, args):
    print(f"\n{args.world} ranks, {args.steps} steps each, lr {args.lr}, target loss {args.target}, median of "
          f"{args.repeats} runs; "
          f"straggler: rank {args.world - 1} at {args.straggler}x\n")
    header = (f"| scheme | straggler | time to target (s), median of {args.repeats} [range] | wall (s) | final loss | "
              "MB sent, busiest rank | MB sent, other ranks (mean) | staleness mean / max |")
    print(header)
    print("|" + "---|" * 8)
    for row in rows:
        busiest = max(row["sent_all"])
        others = sorted(row["sent_all"])[:-1] or [busiest]
        reach = time_to(row["curve"], args.target)
        mean, worst = row["staleness"]
        stale = "-" if mean is None else f"{mean:.2f} / {worst}"
        print(f"| {row['scheme']} | {'yes' if row['straggler'] else 'no'} | "
              f"{'not reached' if reach is None else f'{reach:.2f}'}{spread(row)} | {row['wall']:.2f} | {row['final']:.4f} | "
              f"{busiest / 2**20:.1f} | {statistics.mean(others) / 2**20:.1f} | {stale} |")
    slowed = {r["scheme"]: r for r in rows if r["straggler"]}
    if slowed:
        print("\nWhat the straggler costs (with / without): time to target, wall time")
        for row in rows:
            if not row["straggler"]:
                late = slowed[row["scheme"]]
                reach, reach_late = time_to(row["curve"], args.target), time_to(late["curve"], args.target)
                ratio = "-" if reach is None or reach_late is None else f"{reach_late / reach:.2f}x"
                print(f"  {row['scheme']}: {ratio}, {late['wall'] / row['wall']:.2f}x")


def plot(rows, args):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    passes = sorted({r["straggler"] for r in rows})
    fig, axes = plt.subplots(1, len(passes), figsize=(6.5 * len(passes), 4.5), sharey=True, squeeze=False)
    for ax, straggle in zip(axes[0], passes):
        for row in (r for r in rows if r["straggler"] == straggle):
            times, losses = zip(*row["curve"])
            ax.plot(times, losses, label=row["scheme"])
        ax.axhline(args.target, color="grey", linestyle=":", linewidth=1)
        ax.set_yscale("log")
        ax.set_xlabel("wall time (s)")
        ax.set_title(f"{args.world} ranks, " + (f"rank {args.world - 1} {args.straggler}x slower" if straggle
                                               else "no straggler"))
    axes[0][0].set_ylabel("eval loss (rank 0's parameters)")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.plot, dpi=110)
    print(f"\nplot: {args.plot}")


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--steps", type=int, default=400)
    # lr and target: the target sits where one rank alone, at this lr, gets after about 250 of the
    # 400 steps, on the slow tail of the curve where the schemes' differences show.
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--target", type=float, default=0.037, help="the eval loss 'time to target' waits for")
    parser.add_argument("--straggler", type=float, default=3.0, help="slowdown of the last rank (1: no straggler pass)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each scheme; the table shows the median")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", default="sync_vs_async.png")
    return parser.parse_args(argv)


def run(args):
    """Every scheme on `args.world` spawned ranks; rank 0's rows."""
    ctx = mp.get_context("forkserver")  # clean ranks, as spawn, forked from one import of torch (train_ddp.launch)
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=rank_main, args=(r, args.world, os.path.join(tmp, "store"), args, queue))
                 for r in range(args.world)]
        for proc in procs:
            proc.start()
        try:
            while True:
                try:
                    rows = queue.get(timeout=1.0)
                    break
                except queue_module.Empty:
                    failed = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                    if failed:
                        raise RuntimeError(f"ranks exited early (rank, exit code): {failed}; see their tracebacks above")
        finally:
            for proc in procs:
                proc.join(timeout=60)
                if proc.is_alive():
                    proc.kill()
    return rows


def main(argv=None):
    args = parse(argv)
    rows = run(args)
    report(rows, args)
    plot(rows, args)


if __name__ == "__main__":
    main()
