"""The training examples run on the ringreduce backend and learn exactly what they learn on gloo."""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
# Small enough for a test, large enough for several batches and a falling loss.
SMALL_RUN = ["--epochs", "2", "--samples", "2048", "--batch", "64"]
EXAMPLE_TIMEOUT_S = 240
# The command docs/elastic.md opens with: it runs here, with --json and --plot (tests/test_docs.py
# leaves it to this test).
ELASTIC_PAGE = pathlib.Path(EXAMPLES).parent / "docs" / "elastic.md"
ELASTIC_ARGS = ["--nproc", "3", "--kill-rank", "2", "--kill-step", "6", "--steps", "20"]


def _losses(script, backend, extra):
    done = subprocess.run([sys.executable, os.path.join(EXAMPLES, script), "--backend", backend, *SMALL_RUN, *extra],
                          capture_output=True, text=True, timeout=EXAMPLE_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    losses = [float(v) for v in re.findall(r"loss (\d+\.\d+)", done.stdout)]
    assert len(losses) == 2, done.stdout
    return losses


@pytest.mark.parametrize("script, extra", [
    ("train_ddp.py", ["--hook", "builtin"]),
    ("train_sharded.py", ["--shard", "fsdp"]),
    ("train_sharded.py", ["--shard", "zero"]),
])
def test_example_learns_what_it_learns_on_gloo(script, extra):
    ours = _losses(script, "ringreduce", extra)
    assert ours == _losses(script, "gloo", extra), "the printed losses (4 decimals) differ from gloo's"
    assert ours[1] < ours[0], "the loss falls"


def test_elastic_example_trains_through_a_killed_rank(tmp_path):
    """The line docs/elastic.md opens with (examples/elastic_ddp.py: rank 2 of 3 dies in a backward):
    the other two shrink and finish, with identical parameters (the script checks), and the loss after
    the fault is below the first."""
    shown = f"\npython examples/elastic_ddp.py {' '.join(ELASTIC_ARGS)}   #"
    assert shown in ELASTIC_PAGE.read_text(), "docs/elastic.md opens with another command: run that one here"
    out = tmp_path / "run.json"
    done = subprocess.run([sys.executable, os.path.join(EXAMPLES, "elastic_ddp.py"), *ELASTIC_ARGS,
                           "--json", str(out), "--plot", str(tmp_path / "run.png")],
                          capture_output=True, text=True, timeout=EXAMPLE_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "fault at step 6 (backward)" in done.stdout, done.stdout
    run = json.loads(out.read_text())
    losses = [loss for _, loss in run["losses"]]
    assert [step for step, _ in run["losses"]] == list(range(20))  # the failed step was done again
    assert losses[-1] < losses[0]
    assert (tmp_path / "run.png").stat().st_size > 0
