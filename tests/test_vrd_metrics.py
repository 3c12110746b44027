"""The VRD spatial vector on hand-computed boxes, and Recall@K on hand-built predictions."""

from __future__ import annotations

import pytest
import torch

from lightning_granndis.vrd import spatial_vector
from lightning_granndis.vrd.metrics import PredicateDetectionRecall, RelationshipDetectionRecall


def test_spatial_vector_on_hand_computed_boxes():
    # 100 x 50 image; subject [0,0,40,20] (area 800), object [20,10,60,30] (area 800)
    # overlap [20,10,40,20] = 200 -> IoU 200 / 1400; centres (20,10) and (40,20)
    v = spatial_vector(torch.tensor([[0.0, 0, 40, 20]]), torch.tensor([[20.0, 10, 60, 30]]), 100, 50)[0]
    assert v.tolist() == pytest.approx([800 / 5000, 800 / 5000, 200 / 1400, 20 / 100, 10 / 50, 0.0, 0.0])
    # containment flags, both ways, and a disjoint pair (IoU 0, negative offsets)
    big, small = torch.tensor([[0.0, 0, 100, 50]]), torch.tensor([[10.0, 10, 20, 20]])
    assert spatial_vector(big, small, 100, 50)[0, 5:].tolist() == [1.0, 0.0]
    assert spatial_vector(small, big, 100, 50)[0, 5:].tolist() == [0.0, 1.0]
    far = spatial_vector(torch.tensor([[60.0, 30, 70, 40]]), small, 100, 50)[0]
    assert far[2] == 0 and far[3] == pytest.approx(-50 / 100) and far[4] == pytest.approx(-20 / 50)


def test_predicate_recall_k1_versus_all_predicates():
    # 3 pairs, 4 predicates. Ground truth: pair 0 -> 1, pair 1 -> 2, pair 2 -> 0.
    scores = torch.tensor([[0.1, 0.9, 0.0, 0.0],    # pair 0: right at rank 1
                           [0.0, 0.0, 0.3, 0.7],    # pair 1: right only at rank 2 (0.3)
                           [0.05, 0.6, 0.2, 0.15]])  # pair 2: right only at rank 4 (0.05)
    gt_pairs, gt_pred = torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0])
    k1 = PredicateDetectionRecall(ks=(1, 2, 50), top_predicates=1)
    k1.update(scores, gt_pairs, gt_pred)
    assert {k: float(v) for k, v in k1.compute().items()} == pytest.approx({"R@1": 1 / 3, "R@2": 1 / 3, "R@50": 1 / 3})
    everything = PredicateDetectionRecall(ks=(1, 4, 8, 50), top_predicates=None)
    everything.update(scores, gt_pairs, gt_pred)
    # all 12 candidates sorted: .9 .7 .6 .3 .2 .15 .1 .05 0 0 0 0 -> the .3 is 4th, the .05 is 8th
    assert {k: float(v) for k, v in everything.compute().items()} == pytest.approx(
        {"R@1": 1 / 3, "R@4": 2 / 3, "R@8": 1.0, "R@50": 1.0})


def test_predicate_recall_ties_keep_the_earlier_candidate_and_sums_over_images():
    m = PredicateDetectionRecall(ks=(1,), top_predicates=1)
    tied = torch.tensor([[0.5, 0.0], [0.5, 0.0]])  # two pairs score 0.5 for predicate 0
    m.update(tied, torch.tensor([1]), torch.tensor([0]))  # ground truth on the later pair: loses the tie
    assert float(m.compute()["R@1"]) == 0.0
    m.update(tied, torch.tensor([0, 1]), torch.tensor([0, 0]))  # next image: 1 of 2 recalled
    assert float(m.compute()["R@1"]) == pytest.approx(1 / 3)  # summed over images, not averaged


def test_zero_shot_recall_counts_only_unseen_triplets():
    m = PredicateDetectionRecall(ks=(50,), top_predicates=1)
    scores = torch.tensor([[0.9, 0.1], [0.2, 0.8]])
    m.update(scores, torch.tensor([0, 1]), torch.tensor([0, 0]), zero_shot=torch.tensor([False, True]))
    out = m.compute()
    assert float(out["R@50"]) == 0.5 and float(out["zs_R@50"]) == 0.0
    plain = PredicateDetectionRecall(ks=(50,))
    plain.update(scores, torch.tensor([0]), torch.tensor([0]))
    assert "zs_R@50" not in plain.compute()


def _gt():
    return {"subject_boxes": torch.tensor([[0.0, 0, 10, 10]]), "object_boxes": torch.tensor([[20.0, 0, 30, 10]]),
            "subject_labels": torch.tensor([1]), "object_labels": torch.tensor([2]), "predicates": torch.tensor([0])}


