"""Generated scenes in Visual Genome's on-disk layout: the embedded default for relationships.

Each image shows 3-6 coloured shapes on a plain canvas. An object's class is its colour and
shape (``red circle``: 5 colours x 8 shapes, 40 classes). Colours and free-standing shapes follow
long tails (red and circle most often, purple and diamond least), as object classes do in Visual
Genome, so many subject-predicate-object triplets are rare and a test split holds triplets that
training never saw (the zero-shot subset). Relationships follow from geometry and shape, in this
order of precedence:

- ``inside``: the subject's box lies within a ``frame``'s;
- ``on``: the subject rests on a ``bar`` (bottom edge on its top, overlapping horizontally);
- ``bigger than``: the subject's area is at least three times the object's;
- ``left of`` / ``right of`` / ``above`` / ``below``: the larger of the centre offsets decides.

:func:`write_scenes` writes ``images/<id>.jpg``, ``image_data.json``, ``objects.json``,
``relationships.json`` and the two alias files, with names in mixed case and synonyms (``red
disc`` for red circle, ``to the left of`` for left of), so loading exercises lower-casing and alias merging.
:func:`write_vrd_scenes` writes the same kind of scenes in the VRD dataset's layout.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

# Bumped whenever generation changes, so a cached copy of older scenes is never read as new ones.
SCENES_VERSION = 2
# Free-standing shapes and colours with their relative frequencies: the long tails that make
# zero-shot triplets. Frames and bars (the objects of "inside" and "on") are drawn besides.
SHAPES = ("circle", "square", "triangle", "cross", "ring", "diamond")
SHAPE_WEIGHTS = (12, 8, 5, 3, 2, 1)
COLOURS = {"red": (220, 40, 40), "green": (40, 160, 60), "blue": (50, 80, 220), "yellow": (230, 180, 30),
           "purple": (150, 60, 190)}
COLOUR_WEIGHTS = (6, 4, 3, 2, 1)
CLASSES = tuple(f"{c} {s}" for c in COLOURS for s in (*SHAPES, "frame", "bar"))
PREDICATES = ("inside", "on", "bigger than", "left of", "right of", "above", "below")
SHAPE_ALIASES = {"circle": ["disc", "round"], "square": ["box"]}
OBJECT_ALIASES = {f"{c} {s}": [f"{c} {a}" for a in aliases] for c in COLOURS for s, aliases in SHAPE_ALIASES.items()}
PREDICATE_ALIASES = {"left of": ["to the left of"], "on": ["on top of"]}


def predicate_of(s: dict, o: dict) -> str:
    """The predicate between subject ``s`` and object ``o`` (dicts with ``shape, x, y, w, h``)."""
    sx2, sy2, ox2, oy2 = s["x"] + s["w"], s["y"] + s["h"], o["x"] + o["w"], o["y"] + o["h"]
    if o["shape"] == "frame" and s["x"] >= o["x"] and s["y"] >= o["y"] and sx2 <= ox2 and sy2 <= oy2:
        return "inside"
    if o["shape"] == "bar" and abs(sy2 - o["y"]) <= 2 and s["x"] < ox2 and sx2 > o["x"]:
        return "on"
    if s["w"] * s["h"] >= 3 * o["w"] * o["h"]:
        return "bigger than"
    dx = (o["x"] + o["w"] / 2) - (s["x"] + s["w"] / 2)
    dy = (o["y"] + o["h"] / 2) - (s["y"] + s["h"] / 2)
    if abs(dx) >= abs(dy):
        return "left of" if dx > 0 else "right of"
    return "above" if dy > 0 else "below"


def _draw(draw, obj: dict) -> None:
    x, y, w, h = obj["x"], obj["y"], obj["w"], obj["h"]
    box = [x, y, x + w - 1, y + h - 1]
    name, colour = obj["shape"], COLOURS[obj["colour"]]
    if name == "circle":
        draw.ellipse(box, fill=colour)
    elif name == "square" or name == "bar":
        draw.rectangle(box, fill=colour)
    elif name == "triangle":
        draw.polygon([(x, y + h - 1), (x + w - 1, y + h - 1), (x + w // 2, y)], fill=colour)
    elif name == "frame":
        draw.rectangle(box, outline=colour, width=2)
    elif name == "ring":
        draw.ellipse(box, outline=colour, width=2)
    elif name == "diamond":
        draw.polygon([(x + w // 2, y), (x + w - 1, y + h // 2), (x + w // 2, y + h - 1), (x, y + h // 2)], fill=colour)
    else:  # cross
        draw.rectangle([x + w // 3, y, x + 2 * w // 3, y + h - 1], fill=colour)
        draw.rectangle([x, y + h // 3, x + w - 1, y + 2 * h // 3], fill=colour)


def _disjoint(cand: dict, objects: list[dict]) -> bool:
    return all(cand["x"] + cand["w"] <= o["x"] or o["x"] + o["w"] <= cand["x"] or cand["y"] + cand["h"] <= o["y"]
               or o["y"] + o["h"] <= cand["y"] for o in objects)


def _shape(rnd: random.Random) -> str:
    return rnd.choices(SHAPES, SHAPE_WEIGHTS)[0]


def _coloured(obj: dict, rnd: random.Random) -> dict:
    obj["colour"] = rnd.choices(list(COLOURS), COLOUR_WEIGHTS)[0]
    obj["name"] = f"{obj['colour']} {obj['shape']}"
    return obj


def _scene(rnd: random.Random, size: int) -> list[dict]:
    objects: list[dict] = []
    if rnd.random() < 0.35:  # something inside a frame
        w = rnd.randint(size // 4, size // 3)
        frame = {"shape": "frame", "x": rnd.randint(0, size - w), "y": rnd.randint(0, size - w), "w": w, "h": w}
        inner = rnd.randint(5, w // 2)
        objects += [frame, {"shape": _shape(rnd), "w": inner, "h": inner,
                            "x": frame["x"] + rnd.randint(3, w - inner - 3), "y": frame["y"] + rnd.randint(3, w - inner - 3)}]
    if rnd.random() < 0.35:  # something on a bar
        bw = rnd.randint(size // 4, size // 3)
        bar = {"shape": "bar", "x": rnd.randint(0, size - bw), "y": rnd.randint(size // 2, size - 6), "w": bw, "h": 5}
        inner = rnd.randint(6, 12)
        pair = [bar, {"shape": _shape(rnd), "w": inner, "h": inner, "x": bar["x"] + rnd.randint(0, bw - inner),
                      "y": bar["y"] - inner}]
        if all(_disjoint(p, objects) for p in pair):
            objects += pair
    wanted = rnd.randint(3, 6)
    for _ in range(200):  # bounded: a crowded canvas keeps what fits
        if len(objects) >= wanted:
            break
        side = rnd.choice((rnd.randint(6, 10), rnd.randint(12, 22)))
        cand = {"shape": _shape(rnd), "w": side, "h": side, "x": rnd.randint(0, size - side),
                "y": rnd.randint(0, size - side)}
        if _disjoint(cand, objects):  # no overlaps but the planned ones
            objects.append(cand)
    return [_coloured(o, rnd) for o in objects]


def _spelled(name: str, aliases: dict[str, list[str]], rnd: random.Random) -> str:
    options = [name, *aliases.get(name, [])]
    spelled = rnd.choice(options)
    return spelled.title() if rnd.random() < 0.3 else spelled


def generate(num_images: int, size: int = 96, seed: int = 0):
    """Yields ``(image_id, PIL image, objects, [(subject, predicate, object), ...])`` per scene,
    ``image_id`` from 1, every object a dict with a unique ``object_id``, ``shape``, ``colour``,
    ``name`` (its class) and its box ``x, y, w, h``."""
    from PIL import Image, ImageDraw

    rnd = random.Random(seed)
    next_object = 1
    for image_id in range(1, num_images + 1):
        objs = _scene(rnd, size)
        canvas = Image.new("RGB", (size, size), (245, 245, 240))
        draw = ImageDraw.Draw(canvas)
        for obj in objs:
            obj["object_id"], next_object = next_object, next_object + 1
            _draw(draw, obj)
        triplets = [(s, predicate_of(s, o), o) for s in objs for o in objs if s is not o and rnd.random() >= 0.3]
        yield image_id, canvas, objs, triplets


def write_scenes(root: str | Path, num_images: int = 800, size: int = 96, seed: int = 0) -> Path:
    """Writes ``num_images`` scenes under ``root`` in Visual Genome's layout; returns ``root``."""
    root = Path(root)
    (root / "images").mkdir(parents=True, exist_ok=True)
    rnd = random.Random(seed + 1)  # spellings
    image_data, objects_json, relationships_json = [], [], []
    next_rel = 1
    for image_id, canvas, objs, triplets in generate(num_images, size, seed):
        canvas.save(root / "images" / f"{image_id}.jpg", quality=95)
        image_data.append({"image_id": image_id, "width": size, "height": size,
                           "url": f"https://example.invalid/{image_id}.jpg"})

        def entry(o):
            return {"object_id": o["object_id"], "x": o["x"], "y": o["y"], "w": o["w"], "h": o["h"],
                    "names": [_spelled(o["name"], OBJECT_ALIASES, rnd)]}

        objects_json.append({"image_id": image_id, "objects": [entry(o) for o in objs]})
        rels = []
        for s, predicate, o in triplets:
            spelled = _spelled(predicate, PREDICATE_ALIASES, rnd)
            rels.append({"relationship_id": next_rel, "predicate": spelled.upper() if rnd.random() < 0.1 else spelled,
                         "subject": entry(s), "object": entry(o)})
            next_rel += 1
        relationships_json.append({"image_id": image_id, "relationships": rels})
    (root / "image_data.json").write_text(json.dumps(image_data))
    (root / "objects.json").write_text(json.dumps(objects_json))
    (root / "relationships.json").write_text(json.dumps(relationships_json))
    (root / "object_alias.txt").write_text("".join(f"{','.join([k, *v])}\n" for k, v in OBJECT_ALIASES.items()))
    (root / "relationship_alias.txt").write_text("".join(f"{','.join([k, *v])}\n" for k, v in PREDICATE_ALIASES.items()))
    return root


