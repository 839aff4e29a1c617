"""RINGREDUCE_DEBUG=INFO: say once per group which algorithm and transport were chosen, and why."""

import os
import socket
import sys
import threading

_lock = threading.Lock()
_said = set()


def enabled() -> bool:
    return os.environ.get("RINGREDUCE_DEBUG", "").upper() in ("INFO", "DEBUG")


def info_once(key, message: str) -> None:
    """Print `message` to stderr the first time `key` is seen, when RINGREDUCE_DEBUG=INFO."""
    if key in _said or not enabled():
        return
    with _lock:
        if key in _said:
            return
        _said.add(key)
    # One write per line, so lines of concurrent ranks do not interleave.
    sys.stderr.write(f"{socket.gethostname()}:{os.getpid()} ringreduce INFO {message}\n")
    sys.stderr.flush()
