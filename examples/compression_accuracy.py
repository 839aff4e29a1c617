"""What compressing the link between hosts does to a training run: the DDP example's model and data
(examples/train_ddp.py) trained on emulated hosts with exact sums, bf16, int8 with error feedback
and int8 without, from the same start; the loss curves on one plot and the final losses side by side.

    python examples/compression_accuracy.py --plot docs/compression-loss.png   # as root: network namespaces

Every run averages its gradients with ringreduce's hierarchical all-reduce (exact, or
compressed_hook), so the runs differ only in what the link between hosts rounds; one more exact run
on the flat ring adds in another order, the yardstick of how far last bits alone move a run. The
final loss is the loss of the final weights over the whole training set (mean over ranks), not one
batch's.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ringreduce

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # train_ddp.py beside it, under PYTHONSAFEPATH too
from train_ddp import make_model, make_shard

# name -> (compress, use_error_feedback) for compressed_hook, or the algorithm of an exact average.
# The flat ring is exact too, but adds in another order: it shows how far float32's last bits alone
# move a run. (Fixed algorithms: auto may choose another from run to run, and so another order.)
RUNS = {"exact": "hierarchical", "exact, flat ring": "ring", "bf16": ("bf16", False), "int8 + feedback": ("int8", True),
        "int8, no feedback": ("int8", False)}
FIRST_PORT = 29610  # one port per run: a run's rendezvous never meets the last one's lingering socket


def exact_hook(algorithm, bucket):
    """DDP's average of a bucket, exact, with ringreduce's `algorithm`."""
    work = ringreduce.all_reduce(bucket.buffer(), op=dist.ReduceOp.AVG, algorithm=algorithm, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def train_rank(args):
    """One rank of one run (under the launcher's env://): prints, on rank 0, the run's record as JSON."""
    torch.set_num_threads(1)  # one core per rank: more threads only fight over the cores
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(make_model(), bucket_cap_mb=0.25)
    run = RUNS[args.run]
    if isinstance(run, str):
        model.register_comm_hook(run, exact_hook)
    else:
        state = ringreduce.hooks.CompressionState(compress=run[0], use_error_feedback=run[1])
        model.register_comm_hook(state, ringreduce.hooks.compressed_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    inputs, labels = make_shard(rank, world, args.samples)
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    start = time.perf_counter()
    for _ in range(args.epochs):
        for i in range(0, len(inputs), args.batch):
            optimizer.zero_grad()
            loss = loss_fn(model(inputs[i : i + args.batch]), labels[i : i + args.batch])
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    seconds = time.perf_counter() - start
    with torch.no_grad():
        final = torch.tensor([loss_fn(model.module(inputs), labels).item()])
    curve = torch.tensor(losses)
    for values in (curve, final):
        dist.all_reduce(values, op=dist.ReduceOp.AVG)
    if rank == 0:
        weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        print(json.dumps({"run": args.run, "losses": curve.tolist(), "final_loss": final.item(),
                          "seconds_per_step": seconds / len(losses), "weights": weights.tolist()}), flush=True)
    del model
    ringreduce.destroy()
    dist.destroy_process_group()


def run_all(args):
    """Each run on the same emulated hosts, one after the other; returns their records."""
    from ringreduce.bench.hosts import EmulatedHosts, available, in_order

    reason = available()
    if reason:
        raise SystemExit(f"emulated hosts: {reason}")
    placement = in_order([args.per_host] * args.hosts)
    records = []
    with EmulatedHosts(args.hosts, link=args.link) as hosts:
        for port, name in enumerate(RUNS, FIRST_PORT):
            argv = [sys.executable, os.path.abspath(__file__), "--rank-of", name, "--epochs", str(args.epochs),
                    "--samples", str(args.samples), "--batch", str(args.batch), "--lr", str(args.lr)]
            procs = hosts.launch(argv, placement, port=port, stdout=subprocess.PIPE, text=True)
            lines = [line for line in procs[0].communicate(timeout=args.timeout)[0].splitlines() if line.startswith("{")]
            failed = [rank for rank, proc in enumerate(procs) if proc.wait(timeout=args.timeout) != 0]
            if failed or not lines:
                raise SystemExit(f"run {name!r}: ranks {failed or [0]} failed (their errors are above)")
            records.append(json.loads(lines[-1]))
            print(f"{name:>18}: final loss {records[-1]['final_loss']:.5f}, "
                  f"{records[-1]['seconds_per_step'] * 1e3:.1f} ms per step", flush=True)
    return records


def report(records, args):
    exact = records[0]["final_loss"]
    steps = len(records[0]["losses"])
    exact_weights = torch.tensor(records[0]["weights"], dtype=torch.float64)
    for record in records:  # how far each run's final weights are from the exact run's
        apart = torch.tensor(record.pop("weights"), dtype=torch.float64) - exact_weights
        record["weights_apart"] = (apart.norm() / exact_weights.norm()).item()
    print(f"# {args.hosts} emulated hosts x {args.per_host} ranks, links of {args.link}; {steps} steps "
          f"({args.epochs} epochs of {args.samples} samples, batch {args.batch} per rank), SGD lr {args.lr} momentum 0.9")
    print(f"{'run':>18} {'final loss':>11} {'vs exact':>9} {'weights apart':>14} {'ms/step':>8}")
    for record in records:
        print(f"{record['run']:>18} {record['final_loss']:>11.5f} {record['final_loss'] / exact - 1:>+9.3%} "
              f"{record['weights_apart']:>14.2e} {record['seconds_per_step'] * 1e3:>8.1f}")
    print("(weights apart: the distance of the final weights from the exact run's, relative to their norm)")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (ax, below) = plt.subplots(2, 1, figsize=(7, 7), sharex=True, height_ratios=(3, 2))
        steps_axis = range(1, steps + 1)
        exact_losses = torch.tensor(records[0]["losses"], dtype=torch.float64)
        for record in records:
            ax.plot(steps_axis, record["losses"], lw=1, label=f"{record['run']} (final {record['final_loss']:.4f})")
            # Every run sees the same batches: the difference is what compression changed.
            below.plot(steps_axis, torch.tensor(record["losses"], dtype=torch.float64) - exact_losses, lw=1)
        ax.set_yscale("log")
        ax.set_ylabel("training loss (batch, mean over ranks)")
        ax.set_title(f"compressed link between hosts: {args.hosts} hosts x {args.per_host} ranks, {args.link}")
        ax.legend()
        below.set_xlabel("step")
        below.set_ylabel("loss minus the exact run's")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"plot: {args.plot}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--per-host", type=int, default=2, help="ranks on each host")
    parser.add_argument("--link", default="2gbit", help="each host's link, a tc rate")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--samples", type=int, default=16384, help="training samples in all")
    parser.add_argument("--batch", type=int, default=128, help="per-rank batch size")
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--timeout", type=float, default=600, help="seconds a run may take")
    parser.add_argument("--plot", help="where to save the loss curves (PNG)")
    parser.add_argument("--rank-of", choices=sorted(RUNS), help=argparse.SUPPRESS)  # a rank of one run
    args = parser.parse_args()
    if args.rank_of:
        args.run = args.rank_of
        train_rank(args)
        return
    report(run_all(args), args)


if __name__ == "__main__":
    main()
