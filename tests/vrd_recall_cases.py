"""Random per-image inputs for the Recall@K metrics, shared by the one-process test and the
two-process script (tests/scripts/vrd_recall.py)."""

from __future__ import annotations

import torch

from lightning_granndis.vrd.metrics import PredicateDetectionRecall, RelationshipDetectionRecall


def random_images(n: int, predicates: int = 7, classes: int = 5) -> list[dict]:
    """``n`` images: predicate-detection inputs and detector outputs, some with no triplets."""
    g = torch.Generator().manual_seed(1234)
    images = []
    for i in range(n):
        pairs = int(torch.randint(0, 30, (), generator=g)) if i % 5 else 0
        t = pairs + int(torch.randint(0, 3, (), generator=g)) if pairs else 0
        gt_pairs = torch.cat([torch.arange(pairs), torch.randint(0, max(pairs, 1), (t - pairs,), generator=g)])
        boxes = torch.rand(max(pairs, 1), 2, 2, generator=g).sort(dim=1).values.mul(100)  # [pair, corner, xy]
        boxes = boxes.permute(0, 2, 1).reshape(-1, 4)[:, [0, 2, 1, 3]]                 # x1 y1 x2 y2
        gt = {"subject_boxes": boxes[gt_pairs], "object_boxes": boxes.flip(0)[gt_pairs],
              "subject_labels": torch.randint(0, classes, (t,), generator=g),
              "object_labels": torch.randint(0, classes, (t,), generator=g),
              "predicates": torch.randint(0, predicates, (t,), generator=g)}
        jitter = torch.randn(t, 4, generator=g) * 3
        det = {"subject_boxes": gt["subject_boxes"] + jitter, "object_boxes": gt["object_boxes"] - jitter,
               "subject_labels": gt["subject_labels"], "object_labels": gt["object_labels"],
               "scores": torch.rand(t, predicates, generator=g), "subject_scores": torch.rand(t, generator=g),
               "object_scores": torch.rand(t, generator=g)}
        images.append({"scores": torch.rand(pairs, predicates, generator=g), "gt_pairs": gt_pairs,
                       "gt_predicates": gt["predicates"], "zero_shot": torch.rand(t, generator=g) < 0.3,
                       "det": det, "gt": gt})
    return images


def update_all(images: list[dict], rank: int = 0, world: int = 1) -> dict:
    """Every metric kind, updated with images ``rank, rank + world, ...``."""
    metrics = {"pred_k1": PredicateDetectionRecall((5, 10), top_predicates=1),
               "pred_kall": PredicateDetectionRecall((5, 10), top_predicates=None),
               "phrase": RelationshipDetectionRecall((5, 10), phrase=True),
               "relationship": RelationshipDetectionRecall((5, 10), top_predicates=None)}
    for image in images[rank::world]:
        for name, metric in metrics.items():
            if name.startswith("pred"):
                metric.update(image["scores"], image["gt_pairs"], image["gt_predicates"], image["zero_shot"])
            else:
                metric.update(image["det"], image["gt"])
    return metrics
