"""Working memory of the hierarchical reduce-scatter and all-gather: 4 ranks named onto 2 hosts
(RINGREDUCE_HOST_NAME; the hosts meet through gloo on this machine), one call of each on a buffer of
--gib GiB per rank. Prints, per rank, how far the call raised the process's peak resident memory
above what it held before (its tensors, allocated and touched), and the call's time.

    python benchmarks/hierarchical_memory.py --gib 1
"""

import argparse
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 4
MIB = 1 << 20


def peak_resident_bytes():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def timed_growth(call):
    """(peak resident growth in bytes, seconds) of one call."""
    dist.barrier()
    before = peak_resident_bytes()
    start = time.perf_counter()
    call()
    seconds = time.perf_counter() - start
    return peak_resident_bytes() - before, seconds


def rank_main(rank, store_path, numel, results):
    os.environ["RINGREDUCE_HOST_NAME"] = f"host-{rank // 2}"
    import ringreduce

    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=WORLD)
    chunk = numel // WORLD
    data = torch.full((chunk * WORLD,), float(rank + 1))
    share = torch.zeros(chunk)
    rs = timed_growth(lambda: ringreduce.reduce_scatter_tensor(share, data, algorithm="hierarchical"))
    assert torch.all(share == sum(range(1, WORLD + 1))), "reduce-scatter result"
    ag = timed_growth(lambda: ringreduce.all_gather_into_tensor(data, share, algorithm="hierarchical"))
    assert torch.all(data == sum(range(1, WORLD + 1))), "all-gather result"
    results.put((rank, rs, ag))
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=1.0, help="buffer per rank, in GiB")
    args = parser.parse_args()
    numel = int(args.gib * (1 << 30)) // 4 // WORLD * WORLD
    context = mp.get_context("spawn")
    results = context.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        ranks = [context.Process(target=rank_main, args=(r, os.path.join(tmp, "store"), numel, results))
                 for r in range(WORLD)]
        for process in ranks:
            process.start()
        rows = sorted(results.get(timeout=600) for _ in ranks)
        for process in ranks:
            process.join(timeout=60)
    print(f"# hierarchical, 2 hosts x 2 ranks, float32, {numel * 4 / MIB:.0f} MiB per rank; "
          "peak resident growth during the call (MiB) and its time (s)")
    print("rank  reduce_scatter MiB   s   all_gather MiB   s")
    for rank, (rs_bytes, rs_s), (ag_bytes, ag_s) in rows:
        print(f"{rank:4d}  {rs_bytes / MIB:18.1f} {rs_s:5.2f}  {ag_bytes / MIB:14.1f} {ag_s:5.2f}")


if __name__ == "__main__":
    main()
