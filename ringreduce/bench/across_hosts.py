"""The benchmark across emulated hosts: `python -m ringreduce.bench --hosts 2x2 --link 2gbit`.

H hosts of k ranks on this machine (ringreduce/bench/hosts.py), each host's link limited to
--link. Every size times, in one run, trial by trial: torch.distributed's collective on gloo,
ringreduce's flat ring (every rank on gloo's pairs), the hierarchical one (shared memory inside
each host, gloo across), for all_reduce recursive doubling and halving-doubling (flat: every rank
on gloo's pairs) and auto, and for all_reduce and reduce_scatter the
hierarchical one compressed to bf16 and fp16 between hosts (all_reduce also int8, with and without
keeping its rounding errors for error feedback), each with its error against a float64 reference.
Beside them, the bounds the link sets: each host's link carries 2(N-1)/N of the buffer in a flat
all-reduce of N ranks, 2(H-1)/H in a hierarchical one, half that in 16 bits and about a quarter in
int8; a reduce-scatter or all-gather half as much. For all_reduce, the cost model
(ringreduce/bench/model.py) fitted to the run's ring, hierarchical, doubling and halving-doubling rows, and each
row's prediction beside its measurement.
"""

import json
import re
import subprocess
import sys

from ringreduce import _C
from ringreduce.bench import model
from ringreduce.bench.hosts import EmulatedHosts, available, in_order
from ringreduce.bench.report import human_bytes

ROWS = ("gloo", "ring", "hierarchical", "doubling", "halving_doubling", "auto", "bf16", "fp16", "int8", "int8+fb")
# The rows compressed between hosts (ringreduce.all_reduce's `compress`), and the bytes a float32
# value takes on the link in each (int8: blocks of 256 values and a float32 scale; int8+fb: int8
# keeping each rank's rounding errors for error feedback).
WIRE_BYTES_PER_VALUE = {"bf16": 2.0, "fp16": 2.0, "int8": 260 / 256, "int8+fb": 260 / 256}
COMPRESSED = tuple(WIRE_BYTES_PER_VALUE)
# The collectives timed across hosts (--collective), and the share of an all-reduce's bytes each moves.
LINK_SHARE = {"all_reduce": 1.0, "reduce_scatter": 0.5, "all_gather": 0.5}
# Trials per row and the time each row and size gets in all. At 2 Gbit/s a 64 MiB call takes about
# 0.3-0.5 s, so a trial is one call there: 5 trials keep a sweep of 4 KiB-64 MiB near 2 minutes.
DEFAULT_TRIALS = 5
DEFAULT_ROW_SECONDS = 1.0
# Rendezvous port of the emulated hosts' ranks (inside their own namespaces, so any free port works).
PORT = 29517
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(k|m|g)?bit$")


def link_bytes_per_second(link: str) -> float:
    """A tc rate such as "2gbit" in bytes per second."""
    match = _RATE.match(link.lower())
    if not match:
        raise SystemExit(f"--link {link!r}: give a rate in tc's words, e.g. 2gbit or 500mbit")
    scale = {None: 1, "k": 1e3, "m": 1e6, "g": 1e9}[match.group(2)]
    return float(match.group(1)) * scale / 8


def parse_layout(text: str) -> list:
    """ "2x2" (hosts x ranks) or "2+1+2" (ranks of each host) -> ranks per host."""
    if re.fullmatch(r"\d+x\d+", text):
        hosts, per_host = map(int, text.split("x"))
        counts = [per_host] * hosts
    elif re.fullmatch(r"\d+(\+\d+)*", text):
        counts = [int(c) for c in text.split("+")]
    else:
        raise SystemExit(f"--hosts {text!r}: give HOSTSxRANKS (2x2) or the ranks of each host (2+1+2)")
    if min(counts) < 1 or len(counts) < 1:
        raise SystemExit(f"--hosts {text!r}: every host needs at least one rank")
    return counts


def bounds(nbytes, counts, link_Bps, collective="all_reduce"):
    """Seconds the host links need at least: (flat ring, hierarchical, {compression: hierarchical
    with float32 compressed between hosts})."""
    hosts, world = len(counts), sum(counts)
    share = 2 * LINK_SHARE[collective] * nbytes / link_Bps
    hierarchical = (hosts - 1) / hosts * share
    compressed = {name: hierarchical * wire / 4 for name, wire in WIRE_BYTES_PER_VALUE.items()}
    return (world - 1) / world * share, hierarchical, compressed


def run(counts, link, sizes, trials=DEFAULT_TRIALS, row_seconds=DEFAULT_ROW_SECONDS, rows=ROWS,
        collective="all_reduce"):
    """The records of one run: per size, each row's median and fastest trial (seconds per call)."""
    reason = available()
    if reason:
        raise SystemExit(f"--hosts: {reason}")
    if collective not in LINK_SHARE:
        raise SystemExit(f"--hosts times {', '.join(LINK_SHARE)}; not --collective {collective}")
    # Hierarchy needs several ranks on some host; the reduce-scatter's and all-gather's, that it move
    # fewer bytes across hosts than the ring (not on 2+1+2).
    host_of_rank = [host for host, count in enumerate(counts) for _ in range(count)]
    if max(counts) == 1 or (collective != "all_reduce" and not _C.chunked_hierarchy_pays(host_of_rank)):
        rows = [r for r in rows if r not in ("hierarchical", *COMPRESSED)]
    options = json.dumps({"sizes": sizes, "trials": trials, "row_seconds": row_seconds, "rows": list(rows),
                          "collective": collective})
    with EmulatedHosts(len(counts), link=link) as hosts:
        procs = hosts.launch([sys.executable, "-m", "ringreduce.bench.hosts_rank", options], in_order(counts), port=PORT,
                             stdout=subprocess.PIPE, text=True)
        records = [json.loads(line) for line in procs[0].stdout]
        failed = [rank for rank, proc in enumerate(procs) if proc.wait() != 0]
        if failed:
            raise SystemExit(f"ranks {failed} of the emulated hosts failed (their errors are above)")
    link_Bps = link_bytes_per_second(link)
    for record in records:
        record["flat_bound_s"], record["hierarchical_bound_s"], record["compressed_bounds_s"] = bounds(
            record["bytes"], counts, link_Bps, collective)
    return records


