"""algorithm="auto": the table that chooses, the files it comes from, and what it runs."""

import json

import pytest
import torch

import ringreduce
from ringreduce import _C, tuning
from ringreduce._checks import ALGORITHM_CODES
from reference import ALL_DTYPES, R, assert_bitwise_equal, exact_inputs, ops_for, reference

NAMES = {code: name for name, code in ALGORITHM_CODES.items()}
LINES = [
    {"transport": "shm", "world": 2, "up_to_bytes": 4096, "algorithm": "one_shot"},
    {"transport": "shm", "world": 2, "up_to_bytes": 1 << 20, "algorithm": "central"},
    {"transport": "shm", "world": 2, "up_to_bytes": None, "algorithm": "ring"},
    {"transport": "shm", "world": 8, "up_to_bytes": None, "algorithm": "central"},
]


@pytest.fixture
def table():
    """Installs LINES, and the table of the environment again afterwards."""
    tuning.install(LINES, "the test table")
    yield
    tuning.load()


def choice(transport, world, nbytes, host_memory=True):
    return NAMES[_C.choose_algorithm(transport, world, nbytes, host_memory)]


def test_the_first_line_that_covers_the_size_wins(table):
    assert [choice("shm", 2, n) for n in (1, 4096, 4097, 1 << 20, (1 << 20) + 1, 1 << 30)] == [
        "one_shot", "one_shot", "central", "central", "ring", "ring"]


def test_the_largest_measured_world_not_above_applies(table):
    assert choice("shm", 4, 100) == "one_shot"  # 2 is the largest measured at or below 4
    assert choice("shm", 8, 100) == "central"
    assert choice("shm", 16, 100) == "central"
    assert choice("shm", 1, 100) == "one_shot"  # below every measured world: the smallest


def test_no_lines_means_ring_and_one_shot_stays_off_devices(table):
    assert choice("pg", 2, 100) == "ring"
    assert choice("shm", 2, 100, host_memory=False) == "ring"


def test_every_shipped_line_is_valid_and_every_transport_ends_in_any_size():
    lines = tuning.validate({"format": tuning.FORMAT, "lines": tuning.DEFAULT_LINES}, "defaults")
    for key in {(l["transport"], l["world"]) for l in lines}:
        sizes = [l["up_to_bytes"] for l in lines if (l["transport"], l["world"]) == key]
        assert sizes[-1] is None and all(s is not None for s in sizes[:-1]), key


@pytest.mark.parametrize("table_text, complaint", [
    ("[]", "not a ringreduce tuning table"),
    ('{"format": 1, "lines": [{"transport": "shm", "world": 0, "up_to_bytes": 1, "algorithm": "ring"}]}', "bad line"),
    ('{"format": 1, "lines": [{"transport": "shm", "world": 2, "up_to_bytes": 1, "algorithm": "auto"}]}', "bad line"),
    ('{"format": 1, "lines": [{"transport": "shm", "world": 2, "algorithm": "ring"}]}', "bad line"),
    ("{not json", "cannot read"),
])
def test_a_bad_file_is_refused_with_its_name(table_text, complaint, tmp_path, monkeypatch):
    path = tmp_path / "tuning.json"
    path.write_text(table_text)
    monkeypatch.setenv(tuning.FILE_ENV, str(path))
    with pytest.raises(ValueError, match=complaint) as error:
        tuning.load()
    assert str(path) in str(error.value)
    monkeypatch.delenv(tuning.FILE_ENV)
    tuning.load()


def test_the_file_of_the_environment_is_used(tmp_path, monkeypatch):
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps({"format": 1, "lines": [{"transport": "local", "world": 2, "up_to_bytes": None,
                                                         "algorithm": "central"}]}))
    monkeypatch.setenv(tuning.FILE_ENV, str(path))
    try:
        assert tuning.load() == str(path)
        assert choice("local", 3, 1 << 30) == "central"
    finally:
        monkeypatch.delenv(tuning.FILE_ENV)
        tuning.load()


def test_debug_logging_says_each_line_once_with_the_reason(table, monkeypatch, capsys):
    monkeypatch.setenv("RINGREDUCE_DEBUG", "INFO")
    _C.set_auto_logging(True)
    try:
        for _ in range(3):
            choice("shm", 2, 100)
        choice("shm", 2, 1 << 30)
    finally:
        _C.set_auto_logging(False)
    heard = [line.split(" ringreduce INFO ", 1)[1] for line in capsys.readouterr().err.splitlines()]
    assert len(heard) == 2, heard
    assert heard[0] == ('auto chose one_shot for 100 B on shm with 2 ranks: the line "shm, 2 ranks, up to 4096 B: '
                        'one_shot" of the test table')
    assert "auto chose ring" in heard[1] and "any size" in heard[1]


@pytest.mark.parametrize("world", [2, 3, 4])
def test_auto_on_local_ranks_matches_the_closed_form_at_every_size(world):
    """Sizes on both sides of the local crossovers, every dtype and op, bitwise on every rank."""
    local = ringreduce.LocalWorld(world)
    for numel in (1, 1000, 70_000, 300_000):
        for dtype in ALL_DTYPES:
            for op in ops_for(dtype):
                inputs = exact_inputs(world, numel, dtype, op)
                tensors = [t.clone() for t in inputs]
                local.all_reduce(tensors, op=op, algorithm="auto")
                assert_bitwise_equal(tensors, reference(inputs, op), f"auto world={world} numel={numel} {dtype} {op}")


def test_an_unknown_algorithm_names_the_choices():
    with pytest.raises(ValueError, match="'auto', 'ring', 'central' or 'one_shot'"):
        ringreduce.all_reduce(torch.ones(3), algorithm="two_shot", group=ringreduce.LocalWorld(1).group(0))
