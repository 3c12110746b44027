"""The 7-d spatial vector of a subject-object pair (Jung and Park, arXiv 1904.07798, §3.2).

For subject box ``s`` and object box ``o`` (``x1, y1, x2, y2`` in pixels) in a ``W x H`` image:

.. math::
    \\Big[\\frac{|s|}{WH},\\; \\frac{|o|}{WH},\\; \\mathrm{IoU}(s, o),\\;
    \\frac{c_x(o) - c_x(s)}{W},\\; \\frac{c_y(o) - c_y(s)}{H},\\;
    [s \\supseteq o],\\; [o \\supseteq s]\\Big]

with ``|b|`` a box's area and ``c(b)`` its centre.
"""

from __future__ import annotations

import torch


def _area(b: torch.Tensor) -> torch.Tensor:
    return (b[..., 2] - b[..., 0]).clamp(min=0) * (b[..., 3] - b[..., 1]).clamp(min=0)


def box_iou_pairs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of ``a[i]`` with ``b[i]``; boxes ``[N, 4]`` as ``x1, y1, x2, y2``."""
    lt = torch.maximum(a[..., :2], b[..., :2])
    rb = torch.minimum(a[..., 2:], b[..., 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    union = _area(a) + _area(b) - inter
    return torch.where(union > 0, inter / union.clamp(min=1e-12), torch.zeros_like(union))


def union_boxes(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The smallest box around ``a[i]`` and ``b[i]``."""
    return torch.cat([torch.minimum(a[..., :2], b[..., :2]), torch.maximum(a[..., 2:], b[..., 2:])], -1)


def _contains(outer: torch.Tensor, inner: torch.Tensor) -> torch.Tensor:
    return ((outer[..., 0] <= inner[..., 0]) & (outer[..., 1] <= inner[..., 1])
            & (outer[..., 2] >= inner[..., 2]) & (outer[..., 3] >= inner[..., 3])).to(outer.dtype)


def spatial_vector(subject: torch.Tensor, obj: torch.Tensor, width: torch.Tensor | float,
                   height: torch.Tensor | float) -> torch.Tensor:
    """``[N, 7]`` spatial vectors of boxes ``subject`` and ``obj`` (``[N, 4]``, ``x1, y1, x2, y2``)
    in images of ``width`` x ``height`` (scalars or ``[N]``)."""
    subject, obj = subject.float(), obj.float()
    w = torch.as_tensor(width, dtype=torch.float32).expand(subject.shape[:-1])
    h = torch.as_tensor(height, dtype=torch.float32).expand(subject.shape[:-1])
    image = w * h
    cs = (subject[..., :2] + subject[..., 2:]) / 2
    co = (obj[..., :2] + obj[..., 2:]) / 2
    return torch.stack([
        _area(subject) / image,
        _area(obj) / image,
        box_iou_pairs(subject, obj),
        (co[..., 0] - cs[..., 0]) / w,
        (co[..., 1] - cs[..., 1]) / h,
        _contains(subject, obj),
        _contains(obj, subject),
    ], -1)
