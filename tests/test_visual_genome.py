"""Visual Genome parsing on generated scenes written in its on-disk layout."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from lightning_granndis.datamodules import VisualGenomeDataModule
from lightning_granndis.vrd.scenes import CLASSES, PREDICATES, SCENES_VERSION, predicate_of, write_scenes
from lightning_granndis.vrd.visual_genome import load_aliases, read_objects, read_relationships


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    return write_scenes(tmp_path_factory.mktemp("vg"), num_images=120, seed=3)


def test_predicates_follow_from_geometry_and_class():
    frame = {"shape": "frame", "x": 10, "y": 10, "w": 30, "h": 30}
    dot = {"shape": "circle", "x": 15, "y": 15, "w": 6, "h": 6}
    bar = {"shape": "bar", "x": 0, "y": 50, "w": 40, "h": 5}
    cup = {"shape": "square", "x": 5, "y": 42, "w": 8, "h": 8}
    assert predicate_of(dot, frame) == "inside" and predicate_of(cup, bar) == "on"
    assert predicate_of(frame, dot) == "bigger than"
    far = {"shape": "square", "x": 50, "y": 12, "w": 8, "h": 8}
    assert predicate_of(dot, far) == "left of" and predicate_of(far, dot) == "right of"
    low = {"shape": "square", "x": 14, "y": 50, "w": 7, "h": 7}
    assert predicate_of(dot, low) == "above" and predicate_of(low, dot) == "below"


def test_names_are_lowercased_and_aliases_merged(scenes):
    raw = json.loads((scenes / "relationships.json").read_text())
    spelled = {r["subject"]["names"][0] for im in raw for r in im["relationships"]}
    assert any(n.lower().endswith(" disc") for n in spelled) and any(n != n.lower() for n in spelled)  # it varies
    sizes, rels = read_relationships(scenes)
    assert len(sizes) == 120 and sizes[1] == (96, 96)
    assert {r.predicate for r in rels} <= set(PREDICATES)           # "to the left of", "ON TOP OF" merged
    assert {r.subject for r in rels} <= set(CLASSES)                # "Red Disc" is "red circle"
    assert load_aliases(scenes / "object_alias.txt")["red disc"] == "red circle"


def test_datamodule_builds_vocabularies_a_deterministic_split_and_union_crops(scenes):
    dm = VisualGenomeDataModule(root=str(scenes), num_objects=150, num_predicates=50, crop_size=24, batch_size=8)
    dm.setup()
    assert dm.num_predicate_classes == len(PREDICATES)
    counts = Counter(name for name, _ in read_objects(scenes).values())  # over objects.json
    assert set(dm.object_names) == set(counts) <= set(CLASSES)  # every name, most frequent first
    assert [counts[n] for n in dm.object_names] == sorted(counts.values(), reverse=True)
    again = VisualGenomeDataModule(root=str(scenes))
    again.setup()
    images = {k: {r.image_id for r in v.rels} for k, v in dm.splits.items()}
    assert images == {k: {r.image_id for r in v.rels} for k, v in again.splits.items()}
    assert not (images["train"] & images["test"]) and not (images["train"] & images["val"])
    batch = next(iter(dm.train_dataloader()))
    assert batch["crop"].shape == (8, 3, 24, 24) and batch["spatial"].shape == (8, 7)
    rel = dm.splits["train"].rels[0]
    sample = dm.splits["train"][0]
    assert dm.predicate_names[sample["predicate"]] == rel.predicate and dm.object_names[sample["subject"]] == rel.subject
    # zero-shot: exactly the test triplets that training never shows
    train = {(r.subject, r.predicate, r.object) for r in dm.splits["train"].rels}
    test = dm.splits["test"]
    flags = [test[i]["zero_shot"] for i in range(len(test))]
    assert flags == [(r.subject, r.predicate, r.object) not in train for r in test.rels]
    assert 0.1 < sum(flags) / len(flags) < 0.9  # the long tails leave a real zero-shot subset (63 % of 120 scenes)


def test_smaller_vocabularies_drop_rare_names_instead_of_shifting_labels(scenes):
    dm = VisualGenomeDataModule(root=str(scenes), num_objects=3, num_predicates=2)
    dm.setup()
    kept = [r for split in dm.splits.values() for r in split.rels]
    assert {r.predicate for r in kept} == set(dm.predicate_names) and len(dm.predicate_names) == 2
    assert all(r.subject in dm.object_names and r.object in dm.object_names for r in kept)


def test_relationship_parts_without_their_own_box_are_resolved_through_objects_json(tmp_path, scenes):
    import shutil

    slim = tmp_path / "slim"
    shutil.copytree(scenes, slim)
    data = json.loads((slim / "relationships.json").read_text())
    for image in data:  # keep only the object_id, as some Visual Genome releases do
        for rel in image["relationships"]:
            rel["subject"] = {"object_id": rel["subject"]["object_id"]}
            rel["object"] = {"object_id": rel["object"]["object_id"]}
    (slim / "relationships.json").write_text(json.dumps(data))
    assert read_relationships(slim) == read_relationships(scenes)
    data[1]["relationships"][0]["object"] = {"object_id": 987654}
    (slim / "relationships.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"image 2, relationship \d+ object: .*object_id 987654 is not in objects.json"):
        read_relationships(slim)


def test_malformed_input_names_the_file_and_entry(tmp_path, scenes):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(scenes, bad)
    text = (bad / "relationships.json").read_text()
    (bad / "relationships.json").write_text(text[:-5])
    with pytest.raises(ValueError, match=r"relationships.json is not valid JSON"):
        read_relationships(bad)
    data = json.loads(text)
    rel = data[4]["relationships"][0]
    del rel["subject"]["w"]
    (bad / "relationships.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=rf"image 5, relationship {rel['relationship_id']} subject: needs numeric"):
        read_relationships(bad)
    data[4]["relationships"][0]["subject"]["w"] = 5
    data[4]["relationships"][0]["predicate"] = ""
    (bad / "relationships.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="needs a non-empty 'predicate'"):
        read_relationships(bad)
    data[4]["relationships"][0]["predicate"] = "above"
    (bad / "relationships.json").write_text(json.dumps(data))
    (bad / "object_alias.txt").write_text("circle,disc\nlonely\n")
    with pytest.raises(ValueError, match=r"object_alias.txt:2"):
        read_relationships(bad)
    (bad / "object_alias.txt").unlink()
    objects_text = (bad / "objects.json").read_text()
    objects = json.loads(objects_text)
    del objects[2]["objects"][1]["h"]
    (bad / "objects.json").write_text(json.dumps(objects))
    with pytest.raises(ValueError, match=rf"objects.json: image 3, object {objects[2]['objects'][1]['object_id']}: needs"):
        read_objects(bad)
    (bad / "objects.json").write_text(json.dumps([[]]))
    with pytest.raises(ValueError, match=r"objects.json: entry 0 must be an object with 'image_id' and 'objects'"):
        read_objects(bad)
    (bad / "objects.json").write_text(objects_text)


def _release_layout(scenes, dest):
    """``scenes`` copied into Visual Genome's released layout: the images split over ``VG_100K/``
    and ``VG_100K_2/``, no ``images/``."""
    import shutil

    shutil.copytree(scenes, dest)
    for folder in ("VG_100K", "VG_100K_2"):
        (dest / folder).mkdir()
    for path in sorted((dest / "images").iterdir()):
        path.rename(dest / ("VG_100K" if int(path.stem) % 2 else "VG_100K_2") / path.name)
    (dest / "images").rmdir()
    return dest


def test_images_load_from_the_released_vg_100k_folders(tmp_path, scenes):
    root = _release_layout(scenes, tmp_path / "vg")
    dm = VisualGenomeDataModule(root=str(root), crop_size=16)
    dm.setup()
    for split in dm.splits.values():  # every sample of every split, from both folders
        paths = {split[i]["image_path"] for i in range(len(split))}
        assert all(p.split("/")[-2] in ("VG_100K", "VG_100K_2") for p in paths)
    assert {p.split("/")[-2] for p in paths} == {"VG_100K", "VG_100K_2"}
    reference = VisualGenomeDataModule(root=str(scenes), crop_size=16)  # the images/ layout
    reference.setup()
    assert torch.equal(dm.splits["test"][3]["crop"], reference.splits["test"][3]["crop"])


def test_missing_images_are_listed_at_setup_and_a_corrupt_one_is_named(tmp_path, scenes):
    root = _release_layout(scenes, tmp_path / "vg")
    for image_id in (4, 7, 9):
        next(root.glob(f"VG_100K*/{image_id}.jpg")).unlink()
    with pytest.raises(FileNotFoundError, match=r"3 of the 120 images .* are missing \(4.jpg, 7.jpg, 9.jpg\); "
                                                 r"looked in .*VG_100K, .*VG_100K_2, .*images"):
        VisualGenomeDataModule(root=str(root)).setup()
    root = _release_layout(scenes, tmp_path / "vg2")
    corrupt = root / "VG_100K_2" / "2.jpg"
    corrupt.write_bytes(corrupt.read_bytes()[:40])  # truncated
    dm = VisualGenomeDataModule(root=str(root))
    dm.setup()
    split = next(s for s in dm.splits.values() if any(r.image_id == 2 for r in s.rels))
    with pytest.raises(ValueError, match=r"VG_100K_2/2.jpg: image 2 cannot be read as an image .*corrupt or truncated"):
        split[[r.image_id for r in split.rels].index(2)]


def test_relationships_outside_the_vocabulary_are_counted(scenes):
    sizes, rels = read_relationships(scenes)
    dm = VisualGenomeDataModule(root=str(scenes), num_predicates=3)
    dm.setup()
    kept = sum(len(s) for s in dm.splits.values())
    assert dm.relationship_counts == {"read": len(rels), "out_of_vocabulary": len(rels) - kept}
    assert 0 < kept < len(rels)


def test_default_scenes_are_generated_once_in_the_same_layout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dm = VisualGenomeDataModule(num_images=40)
    dm.setup()
    assert (tmp_path / "data" / "vg_scenes" / f"v{SCENES_VERSION}-n40-seed0" / "relationships.json").exists()
    other = VisualGenomeDataModule(num_images=60)  # another setting never reads the cached 40 scenes
    other.setup()
    assert len({r.image_id for s in other.splits.values() for r in s.rels}) > 40
    assert sum(len(s) for s in dm.splits.values()) > 40
    assert isinstance(dm.splits["train"][0]["crop"], torch.Tensor)
