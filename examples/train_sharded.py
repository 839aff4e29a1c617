"""Train the example classifier with sharded state on CPU: FSDP2 (fully_shard) or ZeRO.

    python examples/train_sharded.py --shard fsdp --backend ringreduce   # spawns 2 local CPU ranks
    python examples/train_sharded.py --shard zero --backend ringreduce
    torchrun --nproc_per_node 2 examples/train_sharded.py --shard fsdp --backend ringreduce

FSDP2 keeps a shard of every parameter on each rank. Before a layer runs it all-gathers the layer's
parameters, and after the backward pass it reduce-scatters the gradients: the ring's two halves,
each a collective of its own. ZeRO (stage 1) shards the optimizer state: DDP all-reduces the
gradients, each rank steps the parameters it owns and broadcasts them to the others.
"""

import argparse
import os
import sys

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # train_ddp.py beside it, under PYTHONSAFEPATH too
from train_ddp import add_common_arguments, launch, make_model, run_epochs


def sharded(model, shard, world, lr):
    """The model and its optimizer, sharded the `shard` way over every rank."""
    if shard == "fsdp":
        mesh = init_device_mesh("cpu", (world,))
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)  # one all-gather / reduce-scatter per layer
        fully_shard(model, mesh=mesh)
        return model, torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    model = DDP(model)
    return model, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=lr, momentum=0.9)


def train(rank, world, args):
    torch.manual_seed(0)
    model, optimizer = sharded(make_model(), args.shard, world, args.lr)
    run_epochs(model, optimizer, rank, world, args, f"backend: {args.backend}, shard: {args.shard}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_arguments(parser)
    parser.add_argument("--shard", choices=("fsdp", "zero"), default="fsdp",
                        help="fsdp: parameters, gradients and optimizer state sharded (FSDP2); "
                             "zero: optimizer state sharded (ZeroRedundancyOptimizer)")
    launch(train, parser.parse_args())


if __name__ == "__main__":
    main()
