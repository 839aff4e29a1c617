"""python -m ringreduce.trace: merge the per-rank files of RINGREDUCE_TRACE, and draw the ring.

    RINGREDUCE_TRACE=traces torchrun --nproc_per_node 4 train.py     # each rank writes its files
    python -m ringreduce.trace merge traces -o trace.json             # open in Perfetto / chrome://tracing
    python -m ringreduce.trace plot trace.json -o ring.png            # ranks against time, by phase

Each file holds one communicator's events: a span per collective (its algorithm, transport, bytes,
dtype, op and sequence number) and, nested in it, a span per transfer waited for (send, recv,
recv_reduce, forward, forward_reduce, flush) with its peer, lane and bytes. Times are CLOCK_REALTIME
(spans measured on CLOCK_MONOTONIC), so the ranks' files line up. The merged trace has a process per rank and a thread per lane.
"""

import argparse
import glob
import json
import os
import re

# Transfers that bring data in: each is one step of its segment (a ring all-reduce has 2(N-1) of
# them per segment on every rank).
RECEIVES = ("recv", "recv_reduce", "forward", "forward_reduce")
REDUCING = ("recv_reduce", "forward_reduce")
# What the reducing and the copying steps are called in each algorithm, for the plot's legend.
PHASES = {
    "ring": ("reduce-scatter", "all-gather"),
    "central": ("reduce", "broadcast"),
    "one_shot": ("reduce", "copy"),
    "doubling": ("reduce", "copy"),
    "halving_doubling": ("reduce-scatter", "all-gather"),
}
# Lanes of one communicator share a thread id block of this size in the merged trace.
LANES_PER_COMMUNICATOR = 100
_FILE = re.compile(r"ringreduce-.*-rank(\d+)of(\d+)-pid(\d+)-(\d+)\.json$")


def merge(folder):
    """One trace of every file in `folder`: a process per rank, a thread per lane (and communicator)."""
    paths = sorted(p for p in glob.glob(os.path.join(folder, "ringreduce-*.json")) if _FILE.search(p))
    if not paths:
        raise SystemExit(f"no ringreduce trace files in {folder} (RINGREDUCE_TRACE writes ringreduce-*.json)")
    events, files, dropped = [], [], 0
    per_rank = {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        info = data["otherData"]
        rank = info["rank"]
        block = per_rank.setdefault(rank, 0)
        per_rank[rank] += 1
        dropped += info.get("dropped_events", 0)
        files.append(os.path.basename(path))
        lanes = set()
        for e in data["traceEvents"]:
            if e["ph"] == "M":
                if block == 0:
                    events.append(e)
                continue
            e = dict(e, tid=block * LANES_PER_COMMUNICATOR + e["tid"])
            lanes.add(e["tid"])
            events.append(e)
        for tid in sorted(lanes):
            label = f"lane {tid % LANES_PER_COMMUNICATOR}" + (f" (communicator {block})" if block else "")
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": label}})
    events.sort(key=lambda e: (e["ph"] != "M", e.get("ts", 0)))
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"ranks": len(per_rank), "files": files, "dropped_events": dropped}}


def collectives(trace):
    """{(rank, communicator block, sequence): collective event} of a merged trace."""
    return {(e["pid"], e["tid"] // LANES_PER_COMMUNICATOR, e["args"]["sequence"]): e
            for e in trace["traceEvents"] if e.get("cat") == "collective"}


def plot(trace, path, sequence=None):
    """Ranks against time; each receive step coloured by the phase it belongs to."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    calls = collectives(trace)
    steps = [e for e in trace["traceEvents"] if e.get("cat") == "transfer" and e["name"] in RECEIVES
             and (sequence is None or e["args"]["sequence"] == sequence)]
    if not steps:
        raise SystemExit("the trace has no transfer steps" + (f" in collective {sequence}" if sequence is not None else ""))
    start = min(e["ts"] for e in steps)
    ranks = sorted({e["pid"] for e in steps})
    colours = {}
    palette = plt.get_cmap("tab10").colors
    fig, ax = plt.subplots(figsize=(11, 0.7 * len(ranks) + 1.8))
    for e in steps:
        call = calls.get((e["pid"], e["tid"] // LANES_PER_COMMUNICATOR, e["args"]["sequence"]), {})
        algorithm = call.get("args", {}).get("algorithm", "ring")
        reducing, copying = PHASES.get(algorithm, ("reduce", "copy"))
        phase = f"{algorithm}: {reducing if e['name'] in REDUCING else copying}"
        colour = colours.setdefault(phase, palette[len(colours) % len(palette)])
        ax.broken_barh([(e["ts"] - start, max(e["dur"], 0.05))], (ranks.index(e["pid"]) - 0.35, 0.7),
                       facecolors=colour, edgecolors="white", linewidth=0.3)
    shown = [c for (rank, _, _), c in calls.items()
             if rank in ranks and (sequence is None or c["args"]["sequence"] == sequence)]
    for call in shown:
        ax.axvline(call["ts"] - start, color="grey", linewidth=0.4, alpha=0.4)
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("time (us)")
    sizes = sorted({c["args"]["bytes"] for c in shown})
    ax.set_title(f"{len(ranks)} ranks, {len(shown) // len(ranks)} collective(s) of "
                 f"{', '.join(str(s) for s in sizes[:4])} B: each bar is one receive step, from its wait to its end")
    ax.legend(handles=[matplotlib.patches.Patch(color=c, label=p) for p, c in colours.items()], loc="upper right",
              fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ringreduce.trace", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    merging = commands.add_parser("merge", help="merge a RINGREDUCE_TRACE folder into one trace")
    merging.add_argument("folder")
    merging.add_argument("-o", "--output", default="trace.json")
    plotting = commands.add_parser("plot", help="draw a merged trace: ranks against time, by phase")
    plotting.add_argument("trace")
    plotting.add_argument("-o", "--output", default="ring.png")
    plotting.add_argument("--sequence", type=int, help="only the collective with this sequence number")
    args = parser.parse_args(argv)
    if args.command == "merge":
        merged = merge(args.folder)
        with open(args.output, "w") as f:
            json.dump(merged, f)
        note = f"; {merged['otherData']['dropped_events']} events were dropped" if merged["otherData"]["dropped_events"] else ""
        print(f"# {len(merged['otherData']['files'])} files, {merged['otherData']['ranks']} ranks -> {args.output}{note}")
    else:
        with open(args.trace) as f:
            plot(json.load(f), args.output, args.sequence)
        print(f"# wrote {args.output}")


if __name__ == "__main__":
    main()
