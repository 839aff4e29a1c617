"""Survivors that go on: the lost ranks of a group, and a group without them.

    try:
        train_step()
    except ringreduce.RanksLostError as lost:       # every survivor, the same lost_ranks
        group = ringreduce.shrink(group, lost.lost_ranks)

``shrink`` is ``torch.distributed.shrink_group`` on a group of the ringreduce backend, with its
checks made first; see docs/elastic.md.
"""

import torch
import torch.distributed as dist

from ringreduce import _C
from ringreduce.collectives import destroy


def _backend_of(group):
    group = group or dist.distributed_c10d._get_default_group()
    try:
        backend = group._get_backend(torch.device("cpu"))
    except RuntimeError:
        backend = None
    if not isinstance(backend, _C.Backend) or backend.membership is None:
        raise TypeError(
            f"group {group.group_name!r} is not on the ringreduce backend, so ringreduce cannot shrink it (torch's gloo "
            "backend cannot shrink at all). Make the group with init_process_group(\"ringreduce\") or "
            "new_group(backend=\"ringreduce\")"
        )
    return group, backend


def _exclude_by_global_rank(finalize):
    """torch 2.14's shrink_group builds the shrunk group's rank map by removing the excluded *group* ranks
    from the group's *global* ranks: for new_group([1, 2, 3]) losing its group rank 0 it keeps all
    three global ranks over a 2-rank backend, so get_rank() and src=/dst= name the wrong ranks. The
    group ranks are turned into the global ranks they stand for before torch's step runs."""

    def finalize_shrunk_group(group_info, excluded_group_ranks, new_backend):
        global_ranks = dist.get_process_group_ranks(group_info["process_group"])
        return finalize(group_info, {global_ranks[r] for r in excluded_group_ranks}, new_backend)

    finalize_shrunk_group.repairs = finalize
    return finalize_shrunk_group


def _repair_torch_shrink() -> None:
    """Installs the repair above on the torch releases that need it (2.14, whose source was read), once."""
    c10d = dist.distributed_c10d
    finalize = getattr(c10d, "_finalize_shrunk_group", None)
    if finalize is None or hasattr(finalize, "repairs") or not torch.__version__.startswith("2.14."):
        return
    c10d._finalize_shrunk_group = _exclude_by_global_rank(finalize)


_repair_torch_shrink()


def lost_ranks(group=None) -> list:
    """The ranks of `group` (default: WORLD) its survivors agreed are lost; empty while none is."""
    return list(_backend_of(group)[1].membership.lost)


def shrink(group=None, lost=None):
    """A group of the survivors of `group` (default: WORLD), without the ranks `lost` (default:
    ``lost_ranks(group)``); every survivor calls it. Ranks keep their order. Shrinking WORLD makes
    the new group the default one and destroys every other group, as torch.distributed.shrink_group
    does. Raises RanksLostError if more ranks are lost than `lost` names (call again with
    ``err.lost_ranks``), and ValueError for a rank in `lost` that is alive."""
    group, backend = _backend_of(group)
    lost = backend.membership.lost if lost is None else lost
    if not lost:
        raise ValueError("ringreduce.shrink: no rank of the group is known to be lost; pass the ranks to leave out")
    shrunk = dist.shrink_group(list(lost), group=group)
    destroy(group)
    return shrunk
