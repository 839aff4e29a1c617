"""Train a small classifier with DistributedDataParallel, exchanging gradients through ringreduce.

    python examples/train_ddp.py --hook ring                     # spawns 2 local CPU ranks
    torchrun --nproc_per_node 2 examples/train_ddp.py --hook central
    python examples/train_ddp.py --backend ringreduce --hook builtin   # the whole job on ringreduce, no hook

The data is synthetic: inputs drawn from a fixed seed, labelled by a random "teacher" network, so
the loss has something real to learn and nothing is downloaded. Each rank trains on its own shard.
"""

import argparse
import gc
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ringreduce

HOOKS = {"builtin": None, **ringreduce.hooks.BY_NAME}
FEATURES, HIDDEN, CLASSES = 64, 512, 10


def make_model() -> nn.Module:
    """About 300k parameters in six tensors: several DDP buckets at a 0.25 MB bucket cap."""
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                         nn.Linear(HIDDEN, CLASSES))


def make_shard(rank, world, samples):
    gen = torch.Generator().manual_seed(1234)
    teacher = nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, CLASSES))
    for p in teacher.parameters():
        p.data = torch.randn(p.shape, generator=gen)
    inputs = torch.randn(samples, FEATURES, generator=gen)
    with torch.no_grad():
        labels = teacher(inputs).argmax(1)
    return inputs[rank::world], labels[rank::world]


def train(rank, world, args):
    torch.manual_seed(0)
    model = DDP(make_model(), bucket_cap_mb=0.25)
    if HOOKS[args.hook] is not None:
        model.register_comm_hook(state=None, hook=HOOKS[args.hook])
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    run_epochs(model, optimizer, rank, world, args, f"backend: {args.backend}, hook: {args.hook}")


def run_epochs(model, optimizer, rank, world, args, label):
    """Trains on this rank's shard; rank 0 prints the mean loss over ranks and the rate per epoch."""
    torch.set_num_threads(1)  # one core per rank: more threads only fight over the cores
    inputs, labels = make_shard(rank, world, args.samples)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        start, total, batches = time.perf_counter(), 0.0, 0
        for i in range(0, len(inputs), args.batch):
            optimizer.zero_grad()
            loss = loss_fn(model(inputs[i : i + args.batch]), labels[i : i + args.batch])
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
        mean = torch.tensor([total / batches])
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        rate = len(inputs) * world / (time.perf_counter() - start)
        if rank == 0:
            print(f"epoch {epoch + 1:2d}  loss {mean.item():.4f}  {rate:8.0f} samples/s  ({label})", flush=True)


def _spawned(rank, world, store_path, train_fn, args):
    if store_path is None:  # torchrun's environment names the rendezvous
        dist.init_process_group(args.backend)
    else:
        dist.init_process_group(args.backend, store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    try:
        train_fn(rank, world, args)
    finally:
        ringreduce.destroy()
        # DDP and FSDP keep the group alive through reference cycles: collected now, gloo's threads
        # are joined here rather than torn down at interpreter exit, which can abort the process.
        gc.collect()
        dist.destroy_process_group()


def add_common_arguments(parser):
    parser.add_argument("--backend", choices=("gloo", "ringreduce"), default="gloo",
                        help="the torch.distributed backend of the job (ringreduce: every collective on the engine)")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--samples", type=int, default=16384, help="training samples in all")
    parser.add_argument("--batch", type=int, default=128, help="per-rank batch size")
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--world", type=int, default=2, help="ranks to spawn without a launcher")


def launch(train_fn, args):
    """Under torchrun, joins its job; otherwise spawns args.world local ranks over a file store."""
    if "RANK" in os.environ:
        _spawned(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None, train_fn, args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        # forkserver: a clean process, as spawn (safe with CUDA), that has imported this script and torch
        # once for every rank: 2 imports of torch instead of 1 + world (a 2-rank run: 7.3 s against 8.9).
        mp.start_processes(_spawned, args=(args.world, os.path.join(tmp, "store"), train_fn, args),
                           nprocs=args.world, start_method="forkserver")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_arguments(parser)
    parser.add_argument("--hook", choices=sorted(HOOKS), default="ring")
    launch(train, parser.parse_args())


if __name__ == "__main__":
    main()
