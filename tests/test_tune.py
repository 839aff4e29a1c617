"""python -m ringreduce.tune: from measured times to the table that auto reads."""

import json
import os
import subprocess
import sys

from ringreduce import _C, tuning
from ringreduce._checks import ALGORITHM_CODES
from ringreduce.tune import lines_from, winners

TUNE_TIMEOUT_S = 240


def records(transport, world, times):
    return [{"transport": transport, "world": world, "bytes": size, "algorithm": a, "time_us": us}
            for size, row in times.items() for a, us in row.items()]


def test_the_fastest_wins_and_runs_merge_into_lines():
    times = {4096: {"one_shot": 3, "ring": 5}, 8192: {"one_shot": 4, "ring": 6},
             16384: {"one_shot": 9, "ring": 7}, 32768: {"one_shot": 20, "ring": 9}}
    assert lines_from(records("shm", 2, times)) == [
        {"transport": "shm", "world": 2, "up_to_bytes": 8192, "algorithm": "one_shot"},
        {"transport": "shm", "world": 2, "up_to_bytes": None, "algorithm": "ring"},
    ]


def test_a_lone_size_goes_to_its_neighbours_only_when_they_are_close():
    close = {1: {"a": 10, "b": 20}, 2: {"a": 10.5, "b": 10}, 3: {"a": 10, "b": 20}}
    assert winners(close) == [(1, "a"), (2, "a"), (3, "a")]
    far = {1: {"a": 10, "b": 20}, 2: {"a": 15, "b": 10}, 3: {"a": 10, "b": 20}}
    assert winners(far) == [(1, "a"), (2, "b"), (3, "a")]


def test_each_transport_and_world_gets_lines_of_its_own():
    lines = lines_from(records("shm", 4, {4096: {"central": 1, "ring": 2}}) +
                       records("local", 2, {4096: {"central": 2, "ring": 1}}))
    assert [(l["transport"], l["world"], l["algorithm"], l["up_to_bytes"]) for l in lines] == [
        ("local", 2, "ring", None), ("shm", 4, "central", None)]


def test_a_short_tuning_run_writes_a_table_that_auto_then_reads(tmp_path):
    out = tmp_path / "tuning.json"
    done = subprocess.run([sys.executable, "-m", "ringreduce.tune", "--worlds", "2", "-b", "4K", "-e", "16K", "-f", "4",
                           "--trials", "1", "--iters", "3", "-o", str(out)],
                          capture_output=True, text=True, timeout=TUNE_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    table = json.loads(out.read_text())
    lines = tuning.validate(table, str(out))
    assert {(l["transport"], l["world"]) for l in lines} == {("shm", 2), ("local", 2)}
    assert "# shm, 2 ranks" in done.stdout and f"# wrote {out}" in done.stdout
    os.environ[tuning.FILE_ENV] = str(out)
    try:
        assert tuning.load() == str(out)
        first = next(l for l in lines if l["transport"] == "shm")
        assert _C.choose_algorithm("shm", 2, 4096, True) == ALGORITHM_CODES[first["algorithm"]]
    finally:
        del os.environ[tuning.FILE_ENV]
        tuning.load()
