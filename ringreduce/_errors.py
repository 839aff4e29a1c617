"""The error every survivor raises when ranks of its group are lost."""

import torch.distributed as dist


class RanksLostError(dist.DistBackendError):
    """Ranks of the group died, or went silent past RINGREDUCE_LOST_AFTER (10 s by default).

    A rank that the others fenced (silent past the bound, then resumed) raises it too, with itself
    among ``lost_ranks`` and a message saying it was excluded; it cannot rejoin.

    Every survivor raises it with the same ``lost_ranks`` (group ranks, sorted), agreed through the
    group's store. ``torch.distributed.shrink_group(err.lost_ranks, group)`` (or
    ``ringreduce.shrink``) then gives the survivors a working group. Where torch's own error paths
    carry it (DDP's backward), it arrives as a plain ``DistBackendError``; ``ringreduce.lost_ranks(group)``
    names the ranks then.
    """

    def __init__(self, message, lost_ranks=()):
        super().__init__(message)
        self.lost_ranks = list(lost_ranks)

    def __reduce__(self):
        return type(self), (str(self), self.lost_ranks)
