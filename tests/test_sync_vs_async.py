"""examples/sync_vs_async.py: every scheme trains the example to its target loss, and the bytes
the parameter server counted are what its protocol sends."""

import os
import sys

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")


def test_every_scheme_reaches_the_target_at_two_ranks():
    sys.path.insert(0, EXAMPLES)  # the spawned ranks import the example from there too
    try:
        import sync_vs_async as example

        args = example.parse(["--world", "2", "--straggler", "1", "--steps", "300", "--repeats", "1"])
        rows = example.run(args)
    finally:
        sys.path.remove(EXAMPLES)
    assert [r["scheme"] for r in rows] == [name for name, _, _ in example.SCHEMES]
    numel = sum(p.numel() for p in example.make_model().parameters())
    for row in rows:
        assert example.time_to(row["curve"], args.target) is not None, f"{row['scheme']} never reached the target"
        assert row["final"] < args.target
        if row["scheme"].startswith("async"):
            # Each side's hello; the server (rank 0) answers each of the other rank's pushes, and
            # its join, with the parameters; the worker sends each push and its leave.
            hello, message, payload = 32, 32, 4 * numel
            assert row["sent_all"] == [hello + (args.steps + 1) * (message + payload),
                                       hello + args.steps * (message + payload) + message]
            mean, worst = row["staleness"]
            assert 0 <= mean <= worst
