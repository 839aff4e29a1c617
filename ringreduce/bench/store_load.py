"""What a group asks of its store: requests to build it, and requests a second while it sits idle.

    python -m ringreduce.bench.store_load --ranks 4 8 16 --idle 5

For each size, that many ranks on this host join a TCPStore served by this process, each through a
counting wrapper (_C._testing.CountingStore: every request the rank makes, on every handle it
opens), and build the backend's group (`init_process_group`, with `--backend`). Each rank reports its
requests up to the group's creation (the set-up) and during an idle window of `--idle` seconds. Beside
the ranks' own count, the kernel's: TCP segments that arrived at the store's port over the window
(`ss`'s segs_in on the server's sockets), what a user sees from outside."""

import argparse
import json
import os
import re
import subprocess
import sys
import time
from datetime import timedelta

# How long a group may take to form (16 ranks importing torch on 2 cores take about 30 s).
FORM_TIMEOUT_S = 300


def _rank(args):
    import torch.distributed as dist

    from ringreduce import _C

    store = _C._testing.CountingStore(dist.TCPStore("127.0.0.1", args.port, args.world, False,
                                                    timeout=timedelta(seconds=FORM_TIMEOUT_S)))
    connected = store.requests
    dist.init_process_group(args.backend, store=store, rank=args.rank, world_size=args.world,
                            timeout=timedelta(seconds=FORM_TIMEOUT_S))
    setup = store.requests - connected
    _say({"rank": args.rank, "setup": setup})
    sys.stdin.readline()  # the window begins
    began, before = time.monotonic(), store.requests
    sys.stdin.readline()  # and ends
    _say({"rank": args.rank, "idle_per_s": (store.requests - before) / (time.monotonic() - began)})
    dist.destroy_process_group()


def _say(record):
    os.write(sys.stdout.fileno(), (json.dumps(record) + "\n").encode())


def segments_in(port):
    """TCP segments received so far on the server's established sockets of `port` (this namespace)."""
    out = subprocess.run(["ss", "-tinH", "state", "established", f"( sport = :{port} )"],
                         capture_output=True, text=True, check=True).stdout
    return sum(int(n) for n in re.findall(r"segs_in:(\d+)", out))


def measure(world, backend="ringreduce", idle_s=5.0):
    """One group of `world` ranks on this host: set-up requests of each rank, idle requests a second
    (the ranks' count, summed, and the kernel's segments at the store's port)."""
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, world + 1, True, wait_for_workers=False,
                           timeout=timedelta(seconds=FORM_TIMEOUT_S))
    argv = [sys.executable, "-m", "ringreduce.bench.store_load", "--rank-of", str(world), "--port", str(server.port),
            "--backend", backend]
    procs = [subprocess.Popen([*argv, "--rank", str(rank)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True) for rank in range(world)]
    try:
        setup = [json.loads(proc.stdout.readline())["setup"] for proc in procs]
        time.sleep(1.0)  # every rank's first pulses are under way
        for proc in procs:
            proc.stdin.write("\n")
            proc.stdin.flush()
        began, segments = time.monotonic(), segments_in(server.port)
        time.sleep(idle_s)
        segments = (segments_in(server.port) - segments) / (time.monotonic() - began)
        for proc in procs:
            proc.stdin.write("\n")
            proc.stdin.flush()
        idle = [json.loads(proc.stdout.readline())["idle_per_s"] for proc in procs]
        for proc in procs:
            proc.wait(timeout=FORM_TIMEOUT_S)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return {"world": world, "backend": backend, "setup_requests": sum(setup), "setup_per_rank_max": max(setup),
            "idle_requests_per_s": sum(idle), "idle_segments_per_s": segments}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--backend", default="ringreduce")
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of idle window")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--rank-of", type=int, dest="world", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank is not None:
        import ringreduce  # noqa: F401 - registers the backend

        _rank(args)
        return
    print(f"{'ranks':>5} {'backend':>10} {'set-up requests':>16} {'per rank':>9} {'idle req/s':>11} "
          f"{'per rank':>9} {'idle segs/s':>12}")
    for world in args.ranks:
        r = measure(world, args.backend, args.idle)
        print(f"{world:>5} {args.backend:>10} {r['setup_requests']:>16} {r['setup_requests'] / world:>9.1f} "
              f"{r['idle_requests_per_s']:>11.0f} {r['idle_requests_per_s'] / world:>9.1f} "
              f"{r['idle_segments_per_s']:>12.0f}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
