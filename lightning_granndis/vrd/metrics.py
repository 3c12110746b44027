"""Recall@K for visual relationship detection as torchmetrics ``Metric``s (sums: correct under DDP).

Protocol of Lu et al. (ECCV'16), used by Jung and Park (arXiv 1904.07798, §4.2): in each image,
every subject-object pair proposes its top ``k`` predicates (``k=1`` or all) as scored triplets;
the image's ``K`` best-scored triplets (50 or 100) are kept; a ground-truth triplet is recalled when
one kept triplet matches it. Recall = recalled / ground-truth triplets, summed over the data set
(not averaged per image). Ties in score keep the earlier candidate (pair order, then predicate
order), so results are deterministic.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torchmetrics import Metric

from lightning_granndis.vrd.spatial import box_iou_pairs, union_boxes


def _top_candidates(scores: torch.Tensor, k: int | None, limit: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(pair, predicate)`` of the ``limit`` best candidates, each pair proposing its top ``k``."""
    n, p = scores.shape
    k = p if k is None else min(k, p)
    top = torch.topk(scores, k, dim=1, sorted=True)  # per pair
    pair = torch.arange(n).repeat_interleave(k)
    pred = top.indices.reshape(-1)
    value = top.values.reshape(-1)
    # stable descending sort: ties keep pair order, then predicate rank
    order = torch.sort(-value, stable=True).indices[:limit]
    return pair[order], pred[order]


class PredicateDetectionRecall(Metric):
    """Predicate detection (ground-truth boxes and classes given): Recall@K per ``ks``.

    Args:
        ks: the numbers of kept triplets per image (default ``(50, 100)``).
        top_predicates: predicates each pair proposes: 1 (default) or ``None`` for all.

    ``update(scores, gt_pairs, gt_predicates, zero_shot=None)`` takes one image: ``scores``
    ``[pairs, predicates]``, ``gt_pairs`` / ``gt_predicates`` ``[T]`` (a pair may hold several
    triplets), ``zero_shot`` ``[T]`` bool marking triplets unseen in training. ``compute()``
    returns ``{"R@50": ..., "R@100": ..., "zs_R@50": ..., ...}`` (zero-shot keys only when some
    zero-shot triplet was seen).
    """

    full_state_update = False

    def __init__(self, ks: Sequence[int] = (50, 100), top_predicates: int | None = 1, **kwargs) -> None:
        super().__init__(**kwargs)
        self.ks, self.top_predicates = tuple(ks), top_predicates
        n = len(self.ks)
        self.add_state("hits", torch.zeros(n, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("zs_hits", torch.zeros(n, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("zs_total", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, scores: torch.Tensor, gt_pairs: torch.Tensor, gt_predicates: torch.Tensor,
               zero_shot: torch.Tensor | None = None) -> None:
        scores = scores.detach().float().cpu()
        gt_pairs, gt_predicates = gt_pairs.cpu().long(), gt_predicates.cpu().long()
        zs = zero_shot.cpu().bool() if zero_shot is not None else torch.zeros(len(gt_pairs), dtype=torch.bool)
        if scores.dim() != 2:
            raise ValueError(f"scores must be [pairs, predicates], got shape {tuple(scores.shape)}.")
        self.total += len(gt_pairs)
        self.zs_total += int(zs.sum())
        if len(gt_pairs) == 0 or scores.shape[0] == 0:
            return
        p = scores.shape[1]
        # one ranking per image: each K keeps a prefix of it (the sort is stable)
        pair, pred = _top_candidates(scores, self.top_predicates, max(self.ks))
        ranked = (pair * p + pred).tolist()
        for i, k in enumerate(self.ks):
            kept = set(ranked[:k])
            hit = torch.tensor([int(v) in kept for v in (gt_pairs * p + gt_predicates)], dtype=torch.bool)
            self.hits[i] += float(hit.sum())
            self.zs_hits[i] += float((hit & zs).sum())

    def compute(self) -> dict[str, torch.Tensor]:
        out = {f"R@{k}": self.hits[i] / self.total.clamp(min=1) for i, k in enumerate(self.ks)}
        if self.zs_total > 0:
            out.update({f"zs_R@{k}": self.zs_hits[i] / self.zs_total for i, k in enumerate(self.ks)})
        return out


class RelationshipDetectionRecall(Metric):
    """Phrase or relationship detection from detector boxes: Recall@K at IoU >= ``iou``.

    Args:
        ks: kept triplets per image (default ``(50, 100)``).
        top_predicates: predicates per detected pair (1 default, ``None``: all).
        phrase: match the union box (phrase detection) instead of both boxes (relationship).
        iou: the overlap threshold (default 0.5).

    ``update(det, gt)`` takes one image's dicts. ``det``: ``subject_boxes``/``object_boxes``
    ``[D, 4]``, ``subject_labels``/``object_labels`` ``[D]``, ``scores`` ``[D, predicates]`` and
    optional ``subject_scores``/``object_scores`` ``[D]`` (detector confidences that multiply the
    predicate scores). ``gt``: ``subject_boxes``, ``object_boxes``, ``subject_labels``,
    ``object_labels``, ``predicates`` (``[T]``). Each ground-truth triplet is matched at most once,
    greedily in score order.
    """

    full_state_update = False

    def __init__(self, ks: Sequence[int] = (50, 100), top_predicates: int | None = 1, phrase: bool = False,
                 iou: float = 0.5, **kwargs) -> None:
        super().__init__(**kwargs)
        self.ks, self.top_predicates, self.phrase, self.iou = tuple(ks), top_predicates, phrase, iou
        self.add_state("hits", torch.zeros(len(self.ks), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, det: dict[str, torch.Tensor], gt: dict[str, torch.Tensor]) -> None:
        det = {k: v.detach().cpu() for k, v in det.items()}
        gt = {k: v.detach().cpu() for k, v in gt.items()}
        n_gt = len(gt["predicates"])
        self.total += n_gt
        if n_gt == 0 or len(det["scores"]) == 0:
            return
        scores = det["scores"].float()
        for key in ("subject_scores", "object_scores"):
            if key in det:
                scores = scores * det[key].float().unsqueeze(1)
        pairs, preds = _top_candidates(scores, self.top_predicates, max(self.ks))
        for i, k in enumerate(self.ks):  # each K keeps a prefix of the one ranking
            matched = torch.zeros(n_gt, dtype=torch.bool)
            for d, p in zip(pairs[:k].tolist(), preds[:k].tolist()):
                same = ((gt["predicates"] == p) & (gt["subject_labels"] == det["subject_labels"][d])
                        & (gt["object_labels"] == det["object_labels"][d]) & ~matched)
                if not same.any():
                    continue
                idx = same.nonzero().flatten()
                s_box = det["subject_boxes"][d].expand(len(idx), 4)
                o_box = det["object_boxes"][d].expand(len(idx), 4)
                if self.phrase:
                    ok = box_iou_pairs(union_boxes(s_box, o_box),
                                       union_boxes(gt["subject_boxes"][idx], gt["object_boxes"][idx])) >= self.iou
                else:
                    ok = ((box_iou_pairs(s_box, gt["subject_boxes"][idx]) >= self.iou)
                          & (box_iou_pairs(o_box, gt["object_boxes"][idx]) >= self.iou))
                if ok.any():
                    matched[idx[ok.nonzero().flatten()[0]]] = True
            self.hits[i] += float(matched.sum())

    def compute(self) -> dict[str, torch.Tensor]:
        return {f"R@{k}": self.hits[i] / self.total.clamp(min=1) for i, k in enumerate(self.ks)}