def _speedup(record, names):
    """gloo's median time over the fastest of the rows `names` (NaN where either is missing)."""
    ours = [v["median_s"] for k, v in record["rows"].items() if k in names]
    return record["rows"]["gloo"]["median_s"] / min(ours) if ours and "gloo" in record["rows"] else float("nan")


def print_table(records, counts, link, collective="all_reduce", out=sys.stdout):
    rows = list(records[0]["rows"])
    exact = [r for r in rows if r != "gloo" and r not in COMPRESSED]
    compressed = [r for r in rows if r in COMPRESSED]
    out.write(f"# {len(counts)} emulated hosts ({'+'.join(map(str, counts))} ranks), links of {link} each way; "
              f"{collective} float32 SUM, median trial (fastest) in ms per call; bf16, fp16, int8: hierarchical, "
              "compressed between hosts; int8+fb: int8 keeping its rounding errors (error feedback)\n")
    out.write(f"{'size':>8} " + "".join(f"{name:>22}" for name in rows)
              + f"{'flat bound':>12}{'hier. bound':>12}" + "".join(f"{name + ' bound':>14}" for name in compressed)
              + f"{'exact/gloo':>11}" + "".join(f"{name + '/gloo':>13}" for name in compressed) + "\n")
    for record in records:
        cells = "".join(f"{r['median_s'] * 1e3:>13.2f} ({r['fastest_s'] * 1e3:>6.2f})" for r in record["rows"].values())
        speedups = "".join(f"{_speedup(record, names):>{width}.2f}x"
                           for names, width in [(exact, 10)] + [((name,), 12) for name in compressed])
        out.write(f"{human_bytes(record['bytes']):>8} {cells}{record['flat_bound_s'] * 1e3:>12.2f}"
                  f"{record['hierarchical_bound_s'] * 1e3:>12.2f}"
                  + "".join(f"{record['compressed_bounds_s'][name] * 1e3:>14.2f}" for name in compressed)
                  + f"{speedups}\n")
    for name in compressed:
        out.write(f"{name} error vs float64 (max, RMS relative; inputs of one sign): " + ", ".join(
            f"{human_bytes(r['bytes'])} {r['rows'][name]['max_error']:.2e} {r['rows'][name]['rms_error']:.2e}"
            for r in records) + "\n")
    # On emulated hosts every rank shares this machine's cores: where the rows' CPU time per call
    # nears the cores' share of the call's time, the machine, not the links, sets the pace.
    out.write("CPU s per call, every rank together (user + system): " + "; ".join(
        f"{human_bytes(r['bytes'])} " + ", ".join(f"{name} {sum(v['cpu_s']):.3f}" for name, v in r["rows"].items())
        for r in records) + "\n")
    if "auto" in rows:
        out.write("auto ran: " + ", ".join(f"{human_bytes(r['bytes'])} {r['rows']['auto'].get('ran')}"
                                           for r in records) + "\n")


def plot(records, counts, link, path, collective="all_reduce"):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [r["bytes"] for r in records]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in records[0]["rows"]:
        ax.plot(sizes, [r["rows"][name]["median_s"] * 1e3 for r in records], marker="o", label=name)
    ax.plot(sizes, [r["flat_bound_s"] * 1e3 for r in records], "k--", label="flat ring's bound")
    ax.plot(sizes, [r["hierarchical_bound_s"] * 1e3 for r in records], "k:", label="hierarchical bound")
    for name in (n for n in records[0]["rows"] if n in COMPRESSED):  # (bf16's and fp16's coincide)
        ax.plot(sizes, [r["compressed_bounds_s"][name] * 1e3 for r in records], "k-.", alpha=0.5, label=f"{name} bound")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bytes")
    ax.set_ylabel(f"ms per {collective} (median trial)")
    ax.set_title(f"{len(counts)} emulated hosts ({'+'.join(map(str, counts))} ranks), {link} links")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main(args, sizes):
    counts = parse_layout(args.hosts)
    records = run(counts, args.link, sizes, collective=args.collective)
    print_table(records, counts, args.link, args.collective)
    rates = None
    points = model.observations(records, counts) if args.collective == "all_reduce" else []
    if points:
        rates = model.fit(points)
        sys.stdout.write("# the cost model (ringreduce/bench/model.py) fitted to this run's rows\n")
        model.print_fit(rates, points)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"hosts": counts, "link": args.link, "collective": args.collective, "records": records,
                       "model_rates": rates}, f, indent=1)
    if args.plot:
        plot(records, counts, args.link, args.plot, args.collective)
