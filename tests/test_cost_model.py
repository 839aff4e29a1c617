"""The cost model of an all-reduce across hosts (csrc/engine/cost_model.h, ringreduce/bench/model.py):
each algorithm's terms in closed form, and a fit that finds the rates back."""

import pytest

from ringreduce import _C
from ringreduce._checks import ALGORITHM_CODES
from ringreduce.bench import model

N = 1 << 20


def check_rounds(world):
    """Rounds of the call check (doubling's schedule without data): log2 of the largest power of two
    not above `world`, and a hand-over and a hand-back when `world` is not one."""
    span = 1 << (world.bit_length() - 1)
    return span.bit_length() - 1 + (2 if span < world else 0)


@pytest.mark.parametrize("counts", [[1] * 16, [2] * 8, [2, 1, 2]])
def test_ring_moves_two_n_minus_one_chunks_over_each_host_link(counts):
    world = sum(counts)
    t = model.terms("ring", N, counts)
    assert t["link_messages"] == check_rounds(world) + 2 * (world - 1)
    assert t["link_bytes"] == pytest.approx(2 * (world - 1) / world * N)
    assert t["reduced_bytes"] == pytest.approx((world - 1) / world * N)
    assert t["local_messages"] == t["local_bytes"] == 0


@pytest.mark.parametrize("counts, crossing_bytes", [
    ([1] * 16, 4 * N),          # four exchanges, each host sends its one rank's buffer
    ([2] * 8, 3 * 2 * N),       # distance 1 stays inside a host; 2, 4, 8 cross with both ranks' buffers
    ([1] * 5, 4 * N),           # 5 ranks: hand-over, two exchanges, hand-back, each crossing once
])
def test_doubling_takes_log_steps_and_counts_only_crossings(counts, crossing_bytes):
    world = sum(counts)
    t = model.terms("doubling", N, counts)
    assert t["link_messages"] == check_rounds(world)  # the check rides in its messages: no rounds of its own
    assert t["link_bytes"] == crossing_bytes
    # Every phase but the hand-back reduces a whole buffer.
    assert t["reduced_bytes"] == (check_rounds(world) - (1 if world & (world - 1) else 0)) * N


@pytest.mark.parametrize("counts, crossing_bytes", [
    ([1] * 16, 2 * 15 / 16 * N),     # every exchange crosses: halves 1/2 ... 1/16, out and back
    ([2] * 8, 2 * 2 * 7 / 16 * N),   # the exchange at distance 1 (half the buffer) stays inside a host
    ([1] * 5, 2 * N + 2 * 3 / 4 * N),  # 5 ranks: the whole buffer handed over and back, and 4 ranks' halving
])
def test_halving_doubling_moves_what_the_ring_does_in_log_steps(counts, crossing_bytes):
    world = sum(counts)
    span = 1 << (world.bit_length() - 1)
    steps = 2 * (span.bit_length() - 1)
    t = model.terms("halving_doubling", N, counts)
    assert t["link_messages"] == check_rounds(world) + steps + (2 if span < world else 0)
    assert t["link_bytes"] == pytest.approx(crossing_bytes)
    # The halves reduced add up to all but the rank's own chunk; a stand-in first adds a whole buffer.
    assert t["reduced_bytes"] == pytest.approx((span - 1) / span * N + (N if span < world else 0))


def test_hierarchical_crosses_hosts_in_a_ring_of_hosts_and_reduces_inside_in_shared_memory():
    t = model.terms("hierarchical", N, [4, 4, 4])
    assert t["link_messages"] == check_rounds(12) + 2 * 2
    assert t["link_bytes"] == pytest.approx(2 * 2 / 3 * N)
    assert t["local_messages"] == 2 * 3
    assert t["local_bytes"] == pytest.approx(2 * 3 / 4 * N)
    assert t["reduced_bytes"] == pytest.approx(3 / 4 * N + 2 / 3 * N / 4)


def test_central_and_one_shot_load_the_busiest_host_link_with_whole_buffers():
    central = model.terms("central", N, [2, 3])
    assert central["link_bytes"] == 2 * 3 * N  # three buffers into the root's host, three sums out
    assert central["reduced_bytes"] == 4 * N
    one_shot = model.terms("one_shot", N, [2, 3])
    assert one_shot["link_bytes"] == 3 * 2 * N  # the widest host's three buffers to each of two ranks
    assert central["link_messages"] == check_rounds(5) + 2  # in, then out: each a round of overlapping messages
    assert one_shot["link_messages"] == check_rounds(5) + 1


def test_the_fit_finds_the_rates_that_made_the_times():
    rates = {"link_latency_s": 300e-6, "link_s_per_byte": 4e-9, "local_latency_s": 20e-6,
             "local_s_per_byte": 0.5e-9, "reduce_s_per_byte": 0.3e-9}
    points = [(a, b, c, model.predict(rates, a, b, c))
              for c in ([1] * 16, [2] * 8) for a in model.MODELLED if a != "hierarchical" or c[0] > 1
              for b in (4 << 10, 64 << 10, 1 << 20, 16 << 20)]
    fitted = model.fit(points)
    for name, value in rates.items():
        assert fitted[name] == pytest.approx(value, rel=1e-6), name


def test_a_fit_without_shared_memory_leaves_its_rates_at_zero_and_none_negative():
    # One rank per host: no shared-memory stage, so nothing to fit there. Times that fall with size
    # would need a negative rate: it is held at 0 instead.
    points = [("ring", 4 << 10, [1] * 4, 2e-3), ("ring", 1 << 20, [1] * 4, 1e-3), ("doubling", 4 << 10, [1] * 4, 1e-3)]
    fitted = model.fit(points)
    assert fitted["local_latency_s"] == fitted["local_s_per_byte"] == 0.0
    assert min(fitted.values()) >= 0.0
    assert fitted["link_latency_s"] > 0


def test_a_ring_over_hosts_placed_round_robin_crosses_a_link_at_every_hop():
    t = _C.all_reduce_cost_terms(ALGORITHM_CODES["ring"], N, [0, 1, 0, 1])
    assert t["link_bytes"] == pytest.approx(2 * 2 * 3 / 4 * N)  # both of a host's ranks send off-host


def test_bad_layouts_and_auto_are_refused_by_name():
    with pytest.raises(ValueError, match="at least one rank"):
        model.terms("ring", N, [2, 0])
    with pytest.raises(RuntimeError, match="numbered 0, 1"):
        _C.all_reduce_cost_terms(ALGORITHM_CODES["ring"], N, [1, 0])
    with pytest.raises(RuntimeError, match="not auto"):
        model.terms("auto", N, [2, 2])
