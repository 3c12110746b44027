"""What a GNN module logs in ``training_step``, as single-process training would log it.

Under the GNN strategies a rank's loss is a mean over *its own* seed vertices; the strategy
reweights the returned loss so that the gradient is the mean over all seeds. A plain
``self.log("train_loss", loss)`` would still show rank 0's own mean, and ``sync_dist=True`` the
unweighted mean of the ranks' means, which is off whenever ranks hold different numbers of seeds.
Inside :func:`seed_weighted_logging` every scalar the module logs is taken as a mean over the
rank's seeds and logged, on every rank, as the mean over all seeds:

.. math::
    v = \\frac{1}{W} \\sum_r w_r v_r, \\qquad w_r = W \\frac{n_r}{N},

with ``n_r`` the rank's seeds, ``N`` all of them and ``W`` the world size (``w_r`` is the weight
the strategy already applies to the loss). The values are combined in one collective after the
step (control traffic, not booked), so ranks may log different names: a name not logged on every
rank keeps its local value. Non-scalar values (torchmetrics objects) pass through unchanged.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import torch

from lightning_granndis import comm


def _detached(value: Any) -> Any:
    return value.detach() if isinstance(value, torch.Tensor) else value


def _scalar(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and value.is_floating_point()
    return isinstance(value, float)


@contextmanager
def seed_weighted_logging(module, weight: float, world_size: int):
    """Within the block, ``module.log`` of a scalar is deferred; on leaving it, every name logged
    on all ranks is logged with its seed-weighted global mean (``weight``: this rank's ``w_r``)."""
    deferred: list[tuple[str, Any, tuple, dict]] = []
    original = module.log

    def log(name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        if _scalar(value):
            deferred.append((name, value, args, kwargs))
        else:
            original(name, value, *args, **kwargs)

    own = module.__dict__.get("log")
    module.log = log
    try:
        yield
    finally:
        if own is None:
            del module.log  # the class's own method again
        else:
            module.log = own
    # a rank without seeds has a NaN mean over nothing: it contributes nothing
    shares = {name: 0.0 if weight == 0.0 else weight * float(_detached(value)) for name, value, _, _ in deferred}
    everyone = comm.gather_objects(shares) if world_size > 1 else [shares]
    for name, value, args, kwargs in deferred:
        if all(name in other for other in everyone):
            mean = sum(other[name] for other in everyone) / world_size
            like = value if isinstance(value, torch.Tensor) else torch.tensor(0.0)
            value = torch.tensor(mean, dtype=like.dtype, device=like.device)
            kwargs = {**kwargs, "sync_dist": False}  # already the same on every rank
        original(name, value, *args, **kwargs)
