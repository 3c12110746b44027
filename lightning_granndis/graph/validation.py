"""Checks every graph entering the suite, so bad input fails early with a message naming it."""

from __future__ import annotations

import torch


class GraphValidationError(ValueError):
    """A graph that the suite cannot train on; the message names the problem and the fix."""


def validate_graph(data, num_classes: int | None = None, name: str = "graph") -> None:
    """Validates a PyG ``Data`` node-classification graph.

    Checks: ``edge_index`` is an integer tensor of shape ``[2, E]`` with ids in ``[0, N)``;
    ``x`` is floating point, ``[N, F]``, without NaN or inf; ``y`` has ``N`` labels in
    ``[0, num_classes)`` (``-1``/NaN marks unlabelled vertices outside every split); the split masks
    are boolean, of length ``N``, and do not overlap.

    Raises:
        GraphValidationError: naming the first problem found.
    """

    def fail(msg: str) -> None:
        raise GraphValidationError(f"{name}: {msg}")

    n = data.num_nodes
    ei = getattr(data, "edge_index", None)
    if ei is None or not torch.is_tensor(ei):
        fail("has no edge_index tensor.")
    if ei.dim() != 2 or ei.shape[0] != 2:
        fail(f"edge_index must have shape [2, num_edges], got {list(ei.shape)}; transpose an [E, 2] list with .t().")
    if ei.dtype not in (torch.int64, torch.int32):
        fail(f"edge_index must hold integer vertex ids (int64), got {ei.dtype}.")
    if ei.numel() and (int(ei.min()) < 0 or int(ei.max()) >= n):
        fail(f"edge_index refers to vertex {int(ei.min()) if int(ei.min()) < 0 else int(ei.max())}, "
             f"outside [0, {n}) (num_nodes={n}); drop those edges or fix num_nodes.")
    x = getattr(data, "x", None)
    if x is not None:
        if not torch.is_floating_point(x):
            fail(f"features x must be floating point, got {x.dtype}; convert with x.float().")
        if x.dim() != 2 or x.shape[0] != n:
            fail(f"features x must have shape [num_nodes={n}, F], got {list(x.shape)}.")
        bad = ~torch.isfinite(x)
        if bad.any():
            rows = bad.any(dim=1).nonzero().flatten()
            fail(f"features x hold NaN or inf in {len(rows)} rows (first: vertex {int(rows[0])}); "
                 "impute or drop them before training.")
    y = getattr(data, "y", None)
    masks = {k: getattr(data, k, None) for k in ("train_mask", "val_mask", "test_mask")}
    for key, mask in masks.items():
        if mask is None:
            continue
        if mask.dtype != torch.bool or mask.dim() != 1 or mask.numel() != n:
            fail(f"{key} must be a bool tensor of length num_nodes={n}, got {mask.dtype} {list(mask.shape)}.")
    present = [m for m in masks.values() if m is not None]
    if len(present) > 1 and (torch.stack(present).sum(0) > 1).any():
        overlap = (torch.stack(present).sum(0) > 1).nonzero().flatten()
        fail(f"train/val/test masks overlap on {len(overlap)} vertices (first: {int(overlap[0])}); splits must be disjoint.")
    if y is not None:
        if y.shape[0] != n:
            fail(f"labels y must have one entry per vertex ({n}), got {y.shape[0]}.")
        labelled = torch.stack(present).any(0) if present else torch.ones(n, dtype=torch.bool)
        yl = y.view(n, -1)[labelled]
        if torch.is_floating_point(yl) and not torch.isfinite(yl).all():
            fail("labels y are NaN for vertices inside a split.")
        if yl.numel() and int(yl.min()) < 0:
            fail(f"labels y hold {int(yl.min())} for a vertex inside a split; labels must lie in [0, num_classes).")
        if num_classes is not None and yl.numel() and int(yl.max()) >= num_classes:
            fail(f"labels y hold class {int(yl.max())} but num_classes={num_classes}.")
