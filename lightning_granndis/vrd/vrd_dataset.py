"""Reading the VRD dataset (Lu et al., ECCV'16): ``annotations_{train,test}.json``, ``objects.json``,
``predicates.json`` and the ``sg_{train,test}_images/`` folders.

An annotation file maps an image file name to its relationships, each
``{"predicate": p, "subject": {"category": c, "bbox": [ymin, ymax, xmin, xmax]}, "object": {...}}``
with indices into ``predicates.json`` / ``objects.json`` (lists of names).
"""

from __future__ import annotations

from pathlib import Path

from lightning_granndis.vrd.visual_genome import Relationship, load_json

IMAGE_DIRS = {"train": "sg_train_images", "test": "sg_test_images"}


def read_vrd(root: str | Path, split: str, objects: list[str], predicates: list[str],
             first_id: int = 0) -> tuple[dict[int, tuple[int, int]], dict[int, Path], list[Relationship]]:
    """Image sizes, image paths (by a running id from ``first_id``) and relationships of a split.
    Image sizes come from the image files' headers; a missing image or bad entry raises an error
    naming the file and the entry."""
    from PIL import Image

    root = Path(root)
    path = root / f"annotations_{split}.json"
    annotations = load_json(path)
    if not isinstance(annotations, dict):
        raise ValueError(f"{path}: expected an object mapping image file names to relationship lists.")
    sizes, paths, rels = {}, {}, []
    for offset, (name, entries) in enumerate(sorted(annotations.items())):
        image_id = first_id + offset
        image = root / IMAGE_DIRS[split] / name
        if not image.exists():
            raise FileNotFoundError(f"{image}: image {name!r} of {path.name} is missing.")
        with Image.open(image) as im:
            sizes[image_id] = im.size
        paths[image_id] = image
        for j, rel in enumerate(entries):
            where = f"{path}: image {name!r}, relationship {j}"
            try:
                s, o, p = rel["subject"], rel["object"], int(rel["predicate"])
                boxes = []
                for part in (s, o):
                    ymin, ymax, xmin, xmax = (float(v) for v in part["bbox"])
                    if xmax <= xmin or ymax <= ymin:
                        raise ValueError(f"empty box {part['bbox']}")
                    boxes.append((xmin, ymin, xmax, ymax))
                names = objects[int(s["category"])], predicates[p], objects[int(o["category"])]
                if min(int(s["category"]), p, int(o["category"])) < 0:
                    raise IndexError("negative index")
            except (KeyError, TypeError, ValueError, IndexError) as err:
                raise ValueError(f"{where}: cannot be read ({err}).") from err
            rels.append(Relationship(image_id, names[0], names[1], names[2], boxes[0], boxes[1]))
    return sizes, paths, rels
