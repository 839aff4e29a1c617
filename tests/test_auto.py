"""algorithm="auto": the table that fixes the choice, the files it comes from, the learner that
chooses without one, and what they run."""

import gc
import json
import re

import pytest
import torch

import ringreduce
from ringreduce import _C, tuning
from ringreduce._checks import ALGORITHM_CODES
from multiproc import run_ranks
from reference import ALL_DTYPES, assert_bitwise_equal, exact_inputs, ops_for, reference

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


def choice(transport, world, nbytes, host_memory=True, spans_hosts=False):
    return NAMES[_C.choose_algorithm(transport, world, nbytes, host_memory, spans_hosts)]


def test_the_first_line_that_covers_the_size_wins(table):
    assert [choice("shm", 2, n) for n in (1, 4096, 4097, 1 << 20, (1 << 20) + 1, 1 << 30)] == [
        "one_shot", "one_shot", "central", "central", "ring", "ring"]


def test_the_largest_measured_world_not_above_applies(table):
    assert choice("shm", 4, 100) == "one_shot"  # 2 is the largest measured at or below 4
    assert choice("shm", 8, 100) == "central"
    assert choice("shm", 16, 100) == "central"
    assert choice("shm", 1, 100) == "one_shot"  # below every measured world: the smallest


def test_without_lines_the_prior_from_theory_applies(table):
    """One-shot for small messages on host memory (doubling across hosts), ring for large ones and
    on devices."""
    assert choice("pg", 2, 100) == "one_shot"
    assert choice("pg", 2, 64 << 10) == "one_shot"
    assert choice("pg", 2, (64 << 10) + 1) == "ring"
    assert choice("shm", 2, 100, host_memory=False) == "ring"
    assert choice("pg", 16, 100, spans_hosts=True) == choice("pg", 16, 64 << 10, spans_hosts=True) == "doubling"
    assert choice("pg", 16, (64 << 10) + 1, spans_hosts=True) == "ring"
    assert choice("pg", 16, 100, host_memory=False, spans_hosts=True) == "ring"


