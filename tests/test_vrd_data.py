"""The VRD dataset's reader on scenes written in its on-disk layout."""

from __future__ import annotations

import json

import pytest

from lightning_granndis.datamodules import VRDDataModule
from lightning_granndis.vrd.scenes import CLASSES, PREDICATES, write_vrd_scenes


@pytest.fixture(scope="module")
def vrd_root(tmp_path_factory):
    return write_vrd_scenes(tmp_path_factory.mktemp("vrd"), num_images=60, seed=5)


def test_vrd_files_become_relationships_with_vrds_own_vocabulary(vrd_root):
    dm = VRDDataModule(root=str(vrd_root), val_fraction=0.2, crop_size=16)
    dm.setup()
    assert dm.object_names == list(CLASSES) and dm.predicate_names == list(PREDICATES)
    ann = json.loads((vrd_root / "annotations_test.json").read_text())
    assert len(dm.splits["test"]) == sum(len(v) for v in ann.values())
    # the first test relationship, read back: classes, predicate and box order [ymin, ymax, xmin, xmax]
    name = sorted(ann)[0]
    raw = ann[name][0]
    rel = dm.splits["test"].rels[0]
    ymin, ymax, xmin, xmax = raw["subject"]["bbox"]
    assert rel.subject_box == (xmin, ymin, xmax, ymax)
    assert (rel.subject, rel.predicate, rel.object) == (CLASSES[raw["subject"]["category"]], PREDICATES[raw["predicate"]],
                                                         CLASSES[raw["object"]["category"]])
    sample = dm.splits["test"][0]
    assert sample["crop"].shape == (3, 16, 16) and sample["predicate"] == raw["predicate"]
    assert sample["spatial"][0] == pytest.approx((xmax - xmin) * (ymax - ymin) / 96 / 96)  # area / image area
    train_images = {r.image_id for r in dm.splits["train"].rels}
    assert not train_images & {r.image_id for r in dm.splits["val"].rels}
    images = next(iter(dm.test_dataloader()))
    assert isinstance(images, list) and all(len({s["image_id"] for s in image}) == 1 for image in images)


def test_bad_vrd_entries_name_the_file_and_entry(tmp_path):
    root = write_vrd_scenes(tmp_path / "vrd", num_images=8, seed=1)
    ann = json.loads((root / "annotations_train.json").read_text())
    name = sorted(ann)[1]
    ann[name][0]["predicate"] = 99
    (root / "annotations_train.json").write_text(json.dumps(ann))
    with pytest.raises(ValueError, match=rf"annotations_train.json: image '{name}', relationship 0: cannot be read"):
        VRDDataModule(root=str(root)).setup()
    ann[name][0]["predicate"] = 0
    ann[name][0]["object"]["bbox"] = [5, 5, 1, 9]  # ymin == ymax: an empty box
    (root / "annotations_train.json").write_text(json.dumps(ann))
    with pytest.raises(ValueError, match="empty box"):
        VRDDataModule(root=str(root)).setup()
    ann[name][0]["object"]["bbox"] = [1, 5, 1, 9]
    (root / "annotations_train.json").write_text(json.dumps(ann))
    good_test = (root / "annotations_test.json").read_text()
    (root / "annotations_test.json").write_text("{\"a.jpg\": [")
    with pytest.raises(ValueError, match="annotations_test.json is not valid JSON"):
        VRDDataModule(root=str(root)).setup()
    (root / "annotations_test.json").write_text(good_test)
    VRDDataModule(root=str(root)).setup()  # whole again
    (root / "sg_train_images" / name).unlink()
    with pytest.raises(FileNotFoundError, match=f"image '{name}' of annotations_train.json is missing"):
        VRDDataModule(root=str(root)).setup()
