"""What a group asks of its store: requests to build it, and requests a second while it sits idle.

    python -m ringreduce.bench.store_load --ranks 4 8 16 --idle 5
    python -m ringreduce.bench.store_load --model --ranks 16 64 256 1024 --plot store-load.png

For each size, that many ranks on this host join a TCPStore served by this process, each through a
counting wrapper (_C._testing.CountingStore: every request the rank makes, on every handle it
opens), and build the backend's group (`init_process_group`, with `--backend`). Each rank reports its
requests up to the group's creation (the set-up) and during an idle window of `--idle` seconds. Beside
the ranks' own count, the kernel's: TCP segments that arrived at the store's port over the window
(`ss`'s segs_in on the server's sockets), what a user sees from outside.

--model: the membership alone, its ranks threads of this process over one in-process store, each
counted: requests per rank per second while idle, and the time from one rank's pulse stopping (its
membership dropped) to every survivor naming it. Threads of one process share a pid, so the death
is found by silence (the bound, `--lost-after`), as a rank cut off or stopped is."""

import argparse
import json
import os
import re
import statistics
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


# The model's settling time before counting (every thread rank has pulsed a few times), and how
# long it waits for the survivors to name the dropped rank beyond the bound.
MODEL_SETTLE_S = 1.0
MODEL_NAME_WAIT_S = 30.0
# How often the model asks the survivors not yet told whether they name a loss: each question is
# a store request on a thread of its own (BoundedRendezvous), and a thousand of them at once, asked
# without a pause, took the two cores from the pulse threads for seconds (live ranks went silent).
MODEL_ASK_EVERY_S = 0.25


def model(world, idle_s=3.0, lost_after_s=2.0):
    """The membership of `world` thread ranks over one in-process store: idle requests per rank per
    second (mean and max), then rank world // 2's pulse stopped, and the seconds until each survivor
    names it (the slowest and the median)."""
    import threading

    import torch.distributed as dist

    from ringreduce import _C

    store = dist.HashStore()
    counters = [_C._testing.CountingStore(store) for _ in range(world)]
    members = [None] * world

    def join(rank):
        members[rank] = _C.Membership(counters[rank].clone(), counters[rank], rank, world, "model", "", 600.0)

    bound = os.environ.get("RINGREDUCE_LOST_AFTER")
    os.environ["RINGREDUCE_LOST_AFTER"] = str(lost_after_s)  # read as each membership is made
    try:
        threads = [threading.Thread(target=join, args=(rank,)) for rank in range(world)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        if bound is None:
            del os.environ["RINGREDUCE_LOST_AFTER"]
        else:
            os.environ["RINGREDUCE_LOST_AFTER"] = bound
    time.sleep(MODEL_SETTLE_S)
    before, began = [c.requests for c in counters], time.monotonic()
    time.sleep(idle_s)
    rates = [(c.requests - b) / (time.monotonic() - began) for c, b in zip(counters, before)]
    victim = world // 2
    members[victim] = None  # its pulse thread stops
    stopped, named = time.monotonic(), {}
    time.sleep(lost_after_s * 0.75)  # nobody can name it sooner
    while len(named) < world - 1 and time.monotonic() - stopped < lost_after_s + MODEL_NAME_WAIT_S:
        for rank, member in enumerate(members):
            if member is not None and rank not in named and member.poll_loss():
                named[rank] = (member.poll_loss(), time.monotonic() - stopped)
        time.sleep(MODEL_ASK_EVERY_S)
    wrong = {rank: lost for rank, (lost, _) in named.items() if lost != [victim]}
    after = sorted(seconds for _, seconds in named.values())
    members.clear()
    return {"world": world, "requests_per_rank_s": statistics.mean(rates), "requests_per_rank_s_max": max(rates),
            "lost_after_s": lost_after_s, "named": len(named), "wrong": wrong,
            "named_after_s_max": after[-1] if after else None,
            "named_after_s_median": statistics.median(after) if after else None}


def plot_model(records, path):
    """Store requests per rank per second against the group's size: the model's, and the former
    membership's (each rank read every pulse: 4(N + 2))."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [r["world"] for r in records]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(sizes, [r["requests_per_rank_s"] for r in records], "o-", label="watchers (kWatchers = 2), measured")
    ax.plot(sizes, [4 * (n + 2) for n in sizes], "s--", label="before: every rank read every pulse, 4(N + 2)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("ranks (N)")
    ax.set_ylabel("store requests per rank per second, idle")
    ax.set_title("membership's load on the store (thread ranks, in-process store)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--backend", default="ringreduce")
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of idle window")
    parser.add_argument("--model", action="store_true", help="the membership alone, ranks as threads")
    parser.add_argument("--lost-after", type=float, default=2.0, help="with --model: the loss bound, seconds")
    parser.add_argument("--plot", help="with --model: a plot of requests per rank against N, to this path")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--rank-of", type=int, dest="world", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank is not None:
        import ringreduce  # noqa: F401 - registers the backend

        _rank(args)
        return
    if args.model:
        print(f"{'ranks':>5} {'req/s per rank':>15} {'max':>6} {'named by':>9} {'after (max)':>12} {'median':>7}")
        records = []
        for world in args.ranks:
            r = model(world, args.idle, args.lost_after)
            records.append(r)
            print(f"{world:>5} {r['requests_per_rank_s']:>15.2f} {r['requests_per_rank_s_max']:>6.2f} "
                  f"{r['named']:>5}/{world - 1:<3} {r['named_after_s_max'] or float('nan'):>12.2f} "
                  f"{r['named_after_s_median'] or float('nan'):>7.2f}{'  WRONG: ' + str(r['wrong']) if r['wrong'] else ''}")
            sys.stdout.flush()
        if args.plot:
            plot_model(records, args.plot)
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