@pytest.mark.parametrize("phrase", [False, True])
def test_relationship_and_phrase_detection_need_iou_half(phrase):
    good = {"subject_boxes": torch.tensor([[0.0, 0, 10, 11]]), "object_boxes": torch.tensor([[20.0, 0, 30, 10]]),
            "subject_labels": torch.tensor([1]), "object_labels": torch.tensor([2]), "scores": torch.tensor([[0.9, 0.1]])}
    m = RelationshipDetectionRecall(ks=(50,), phrase=phrase)
    m.update(good, _gt())
    assert float(m.compute()["R@50"]) == 1.0
    # the subject box shifted far: relationship detection misses; the union box still overlaps >= 0.5
    shifted = dict(good, subject_boxes=torch.tensor([[5.0, 0, 15, 10]]))
    m = RelationshipDetectionRecall(ks=(50,), phrase=phrase)
    m.update(shifted, _gt())
    assert float(m.compute()["R@50"]) == (1.0 if phrase else 0.0)
    # a wrong label never matches; a duplicate detection recalls the triplet once
    wrong = dict(good, object_labels=torch.tensor([3]))
    m = RelationshipDetectionRecall(ks=(50,), phrase=phrase)
    m.update(wrong, _gt())
    assert float(m.compute()["R@50"]) == 0.0
    twice = {k: torch.cat([v, v]) for k, v in good.items()}
    m = RelationshipDetectionRecall(ks=(50,), phrase=phrase)
    m.update(twice, _gt())
    assert float(m.compute()["R@50"]) == 1.0 and float(m.total) == 1


def test_detector_confidences_reorder_the_kept_triplets():
    gt = _gt()
    det = {"subject_boxes": torch.tensor([[0.0, 0, 10, 10], [0.0, 0, 10, 10]]),
           "object_boxes": torch.tensor([[20.0, 0, 30, 10], [50.0, 0, 60, 10]]),
           "subject_labels": torch.tensor([1, 1]), "object_labels": torch.tensor([2, 2]),
           "scores": torch.tensor([[0.5, 0.0], [0.9, 0.0]])}
    m = RelationshipDetectionRecall(ks=(1,))
    m.update(det, gt)  # the wrongly placed pair scores higher: R@1 misses
    assert float(m.compute()["R@1"]) == 0.0
    m = RelationshipDetectionRecall(ks=(1,))
    m.update(dict(det, subject_scores=torch.tensor([1.0, 0.1])), gt)  # 0.5 x 1.0 beats 0.9 x 0.1
    assert float(m.compute()["R@1"]) == 1.0


def test_recall_over_two_ranks_equals_one_process(tmp_path):
    """Real 2-process gloo runs: the metrics fed disjoint images, and the model validated under
    Lightning DDP (images padded to the world size), give one process's Recall@K exactly."""
    import json

    import lightning.pytorch as pl
    from helpers import read_ranks, torchrun
    from vrd_recall_cases import random_images, update_all

    from lightning_granndis.datamodules import VisualGenomeDataModule
    from lightning_granndis.models.vrd import VisualRelationshipModel
    from lightning_granndis.vrd.scenes import write_scenes

    root = write_scenes(tmp_path / "scenes", num_images=70, seed=2)  # 7 validation images: one rank pads
    dm = VisualGenomeDataModule(root=str(root), images_per_batch=2)
    dm.setup()
    pl.seed_everything(0)
    model = VisualRelationshipModel(dm.num_object_classes, dm.num_predicate_classes, variant="LS+SVW", width_mult=0.25)
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    (tmp_path / "config.json").write_text(json.dumps({"num_objects": dm.num_object_classes,
                                                      "num_predicates": dm.num_predicate_classes}))
    one = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                     enable_model_summary=False).validate(model, dm, verbose=False)[0]
    def flat(metrics):
        return {f"{name}/{k}": float(v) for name, m in metrics.items() for k, v in m.compute().items()}

    whole, half = flat(update_all(random_images(12))), flat(update_all(random_images(12), 0, 2))
    assert half != whole  # one rank's share alone gives other numbers: the sum over ranks is what is tested

    torchrun("vrd_recall.py", 2, str(tmp_path), str(root), timeout=600)
    ranks = read_ranks(tmp_path, 2)
    for r in ranks:
        assert r["computed"] == pytest.approx(whole, abs=1e-12)
        recalls = {k: v for k, v in r["logged"].items() if "R@" in k}
        assert len(recalls) >= 4 and recalls == pytest.approx({k: one[k] for k in recalls}, abs=1e-6)
        assert set(recalls) == {k for k in one if "R@" in k}