def write_vrd_scenes(root: str | Path, num_images: int = 400, size: int = 96, seed: int = 0,
                     test_fraction: float = 0.25) -> Path:
    """The same kind of scenes in the VRD dataset's layout (``annotations_{train,test}.json`` with
    ``[ymin, ymax, xmin, xmax]`` boxes and class indices, ``objects.json``, ``predicates.json``,
    ``sg_{train,test}_images/``); the last ``test_fraction`` of the images form the test split."""
    root = Path(root)
    for folder in ("sg_train_images", "sg_test_images"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    annotations = {"train": {}, "test": {}}
    first_test = num_images - int(test_fraction * num_images) + 1
    for image_id, canvas, objs, triplets in generate(num_images, size, seed):
        split = "test" if image_id >= first_test else "train"
        name = f"{image_id:06d}.jpg"
        canvas.save(root / f"sg_{split}_images" / name, quality=95)

        def part(o):
            return {"category": CLASSES.index(o["name"]), "bbox": [o["y"], o["y"] + o["h"], o["x"], o["x"] + o["w"]]}

        annotations[split][name] = [{"predicate": PREDICATES.index(p), "subject": part(s), "object": part(o)}
                                    for s, p, o in triplets]
    for split, data in annotations.items():
        (root / f"annotations_{split}.json").write_text(json.dumps(data))
    (root / "objects.json").write_text(json.dumps(list(CLASSES)))
    (root / "predicates.json").write_text(json.dumps(list(PREDICATES)))
    return root
