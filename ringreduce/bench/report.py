"""Records, the nccl-tests-style table, the plot and the progress bar of ringreduce.bench."""

import sys
import time


def human_bytes(n: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


# busbw / algbw per collective (nccl-tests): the share of the buffer each rank's links must carry.
BUS_FACTORS = {
    "all_reduce": ("2(n-1)/n", lambda n: 2 * (n - 1) / n),
    "reduce_scatter": ("(n-1)/n", lambda n: (n - 1) / n),
    "all_gather": ("(n-1)/n", lambda n: (n - 1) / n),
    "broadcast": ("1", lambda n: 1.0),
    "reduce": ("1", lambda n: 1.0),
}


def bus_factor(world: int, collective: str = "all_reduce") -> float:
    return BUS_FACTORS[collective][1](world) if world > 1 else 0.0


def record(impl, algorithm, transport, world, dtype, op, nbytes, count, row_time, wrong,
           collective="all_reduce") -> dict:
    """`row_time`: a timing.RowTime (seconds per call in the median trial and the fastest)."""
    algbw = nbytes / row_time.median / 1e9
    return {
        "collective": collective,
        "impl": impl,
        "algorithm": algorithm,
        "transport": transport,
        "world": world,
        "dtype": dtype,
        "op": op,
        "bytes": nbytes,
        "count": count,
        "time_us": row_time.median * 1e6,
        "fastest_us": row_time.fastest * 1e6,
        "algbw_GBps": algbw,
        "busbw_GBps": algbw * bus_factor(world, collective),
        "wrong": wrong,
    }


def row_name(r) -> str:
    if r["impl"] == "ringreduce":
        return f"ringreduce {r['algorithm']}/{r['transport']}"
    return f"{r['impl']} ({r['transport']})"


def print_table(records, memcpy_GBps, out=sys.stdout):
    if not records:
        return
    first = records[0]
    collective = first.get("collective", "all_reduce")
    names = list(dict.fromkeys(row_name(r) for r in records))
    width = max(len(n) for n in names)
    out.write(
        f"# {collective}, {first['world']} ranks, {first['dtype']} {first['op']}; "
        f"busbw = algbw * {BUS_FACTORS[collective][0]}; memcpy {memcpy_GBps:.2f} GB/s (one thread, bytes copied per second "
        f"at the largest size); %memcpy = busbw / memcpy\n#\n"
    )
    out.write(
        f"# {'size':>10} {'count':>10} {'type':>8} {'redop':>5}  {'impl':<{width}} {'time':>10} {'fastest':>10} "
        f"{'algbw':>7} {'busbw':>7} {'#wrong':>6} {'%memcpy':>7}\n"
        f"# {'(B)':>10} {'(elements)':>10} {'':>8} {'':>5}  {'':<{width}} {'(us)':>10} {'(us)':>10} {'(GB/s)':>7} "
        f"{'(GB/s)':>7}\n"
    )
    for r in sorted(records, key=lambda r: (r["bytes"], names.index(row_name(r)))):
        out.write(
            f"  {r['bytes']:>10} {r['count']:>10} {r['dtype']:>8} {r['op']:>5}  {row_name(r):<{width}} "
            f"{r['time_us']:>10.1f} {r['fastest_us']:>10.1f} {r['algbw_GBps']:>7.3f} {r['busbw_GBps']:>7.3f} "
            f"{r['wrong']:>6} {100 * r['busbw_GBps'] / memcpy_GBps:>7.1f}\n"
        )
    out.write("#\n")
    for name in names:
        rows = [r for r in records if row_name(r) == name]
        out.write(f"# Avg bus bandwidth {name:<{width}} : {sum(r['busbw_GBps'] for r in rows) / len(rows):.3f} GB/s\n")
    # The ratios twice: by each row's median trial, and by its fastest, which this host's slow
    # spells (seconds of every call at 5-10x its time) move far less (timing.timed_trials).
    for key in TIME_KEYS:
        print_ratios(records, out, key)
        print_auto(records, out, key)


# A record's times, and what the ratio tables call them.
TIME_KEYS = {"time_us": "median trials", "fastest_us": "fastest trials"}


def print_auto(records, out, key):
    """Per transport, auto's time over the best fixed algorithm's at each size (1.00: auto chose it)."""
    ours = [r for r in records if r["impl"] == "ringreduce"]
    by_key = {(r["transport"], r["algorithm"], r["bytes"]): r[key] for r in ours}
    transports = list(dict.fromkeys(r["transport"] for r in ours if r["algorithm"] == "auto"))
    sizes = sorted({r["bytes"] for r in ours})
    for transport in transports:
        fixed = [a for a in dict.fromkeys(r["algorithm"] for r in ours if r["transport"] == transport)
                 if a in ("ring", "central", "one_shot")]
        if not fixed:
            continue
        out.write(f"#\n# auto/{transport} against the best of {', '.join(fixed)} (auto's time / the best; "
                  f"{TIME_KEYS[key]})\n"
                  "# " + " " * 28 + "".join(f"{human_bytes(s):>9}" for s in sizes) + "\n")
        cells = []
        for size in sizes:
            auto = by_key.get((transport, "auto", size))
            best = min((by_key[(transport, a, size)] for a in fixed if (transport, a, size) in by_key), default=None)
            cells.append(f"{auto / best:>9.2f}" if auto and best else f"{'-':>9}")
        out.write(f"# {'auto / best':<28}" + "".join(cells) + "\n")
        # Two rows that run the same algorithm differ by the machine's noise alone: auto against
        # the row of what it ran tells that noise from a wrong choice.
        ran = {r["bytes"]: r.get("auto_ran") for r in ours if r["transport"] == transport and r["algorithm"] == "auto"}
        out.write(f"# {'auto ran':<28}" + "".join(f"{ran.get(s) or '-':>9}" for s in sizes) + "\n")
        cells = []
        for size in sizes:
            auto, own = by_key.get((transport, "auto", size)), by_key.get((transport, ran.get(size), size))
            cells.append(f"{auto / own:>9.2f}" if auto and own else f"{'-':>9}")
        out.write(f"# {'auto / the row of what it ran':<28}" + "".join(cells) + "\n")


def print_ratios(records, out, key):
    """Speed-ups of every ringreduce row over each baseline present, size by size."""
    baselines = sorted({row_name(r) for r in records if r["impl"] != "ringreduce"})
    if not baselines:
        return
    by_key = {(row_name(r), r["bytes"]): r for r in records}
    mine = [n for n in dict.fromkeys(row_name(r) for r in records) if n.startswith("ringreduce")]
    sizes = sorted({r["bytes"] for r in records})
    width = max(28, *(len(n) for n in mine))
    for base in baselines:
        out.write(f"#\n# speed-up over {base} (its time / ours; > 1 is faster; {TIME_KEYS[key]})\n")
        out.write("# " + " " * width + "".join(f"{human_bytes(s):>9}" for s in sizes) + "\n")
        for name in mine:
            cells = []
            for size in sizes:
                ours, theirs = by_key.get((name, size)), by_key.get((base, size))
                cells.append(f"{theirs[key] / ours[key]:>9.2f}" if ours and theirs else f"{'-':>9}")
            out.write(f"# {name:<{width}}" + "".join(cells) + "\n")


def plot(records, path):
    """busbw against size, a panel per collective timed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    collectives = list(dict.fromkeys(r.get("collective", "all_reduce") for r in records))
    fig, axes = plt.subplots(1, len(collectives), figsize=(8 * len(collectives), 5), squeeze=False)
    for ax, collective in zip(axes[0], collectives):
        shown = [r for r in records if r.get("collective", "all_reduce") == collective]
        for name in dict.fromkeys(row_name(r) for r in shown):
            rows = sorted((r for r in shown if row_name(r) == name), key=lambda r: r["bytes"])
            style = "-" if name.startswith("ringreduce ring") else "--" if name.startswith("ringreduce") else ":"
            ax.plot([r["bytes"] for r in rows], [r["busbw_GBps"] for r in rows], style, marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")  # rows span three orders of magnitude
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(f"{collective}, {shown[0]['world']} ranks, {shown[0]['dtype']} {shown[0]['op']}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


class Progress:
    """A one-line progress bar on stderr."""

    WIDTH = 30

    def __init__(self, total, enabled=True):
        self.total, self.count, self.enabled = total, 0, enabled and total > 0
        self.start = time.perf_counter()

    def step(self, label):
        if not self.enabled:
            return
        filled = self.WIDTH * self.count // self.total
        elapsed = time.perf_counter() - self.start
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (self.WIDTH - filled)}] {self.count}/{self.total} "
                         f"{elapsed:5.0f}s {label:<40}")
        sys.stderr.flush()
        self.count += 1

    def done(self):
        if self.enabled:
            sys.stderr.write(f"\r{' ' * (self.WIDTH + 60)}\r")
            sys.stderr.flush()
