"""What algorithm="auto" runs: learned online, unless a table says otherwise.

With no table, each communicator on host memory learns on the machine it runs on: the first calls
of each size class try ring, central and one-shot, the group's slowest times decide, and an
exploration after 100 rounds' worth of calls looks again (engine/auto_choice.h). Before that, and on devices, theory's prior runs:
one-shot up to 64 KiB on host memory, ring above and on devices.

A table fixes the choice on the transports it has lines for. It is a small JSON file::

    {"format": 1, "measured": "...", "lines": [
        {"transport": "shm", "world": 2, "up_to_bytes": 65536, "algorithm": "one_shot"},
        {"transport": "shm", "world": 2, "up_to_bytes": null, "algorithm": "ring"}, ...]}

Calls on a transport use the lines measured at the largest world size not above theirs (the
smallest measured, when all are above); the first line, in ascending ``up_to_bytes``, that covers
the call's bytes names the algorithm (``null``: any size); ring where none does. The table is read
on import from ``RINGREDUCE_TUNING_FILE``, else from ``~/.cache/ringreduce/tuning.json`` (what
``python -m ringreduce.tune`` writes). A communicator takes the table when it is made, and its ranks
follow rank 0's then (a file on some hosts only is fine); a table loaded later reaches the
communicators made afterwards (``ringreduce.destroy(group)`` re-makes a group's).
"""

import json
import os

from ringreduce import _C, _debug
from ringreduce._checks import ALGORITHM_CODES

FILE_ENV = "RINGREDUCE_TUNING_FILE"
FORMAT = 1
# Where load() says the choice comes from when no table is given.
LEARNED = "no table: auto learns online"


def default_path() -> str:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "ringreduce", "tuning.json")


def validate(table, source: str) -> list:
    """The table's lines, checked; ValueError naming `source` and the bad line otherwise."""
    if not isinstance(table, dict) or table.get("format") != FORMAT or not isinstance(table.get("lines"), list):
        raise ValueError(f"{source}: not a ringreduce tuning table (want {{\"format\": {FORMAT}, \"lines\": [...]}}); "
                         "rewrite it with python -m ringreduce.tune")
    lines = []
    for line in table["lines"]:
        try:
            algorithm = line["algorithm"]
            up_to = line["up_to_bytes"]
            ok = (isinstance(line["transport"], str) and isinstance(line["world"], int) and line["world"] >= 1
                  and algorithm in ALGORITHM_CODES and algorithm != "auto"
                  and (up_to is None or (isinstance(up_to, int) and up_to >= 0)))
        except (KeyError, TypeError):
            ok = False
        if not ok:
            raise ValueError(f"{source}: bad line {line!r}: want transport (str), world (int >= 1), up_to_bytes "
                             "(int or null) and algorithm (ring, central or one_shot)")
        lines.append(line)
    return lines


def install(lines, source: str) -> None:
    """Makes `lines` the table that auto reads (in this process)."""
    _C.set_auto_table([(l["transport"], l["world"], 2**64 - 1 if l["up_to_bytes"] is None else l["up_to_bytes"],
                        ALGORITHM_CODES[l["algorithm"]]) for l in lines], source)


def load() -> str:
    """Installs the table of the environment's file or the default path (none when neither is
    there: auto learns), and returns where the choice comes from."""
    path = os.environ.get(FILE_ENV) or (default_path() if os.path.exists(default_path()) else None)
    if path is None:
        install([], LEARNED)
        return LEARNED
    try:
        with open(path) as f:
            table = json.load(f)
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read the tuning table {path}: {error}; rewrite it with python -m ringreduce.tune, "
                         f"delete it, or point {FILE_ENV} at another") from error
    install(validate(table, path), path)
    return path


# What auto chooses, and why, is said under RINGREDUCE_DEBUG=INFO (C++ calls ringreduce._debug.info_once).
_C.set_auto_logging(_debug.enabled())
