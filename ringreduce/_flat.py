"""Parameters packed into one flat buffer, for a single message instead of one per tensor."""


def flat_views(flat, params):
    """Views of `flat`, one per parameter in order, each shaped like its parameter."""
    views, offset = [], 0
    for p in params:
        views.append(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()
    return views
