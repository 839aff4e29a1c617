"""What this build of ringreduce contains."""

from ringreduce import _C


def build_info() -> dict:
    """Return version, the torch it was built against, CUDA support, the NCCL version and transports.

    Keys: ``version``, ``torch``, ``cuda`` (bool), ``nccl`` (str or None), ``transports`` (tuple).
    """
    return dict(_C.build_info())