def test_with_no_file_auto_learns(tmp_path, monkeypatch):
    monkeypatch.delenv(tuning.FILE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no ~/.cache/ringreduce/tuning.json either
    try:
        assert tuning.load() == tuning.LEARNED
        assert choice("shm", 4, 1 << 30) == "ring"
    finally:
        monkeypatch.undo()
        tuning.load()


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
    with pytest.raises(ValueError, match="'auto', 'ring', 'central', 'one_shot', 'hierarchical', 'doubling' or 'halving_doubling'"):
        ringreduce.all_reduce(torch.ones(3), algorithm="two_shot", group=ringreduce.LocalWorld(1).group(0))


LEARNED_LINE = re.compile(r"auto on (\w+) with (\d+) ranks, (\d+)-(\d+) B: tried ring ([\d.]+) us, central ([\d.]+) us"
                          r"(?:, one_shot ([\d.]+) us)? \(the slowest rank's mean of (\d+) calls each\): (\w+)")
# A size class explores its first calls: an untimed call of each candidate (ring, central, and
# one_shot below 1 MiB), then rounds of timed calls, each candidate's in a row, each round ended by
# the exchange of its times. The first round has 5 calls of each below 4 MiB and 2 above; a round whose
# fastest candidate took under 5 ms sizes the next for 10 ms, up to 1000 calls of each; a round the
# choice loses is followed by one more (engine/auto_choice.h).
FIRST_ROUND_CALLS = 5
ROUND_SECONDS = 0.010
MAX_ROUND_CALLS = 1000


def candidates(nbytes):
    return 3 if nbytes < (1 << 20) else 2


def most_exploring_calls(nbytes):
    """A bound: the untimed calls, short rounds growing to the longest, and a second longest."""
    short_rounds = sum(range(FIRST_ROUND_CALLS, MAX_ROUND_CALLS))
    return candidates(nbytes) * (1 + short_rounds + 2 * MAX_ROUND_CALLS)


def until_decided(decided, call, bound):
    """Calls call(i) until decided() (at most `bound` calls); the number of calls."""
    made = 0
    while not decided():
        assert made < bound, "auto did not decide"
        call(made)
        made += 1
    return made


# The environment of processes that must find no table (and learn).
NO_TABLE = {"RINGREDUCE_TUNING_FILE": "", "XDG_CACHE_HOME": "/nonexistent/ringreduce-test-cache"}


RETRIED_LINE = re.compile(r"auto on \w+ with \d+ ranks, from (\d+) B: \w+ looked faster than \w+; trying again")


def learned_lines(text):
    return [m.groups() for m in LEARNED_LINE.finditer(text)]


def retried_classes(text):
    """The smallest sizes of the classes where a round's winner was tried again before switching."""
    return {m.group(1) for m in RETRIED_LINE.finditer(text)}


def counted_inputs(world, numel, call):
    """Rank r holds (r + 1) * i + call at index i: sums exact in float32."""
    return [torch.arange(numel, dtype=torch.float32) * (r + 1) + call for r in range(world)]


def counted_sum(world, numel, call):
    return (torch.arange(numel, dtype=torch.float64) * sum(range(1, world + 1)) + world * call).float()


@pytest.fixture
def learning(monkeypatch, capsys):
    """No table (auto learns), RINGREDUCE_DEBUG=INFO; yields a reader of what was said."""
    tuning.install([], tuning.LEARNED)
    monkeypatch.setenv("RINGREDUCE_DEBUG", "INFO")
    _C.set_auto_logging(True)
    yield lambda: capsys.readouterr().err
    _C.set_auto_logging(False)
    tuning.load()


def assert_judged_on_a_long_round(line):
    """The round that decided gave its fastest candidate at least 5 ms of calls (half the 10 ms it
    was sized for), or the most calls."""
    means = [float(t) for t in line[4:7] if t is not None]
    calls = int(line[7])
    assert min(means) * calls >= ROUND_SECONDS / 2 * 1e6 * 0.99 or calls == MAX_ROUND_CALLS, line


def assert_the_fastest_won(line, retried):
    """Another candidate replaces the prior (one_shot up to 64 KiB, else ring) only after the prior
    lost two rounds, the last of them the logged one, whose fastest takes over; the prior stays when
    within 5% of the fastest in the logged round."""
    times = {"ring": float(line[4]), "central": float(line[5])}
    if line[6] is not None:
        times["one_shot"] = float(line[6])
    chosen = line[8]
    prior = "one_shot" if int(line[2]) <= (64 << 10) else "ring"
    fastest = min(times.values())
    if chosen != prior:
        assert times[chosen] == fastest and line[2] in retried, (line, retried)
    else:
        assert fastest >= times[prior] * 0.95 - 0.1 or line[2] in retried, (line, retried)


@pytest.mark.parametrize("world", [2, 3])
def test_learning_tries_every_candidate_and_keeps_the_fastest_with_exact_results_throughout(world, learning):
    local = ringreduce.LocalWorld(world)
    numel = 3000  # 12000 B of float32: one size class

    def exact_call(call):
        tensors = counted_inputs(world, numel, call)
        local.all_reduce(tensors, algorithm="auto")
        assert_bitwise_equal(tensors, counted_sum(world, numel, call), f"call {call}")

    def decided():
        return all(8192 in c.auto_choices() for c in local._communicators)

    made = until_decided(decided, exact_call, most_exploring_calls(4 * numel))
    for call in range(made, made + 3):
        exact_call(call)
    said = learning()
    lines = learned_lines(said)
    assert len(lines) == 1, lines  # one decision, said once: every rank reached the same
    assert lines[0][:4] == ("local", str(world), "8192", "16383")
    assert_judged_on_a_long_round(lines[0])
    assert_the_fastest_won(lines[0], retried_classes(said))


def test_the_trace_marks_the_exploring_calls_and_the_exchange(tmp_path, monkeypatch, learning):
    monkeypatch.setenv("RINGREDUCE_TRACE", str(tmp_path))
    local = ringreduce.LocalWorld(2)
    numel, extra = 3000, 4
    made = until_decided(lambda: 8192 in local._communicators[0].auto_choices(),
                         lambda call: local.all_reduce(counted_inputs(2, numel, call), algorithm="auto"),
                         most_exploring_calls(4 * numel))
    for call in range(made, made + extra):
        local.all_reduce(counted_inputs(2, numel, call), algorithm="auto")
    ringreduce.destroy()
    del local
    gc.collect()  # the communicators go, and write their files
    files = sorted(tmp_path.glob("ringreduce-local-rank*of2-*.json"))
    assert len(files) == 2, files
    candidates = ["ring", "central", "one_shot"]
    for f in files:
        collectives = [e for e in json.loads(f.read_text())["traceEvents"] if e.get("cat") == "collective"]
        roles = [e["args"].get("auto") for e in collectives]
        tried = [e["args"]["algorithm"] for e in collectives]
        # The warm-up calls, then rounds of each candidate's calls in a row, each round ended by the
        # exchange of its times; the first of 5 calls each, the later ones longer; then the choice,
        # unexplored.
        assert tried[:3] == candidates and roles[:3] == ["explore"] * 3, (tried, roles)
        rounds, at = [], 3
        while roles[at] == "explore":
            end = roles.index("exchange", at)
            calls = (end - at) // len(candidates)
            assert all(role == "explore" for role in roles[at:end]) and end - at == calls * len(candidates)
            assert tried[at:end] == [a for a in candidates for _ in range(calls)], tried[at:end]
            rounds.append(calls)
            at = end + 1
        assert rounds[0] == FIRST_ROUND_CALLS and rounds == sorted(rounds), rounds
        assert roles[at:] == [None] * extra and len(set(tried[at:])) == 1, (roles[at:], tried[at:])
        assert len(collectives) == made + extra + len(rounds)  # every call, and one exchange per round


def _learn(rank, world, transport):
    """Exact results in every call of two size classes while auto learns; what RINGREDUCE_DEBUG said."""
    import io
    import sys

    sys.stderr = captured = io.StringIO()
    _C.set_auto_logging(True)  # ringreduce was imported before the harness set RINGREDUCE_DEBUG
    communicator = ringreduce._groups.communicator(None, torch.ones(1), transport, "auto")

    def exact_call(numel, call):
        tensor = counted_inputs(world, numel, call)[rank]
        ringreduce.all_reduce(tensor, algorithm="auto", transport=transport)
        assert torch.equal(tensor, counted_sum(world, numel, call)), (numel, call)

    for numel in (1000, 1_100_000):  # 4000 B and 4.4 MB: rounds of 3 candidates, and of 2
        floor = 1 << (4 * numel).bit_length() - 1
        # Every rank holds the same choices after the same call, so every rank makes the same calls.
        made = until_decided(lambda: floor in communicator.auto_choices(), lambda call: exact_call(numel, call),
                             most_exploring_calls(4 * numel))
        for call in range(made, made + 2):
            exact_call(numel, call)
    choices = communicator.auto_choices()
    return learned_lines(captured.getvalue()), sorted(retried_classes(captured.getvalue())), choices


@pytest.mark.parametrize("world, transport", [(2, "shm"), (4, "shm"), (3, "pg")])
def test_every_process_decides_on_the_same_slowest_rank_times(world, transport):
    """Each rank's own clock differs; the numbers every rank logs and decides on are the group's."""
    said = run_ranks(world, _learn, transport, env={"RINGREDUCE_DEBUG": "INFO", **NO_TABLE})
    assert all(len(lines) == 2 for lines, _, _ in said), said
    assert all(rank_said == said[0] for rank_said in said), said
    lines, retried, choices = said[0]
    assert choices == {int(line[2]): line[8] for line in lines}, (choices, lines)  # what the bench reads
    assert [line[6] is not None for line in lines] == [True, False], lines  # one_shot tried below 1 MiB only
    for line in lines:
        assert line[0] == transport and line[1] == str(world)
        assert_judged_on_a_long_round(line)
        assert_the_fastest_won(line, set(retried))


def _ragged_while_exploring(rank, world):
    for call in range(6):  # into the timed calls of the first exploration
        ringreduce.all_reduce(torch.ones(1000), algorithm="auto", transport="shm")
    try:
        ringreduce.all_reduce(torch.ones(1000 + rank), algorithm="auto", transport="shm")
    except ringreduce.MismatchError as error:
        return "MismatchError" if "disagree" in str(error) else str(error)
    return "returned"


def test_a_mismatch_while_exploring_raises_on_every_rank():
    assert run_ranks(3, _ragged_while_exploring, env=NO_TABLE) == ["MismatchError"] * 3


def _calls(learner, nbytes, count, times):
    """`count` calls of `nbytes`, each exploring one timed at times[algorithm] ns: [(algorithm, exploring)]."""
    made = []
    for _ in range(count):
        algorithm, exploring = learner.pick(nbytes)
        if exploring:
            learner.time(nbytes, times[algorithm])
        made.append((algorithm, exploring))
    return made


# The probes' times (ns) are the logged microseconds as milliseconds where a test is about the
# judging of rounds, not their length: five calls of each then make a round long enough to judge.
US_AS_MS = 1000


def as_ms(times):
    return {algorithm: t * US_AS_MS for algorithm, t in times.items()}


def test_a_measured_choice_gives_way_only_when_it_loses_twice_in_a_row():
    learner = _C._testing.AutoLearnerProbe("shm", 2, True)
    nbytes, rounds = 4096, 3 * 5  # three candidates, five timed calls each
    quiet = as_ms({"ring": 4500, "central": 4300, "one_shot": 2700})
    burst = as_ms({"ring": 20800, "central": 20900, "one_shot": 25600})  # one round of a noisy spell, as logged here
    loaded = as_ms({"ring": 4500, "central": 4300, "one_shot": 9000})  # a lasting change
    assert all(exploring for _, exploring in _calls(learner, nbytes, 3 + rounds, quiet))
    assert _calls(learner, nbytes, 1, quiet) == [("one_shot", False)]
    revisit = 2000  # kAutoRevisitEvery: the 2000th call after a decision explores again
    assert not any(exploring for _, exploring in _calls(learner, nbytes, revisit - 2, quiet))
    # The revisit falls in the burst: ring looks faster, so a second round runs at once, in the quiet.
    assert all(exploring for _, exploring in _calls(learner, nbytes, rounds, burst))
    assert all(exploring for _, exploring in _calls(learner, nbytes, rounds, quiet))
    assert _calls(learner, nbytes, 1, quiet) == [("one_shot", False)], "one noisy round switched the choice"
    # A lasting change wins both rounds, and the choice follows it.
    assert not any(exploring for _, exploring in _calls(learner, nbytes, revisit - 2, quiet))
    assert all(exploring for _, exploring in _calls(learner, nbytes, 2 * rounds, loaded))
    assert _calls(learner, nbytes, 1, loaded) == [("central", False)]


def test_the_prior_too_gives_way_only_when_it_loses_twice_in_a_row():
    nbytes, a_round = 512 << 10, 3 * 5  # prior ring; three candidates, five timed calls each
    # A workload's first calls, as logged at 64 MiB on 2 ranks: central looked faster than ring...
    cold = {"ring": 27_700_000, "central": 26_300_000, "one_shot": 37_400_000}
    # ... where the bench's rows then took these.
    warm = {"ring": 9_600_000, "central": 24_500_000, "one_shot": 48_500_000}
    learner = _C._testing.AutoLearnerProbe("shm", 2, True)
    assert all(exploring for _, exploring in _calls(learner, nbytes, 3 + a_round, cold))
    assert all(exploring for _, exploring in _calls(learner, nbytes, a_round, warm)), "no second round"
    assert _calls(learner, nbytes, 1, warm) == [("ring", False)], "one cold round moved the choice"
    # A choice that loses both rounds gives way.
    learner = _C._testing.AutoLearnerProbe("shm", 2, True)
    assert all(exploring for _, exploring in _calls(learner, nbytes, 3 + 2 * a_round, cold))
    assert _calls(learner, nbytes, 1, cold) == [("central", False)]


def test_two_near_equal_challengers_do_not_keep_a_choice_that_loses_to_both():
    """4 ranks on 2 cores, 64 KiB (slowest rank's means): ring and central within 7% of each other,
    the prior one_shot 40% behind both. Whichever wins the second round takes over."""
    nbytes, a_round = 64 << 10, 3 * 5  # prior one_shot
    central_ahead = as_ms({"ring": 34_000, "central": 32_000, "one_shot": 47_000})
    ring_ahead = as_ms({"ring": 31_000, "central": 33_000, "one_shot": 47_000})
    learner = _C._testing.AutoLearnerProbe("shm", 4, True)
    assert all(exploring for _, exploring in _calls(learner, nbytes, 3 + a_round, central_ahead))
    assert all(exploring for _, exploring in _calls(learner, nbytes, a_round, ring_ahead))
    assert _calls(learner, nbytes, 1, ring_ahead) == [("ring", False)]


@pytest.mark.parametrize("world, nbytes, times, next_calls", [
    # 4 ranks on 2 cores, 64 KiB: 5 calls of one_shot take 125 us; 400 of them take 10 ms.
    (4, 64 << 10, {"ring": 34_000, "central": 32_000, "one_shot": 25_000}, 400),
    # 2 ranks, 4 KiB: 10 ms would be 3704 calls of 2.7 us; 1000 is the most.
    (2, 4096, {"ring": 4_500, "central": 4_300, "one_shot": 2_700}, 1000),
])
def test_a_round_too_short_to_judge_sizes_the_next_and_the_revisits(world, nbytes, times, next_calls):
    learner = _C._testing.AutoLearnerProbe("shm", world, True)
    candidates = ["ring", "central", "one_shot"]
    first = _calls(learner, nbytes, 3 + 3 * 5, times)
    assert first == [(a, True) for a in candidates] + [(a, True) for a in candidates for _ in range(5)], first
    longer = _calls(learner, nbytes, 3 * next_calls, times)
    assert longer == [(a, True) for a in candidates for _ in range(next_calls)], "not a round of the sized length"
    assert _calls(learner, nbytes, 1, times) == [("one_shot", False)]
    # Explorations come at most every 100 rounds' worth of calls (about 1% of the calls).
    revisit = 100 * 3 * next_calls
    assert not any(exploring for _, exploring in _calls(learner, nbytes, revisit - 2, times))
    assert _calls(learner, nbytes, 1, times) == [("ring", True)]


def test_one_shot_is_tried_below_1_mib_only():
    learner = _C._testing.AutoLearnerProbe("shm", 2, True)
    one_shot_fastest = as_ms({"ring": 9_000, "central": 9_500, "one_shot": 1_000})
    below = _calls(learner, (1 << 20) - 1, 3 + 3 * 5, one_shot_fastest)
    assert {algorithm for algorithm, _ in below} == {"ring", "central", "one_shot"}
    above = _calls(learner, 1 << 20, 2 + 2 * 5 + 1, one_shot_fastest)
    assert [algorithm for algorithm, _ in above] == ["ring", "central"] + ["ring"] * 5 + ["central"] * 5 + ["ring"]
    assert not above[-1][1]
    # A device's learner never had one_shot.
    device = _C._testing.AutoLearnerProbe("nccl", 2, False)
    assert {algorithm for algorithm, _ in _calls(device, 4096, 2 + 2 * 5, one_shot_fastest)} == {"ring", "central"}


def test_the_slowest_ranks_mean_decides_not_the_median_call():
    """Beside a busy process one_shot's calls were mostly slow but some very fast: a higher median
    than ring's, a lower mean. The mean is what a loop of calls takes, and it decides."""
    learner = _C._testing.AutoLearnerProbe("shm", 2, True)
    nbytes = 4096  # prior one_shot; three candidates, five timed calls each
    times = {"ring": [20_000] * 5, "central": [21_000] * 5, "one_shot": [2_700, 2_700, 22_000, 22_000, 22_000]}
    made = []
    for _ in range(3 + 2 * 3 * 5):  # the warm-up calls and two rounds, were the first one to crown ring
        algorithm, exploring = learner.pick(nbytes)
        if exploring:
            done = [a for a, e in made if e and a == algorithm]
            learner.time(nbytes, times[algorithm][(len(done) - 1) % 5] * US_AS_MS if done else 0)
        made.append((algorithm, exploring))
    assert sum(exploring for _, exploring in made) == 3 + 3 * 5, "one_shot's mean (14.3 ms) lost a round"
    assert made[-1] == ("one_shot", False), made[-1]


CENTRAL_EVERYWHERE = [{"transport": "shm", "world": 2, "up_to_bytes": None, "algorithm": "central"}]


def _tables_differ(rank, world):
    """Rank 1 has a tuning file, rank 0 none (auto learns there): the group follows rank 0."""
    if rank == 1:
        tuning.install(CENTRAL_EVERYWHERE, "rank 1's file")
    else:
        tuning.install([], tuning.LEARNED)
    for _ in range(100):  # long enough for rank 0's learner to explore and decide
        t = torch.full((1024,), float(rank))
        ringreduce.all_reduce(t)
        assert torch.equal(t, torch.ones(1024))
    (comm,) = ringreduce._groups.group_state(None).communicators.values()
    return comm.auto_table["source"]


def test_ranks_with_different_tables_follow_rank_0s():
    sources = run_ranks(2, _tables_differ)
    assert sources == [tuning.LEARNED, f"rank 0's table ({tuning.LEARNED})"]


def _table_loaded_under_queued_calls(rank, world):
    tuning.install([], tuning.LEARNED)
    tensors = [torch.full(((64 << 10) + i,), float(rank + 1)) for i in range(40)]
    works = [ringreduce.all_reduce(t, async_op=True) for t in tensors]
    if rank == 0:
        tuning.install(CENTRAL_EVERYWHERE, "installed under queued calls")
    for work in works:
        work.wait()
    assert all(torch.equal(t, torch.full_like(t, 3.0)) for t in tensors)
    # It reaches the group through a collective step: the group's communicators made again.
    ringreduce.destroy()
    ringreduce.all_reduce(torch.ones(4))
    (comm,) = ringreduce._groups.group_state(None).communicators.values()
    return comm.auto_table["source"]


def test_a_table_loaded_under_queued_calls_reaches_the_group_only_when_it_is_made_again():
    sources = run_ranks(2, _table_loaded_under_queued_calls)
    assert sources == ["installed under queued calls", "rank 0's table (installed under queued calls)"]


def _deterministic_auto(rank, world):
    tuning.install([], tuning.LEARNED)
    torch.use_deterministic_algorithms(True)
    for _ in range(200):
        t = torch.ones(1024)
        ringreduce.all_reduce(t)
        assert torch.equal(t, torch.full((1024,), 2.0))
    (comm,) = ringreduce._groups.group_state(None).communicators.values()
    return comm.auto_choices()


def test_under_deterministic_algorithms_auto_keeps_one_algorithm_per_size():
    assert run_ranks(2, _deterministic_auto) == [{}, {}], "auto must not learn (and switch) here"


def test_across_hosts_the_cost_model_sets_the_prior_and_leaves_out_the_hopeless_candidates():
    """16 hosts of one rank: at 4 KiB the model prices the ring's 34 rounds at about 8x doubling's 4,
    so the ring is never tried, and doubling is the prior; at 16 MiB only the ring and
    halving-doubling are left (doubling is not tried above 1 MiB, and the model prices central's 15
    buffers through rank 0's link at 13x the ring), halving-doubling first: the ring's bytes in 12
    rounds instead of 34. The flat group of the same size still tries every candidate but those of
    groups across hosts."""
    spans = _C._testing.AutoLearnerProbe("pg", 16, True, False, True, list(range(16)))
    times = {"central": 8_000_000, "one_shot": 7_000_000, "doubling": 5_000_000, "halving_doubling": 9_000_000,
             "ring": 40_000_000}
    small = _calls(spans, 4096, 4 + 4 * 5 + 1, times)
    assert [a for a, _ in small[:4]] == ["central", "one_shot", "doubling", "halving_doubling"], small[:4]
    assert small[-1] == ("doubling", False)
    large = _calls(spans, 16 << 20, 2 + 2 * 2 + 1, times)
    assert {a for a, _ in large} == {"ring", "halving_doubling"}, large
    assert large[-1] == ("halving_doubling", False)
    flat = _C._testing.AutoLearnerProbe("pg", 16, True)
    assert [a for a, _ in _calls(flat, 4096, 3, times)] == ["ring", "central", "one_shot"]


def test_across_hosts_the_learner_refits_the_rates_to_its_rounds_and_prices_new_classes_with_them():
    """Calls timed as on a network whose rounds take 12 us, a hundredth of the emulated hosts' (the
    same bytes): after the 4 KiB class's rounds the fitted round is within 20% of that, and the 8 KiB
    class tries the ring (priced near doubling there), which the emulated hosts' rates leave out."""
    from ringreduce.bench import model

    counts = [1] * 16
    fast = {"link_latency_s": 12e-6, "link_s_per_byte": 3.85e-9, "local_latency_s": 4.45e-3,
            "local_s_per_byte": 4.5e-9, "reduce_s_per_byte": 5.86e-9}
    times = {a: round(model.predict(fast, a, 4096, counts) * 1e9)
             for a in ("ring", "central", "one_shot", "doubling", "halving_doubling")}
    learner = _C._testing.AutoLearnerProbe("pg", 16, True, False, True, list(range(16)))
    for _ in range(10_000):  # until the 4 KiB class has decided
        (_, exploring), = _calls(learner, 4096, 1, times)
        if not exploring:
            break
    assert not exploring
    assert learner.rates()[0] == pytest.approx(12e-6, rel=0.2), learner.rates()
    # One warm-up call of each candidate: the fitted rates price one-shot's 15 buffers out instead.
    assert [a for a, _ in _calls(learner, 8192, 3, times)] == ["ring", "doubling", "halving_doubling"]
    unmeasured = _C._testing.AutoLearnerProbe("pg", 16, True, False, True, list(range(16)))
    assert [a for a, _ in _calls(unmeasured, 8192, 4, times)] == ["central", "one_shot", "doubling", "halving_doubling"]
