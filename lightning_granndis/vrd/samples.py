"""One image's relationship samples (dicts, as the relationship DataModules yield them) stacked
into a model batch."""

from __future__ import annotations

import torch

#: the sample fields a relationship model reads
BATCH_KEYS = ("crop", "spatial", "subject", "object", "predicate")


def stack_samples(samples: list[dict], device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """``{key: [len(samples), ...]}`` for every key in :data:`BATCH_KEYS`, on ``device``."""
    return {k: torch.stack([torch.as_tensor(s[k]) for s in samples]).to(device) for k in BATCH_KEYS}
