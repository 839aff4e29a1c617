"""The cost model of an all-reduce across hosts (csrc/engine/cost_model.h), fitted to the benchmark.

Each algorithm's schedule gives its terms (rounds of link messages, bytes through the busiest host
link, shared-memory steps and bytes, bytes reduced); rates in seconds per unit turn them into a
prediction. `fit` finds the rates that best explain measured rows, by least squares on the relative
error, none negative. The benchmark across hosts prints each row's prediction from rates fitted to
its own rows; this module's command fits the rows of several runs (their --json files) and predicts
groups of 64-1024 ranks from them:

    python -m ringreduce.bench --hosts 16x1 --link 2gbit --sizes 4K,64K,1M,16M --json a.json
    python -m ringreduce.bench --hosts 8x2 --link 2gbit --sizes 4K,64K,1M,16M --json b.json
    python -m ringreduce.bench.model a.json b.json --plot model.png
"""

import argparse
import json
import sys

import torch

from ringreduce import _C
from ringreduce._checks import ALGORITHM_CODES
from ringreduce.bench.report import human_bytes

RATES = ("link_latency_s", "link_s_per_byte", "local_latency_s", "local_s_per_byte", "reduce_s_per_byte")
TERMS = ("link_messages", "link_bytes", "local_messages", "local_bytes", "reduced_bytes")
# The benchmark's rows the model prices (the others are gloo's, auto's, or compressed).
MODELLED = ("ring", "hierarchical", "doubling", "halving_doubling")
# Width of an algorithm's column in the tables.
NAME_WIDTH = max(len(name) for name in MODELLED)
# Layouts it predicts: (hosts, ranks per host) at 64-1024 ranks, one rank per host and eight.
PREDICTED_LAYOUTS = [(n, 1) for n in (64, 128, 256, 512, 1024)] + [(n // 8, 8) for n in (64, 128, 256, 512, 1024)]
PREDICTED_SIZES = (4 << 10, 64 << 10, 1 << 20, 16 << 20)


def terms(algorithm, nbytes, counts):
    """The model's terms of an all-reduce of `nbytes` by `algorithm` on hosts of `counts` ranks, each
    host's ranks consecutive (as torchrun and the benchmark place them)."""
    if not counts or min(counts) < 1:
        raise ValueError(f"ranks per host {list(counts)}: every host needs at least one rank")
    host_of_rank = [host for host, count in enumerate(counts) for _ in range(count)]
    return _C.all_reduce_cost_terms(ALGORITHM_CODES[algorithm], int(nbytes), host_of_rank)


def predict(rates, algorithm, nbytes, counts):
    """Seconds the model gives an all-reduce at `rates` (a dict of RATES)."""
    t = terms(algorithm, nbytes, counts)
    return sum(t[term] * rates[rate] for term, rate in zip(TERMS, RATES))


def observations(records, counts):
    """(algorithm, bytes, counts, median seconds) of every modelled row of one run's records."""
    return [(name, r["bytes"], counts, r["rows"][name]["median_s"])
            for r in records for name in MODELLED if name in r["rows"]]


def fit(points):
    """Rates (a dict of RATES) that best fit `points` of (algorithm, bytes, counts, seconds), by least
    squares on the relative error. A rate the points say nothing of (its term zero in every one) is
    0; a rate the solution makes negative is set to 0 and the rest fitted again, the most negative
    first, until none is."""
    if not points:
        raise ValueError("the cost model needs at least one measured row to fit")
    rows = torch.tensor([[terms(a, b, c)[t] for t in TERMS] for a, b, c, _ in points], dtype=torch.float64)
    seconds = torch.tensor([s for *_, s in points], dtype=torch.float64)
    weighted = rows / seconds.unsqueeze(1)  # each row's error relative to its time
    ones = torch.ones(len(points), 1, dtype=torch.float64)
    free = [i for i in range(len(RATES)) if bool(rows[:, i].any())]
    while free:
        solution = torch.linalg.lstsq(weighted[:, free], ones, driver="gelsd").solution.squeeze(1)
        if solution.min() >= 0:
            break
        free.pop(int(solution.argmin()))
    rates = dict.fromkeys(RATES, 0.0)
    for place, index in enumerate(free):
        rates[RATES[index]] = float(solution[place])
    return rates


def _layout_text(counts):
    return f"{len(counts)}x{counts[0]}" if len(set(counts)) == 1 else "+".join(map(str, counts))


def print_fit(rates, points, out=sys.stdout):
    out.write("# fitted rates: " + ", ".join(
        f"{name} {rates[name] * (1e6 if name.endswith('latency_s') else 1e9):.3g} "
        f"{'us' if name.endswith('latency_s') else 'ns/B'}" for name in RATES) + "\n")
    out.write(f"{'layout':>8} {'algorithm':>{NAME_WIDTH}} {'size':>8} {'measured ms':>12} {'model ms':>10} "
              f"{'model/meas.':>12}\n")
    for algorithm, nbytes, counts, seconds in points:
        model = predict(rates, algorithm, nbytes, counts)
        out.write(f"{_layout_text(counts):>8} {algorithm:>{NAME_WIDTH}} {human_bytes(nbytes):>8} {seconds * 1e3:>12.2f}"
                  f" {model * 1e3:>10.2f} {model / seconds:>12.2f}\n")


def predictions(rates, layouts=PREDICTED_LAYOUTS, sizes=PREDICTED_SIZES):
    """{(hosts, per_host, bytes): {algorithm: seconds}} for every layout and size."""
    table = {}
    for hosts, per_host in layouts:
        counts = [per_host] * hosts
        algorithms = MODELLED if per_host > 1 else tuple(a for a in MODELLED if a != "hierarchical")
        for nbytes in sizes:
            table[(hosts, per_host, nbytes)] = {a: predict(rates, a, nbytes, counts) for a in algorithms}
    return table


def print_predictions(table, out=sys.stdout):
    out.write("# predicted ms per all-reduce (best marked *)\n")
    out.write(f"{'ranks':>6} {'layout':>8} {'size':>8}" + "".join(f"{a:>{NAME_WIDTH + 1}}" for a in MODELLED) + "\n")
    for (hosts, per_host, nbytes), by_algorithm in table.items():
        best = min(by_algorithm, key=by_algorithm.get)
        cells = "".join(
            f"{'-' if a not in by_algorithm else f'{by_algorithm[a] * 1e3:.2f}' + ('*' if a == best else ' '):>{NAME_WIDTH + 1}}"
            for a in MODELLED)
        out.write(f"{hosts * per_host:>6} {f'{hosts}x{per_host}':>8} {human_bytes(nbytes):>8}{cells}\n")


def plot(table, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({nbytes for _, _, nbytes in table})
    fig, axes = plt.subplots(1, len(sizes), figsize=(4 * len(sizes), 4), sharey=False)
    for ax, nbytes in zip(axes, sizes):
        for per_host, style in ((1, "-"), (8, "--")):
            keys = sorted((k for k in table if k[1] == per_host and k[2] == nbytes), key=lambda k: k[0] * k[1])
            for algorithm in MODELLED:
                if per_host > 1 and algorithm == "ring":
                    continue  # the same as on one rank per host: a ring crosses each host's link once
                if keys and algorithm in table[keys[0]]:
                    label = "ring, any layout" if algorithm == "ring" else f"{algorithm}, {per_host}/host"
                    ax.plot([k[0] * k[1] for k in keys], [table[k][algorithm] * 1e3 for k in keys], style, marker="o",
                            label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("ranks")
        ax.set_title(f"{human_bytes(nbytes)} all-reduce")
    axes[0].set_ylabel("predicted ms")
    axes[-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="--json files of `python -m ringreduce.bench --hosts ...` (all_reduce)")
    parser.add_argument("--plot", help="a PNG of predicted cost against ranks")
    args = parser.parse_args(argv)
    points = []
    for path in args.runs:
        with open(path) as f:
            run = json.load(f)
        if run.get("collective", "all_reduce") != "all_reduce":
            raise SystemExit(f"{path}: the model prices all-reduces; this run timed {run['collective']}")
        points += observations(run["records"], run["hosts"])
    rates = fit(points)
    print_fit(rates, points)
    table = predictions(rates)
    print_predictions(table)
    if args.plot:
        plot(table, args.plot)


if __name__ == "__main__":
    main()
