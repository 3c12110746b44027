"""Reading Visual Genome's relationship annotations (``image_data.json``, ``objects.json``,
``relationships.json``, optional ``object_alias.txt`` / ``relationship_alias.txt``) and finding
its images (``VG_100K/`` and ``VG_100K_2/`` as released, or ``images/``, as ``<image_id>.jpg``).

Names are lower-cased and stripped, and aliases merged (an alias file line is
``canonical,synonym,synonym...``). Vocabularies keep the ``num_objects`` / ``num_predicates``
most frequent names (ties by name): object names counted over ``objects.json`` (every annotated
object, as the usual VG-150 preparation does), predicates over ``relationships.json``. A
relationship's subject or object without its own name and box is resolved through its
``object_id`` in ``objects.json``. A relationship whose subject, object or predicate falls
outside them is left out; an entry that cannot be read raises an error naming the file and the
entry, so a bad entry never shifts labels silently.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Relationship:
    """One annotated triplet; boxes are ``(x1, y1, x2, y2)`` in pixels."""

    image_id: int
    subject: str
    predicate: str
    object: str
    subject_box: tuple[float, float, float, float]
    object_box: tuple[float, float, float, float]

    @property
    def triplet(self) -> tuple[str, str, str]:
        """``(subject, predicate, object)``: what zero-shot splits compare."""
        return (self.subject, self.predicate, self.object)


#: where a Visual Genome root keeps ``<image_id>.jpg``: the release's two folders, or one
IMAGE_FOLDERS = ("VG_100K", "VG_100K_2", "images")


def find_images(root: str | Path, image_ids) -> dict[int, Path]:
    """``{image_id: path}`` of every ``<image_id>.jpg`` found in ``root``'s :data:`IMAGE_FOLDERS`.

    Raises ``FileNotFoundError`` naming how many of ``image_ids`` are missing, the first few, and
    where they were looked for."""
    root = Path(root)
    found: dict[int, Path] = {}
    for folder in IMAGE_FOLDERS:
        if (root / folder).is_dir():
            for entry in (root / folder).iterdir():
                if entry.suffix.lower() == ".jpg" and entry.stem.isdigit():
                    found.setdefault(int(entry.stem), entry)
    wanted = sorted(set(image_ids))
    missing = [i for i in wanted if i not in found]
    if missing:
        first = ", ".join(f"{i}.jpg" for i in missing[:5]) + (", ..." if len(missing) > 5 else "")
        raise FileNotFoundError(
            f"{len(missing)} of the {len(wanted)} images that {root / 'relationships.json'} refers to are missing "
            f"({first}); looked in {', '.join(str(root / d) for d in IMAGE_FOLDERS)}. Put each <image_id>.jpg in "
            f"{' or '.join(f'{d}/' for d in IMAGE_FOLDERS)} (Visual Genome's release unpacks into VG_100K/ and "
            "VG_100K_2/), or leave those images' relationships out.")
    return {i: found[i] for i in wanted}


def load_json(path: Path):
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: a Visual Genome root holds image_data.json, objects.json and "
                                f"relationships.json (and the images in {' or '.join(f'{d}/' for d in IMAGE_FOLDERS)}).")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}.") from err


def load_aliases(path: Path) -> dict[str, str]:
    """``{synonym: canonical}`` from ``canonical,synonym,...`` lines; none when the file is absent."""
    if not path.exists():
        return {}
    aliases = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        names = [n.strip().lower() for n in line.split(",") if n.strip()]
        if len(names) == 1:
            raise ValueError(f"{path}:{number}: an alias line needs 'canonical,synonym[,...]', got {line!r}.")
        for synonym in names[1:]:
            aliases[synonym] = names[0]
    return aliases


def _name(entry: dict, where: str) -> str:
    if "names" in entry and isinstance(entry["names"], list) and entry["names"]:
        return str(entry["names"][0])
    if "name" in entry:
        return str(entry["name"])
    raise ValueError(f"{where}: has neither 'names' nor 'name'.")


def _box(entry: dict, where: str) -> tuple[float, float, float, float]:
    try:
        x, y, w, h = (float(entry[k]) for k in ("x", "y", "w", "h"))
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{where}: needs numeric x, y, w, h ({err!r}).") from err
    if w <= 0 or h <= 0:
        raise ValueError(f"{where}: box of width {w} and height {h}; both must be positive.")
    return (x, y, x + w, y + h)


def _normaliser(alias: dict[str, str]):
    def norm(name: str) -> str:
        name = " ".join(name.strip().lower().split())
        return alias.get(name, name)

    return norm


def read_objects(root: str | Path) -> dict[int, tuple[str, tuple[float, float, float, float]]]:
    """``{object_id: (name, box)}`` over ``objects.json``, names normalised and aliases merged."""
    root = Path(root)
    norm = _normaliser(load_aliases(root / "object_alias.txt"))
    path = root / "objects.json"
    objects = {}
    for i, image in enumerate(load_json(path)):
        if not isinstance(image, dict):
            raise ValueError(f"{path}: entry {i} must be an object with 'image_id' and 'objects'.")
        for j, obj in enumerate(image.get("objects", [])):
            where = f"{path}: image {image.get('image_id')}, object {obj.get('object_id', obj.get('id', j))}"
            key = obj.get("object_id", obj.get("id"))
            if key is None:
                raise ValueError(f"{where}: needs an 'object_id'.")
            objects[int(key)] = (norm(_name(obj, where)), _box(obj, where))
    return objects


def _part(entry: dict, objects: dict, norm, where: str) -> tuple[str, tuple[float, float, float, float]]:
    """A relationship's subject or object: its own name and box (a partial box is an error), else
    its ``object_id``'s."""
    if any(k in entry for k in ("x", "y", "w", "h")):
        return norm(_name(entry, where)), _box(entry, where)
    key = entry.get("object_id", entry.get("id"))
    if key is not None and int(key) in objects:
        return objects[int(key)]
    raise ValueError(f"{where}: has no name and box of its own, and its object_id {key!r} is not in objects.json "
                     "(needs 'names' and numeric x, y, w, h, or a known object_id).")


def read_relationships(root: str | Path, objects: dict | None = None) -> tuple[dict[int, tuple[int, int]], list[Relationship]]:
    """Image sizes ``{image_id: (width, height)}`` and every relationship, names normalised and
    aliases merged (not yet filtered by vocabulary). ``objects``: :func:`read_objects`' result,
    read when needed and not given."""
    root = Path(root)
    sizes = {}
    for i, image in enumerate(load_json(root / "image_data.json")):
        try:
            sizes[int(image.get("image_id", image.get("id")))] = (int(image["width"]), int(image["height"]))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{root / 'image_data.json'}: entry {i} needs image_id, width, height ({err!r}).") from err
    norm_object = _normaliser(load_aliases(root / "object_alias.txt"))
    norm_predicate = _normaliser(load_aliases(root / "relationship_alias.txt"))
    rels = []
    path = root / "relationships.json"
    for i, image in enumerate(load_json(path)):
        image_id = image.get("image_id")
        if image_id not in sizes:
            raise ValueError(f"{path}: entry {i} refers to image {image_id!r}, which image_data.json does not list.")
        for j, rel in enumerate(image.get("relationships", [])):
            where = f"{path}: image {image_id}, relationship {rel.get('relationship_id', j)}"
            if not isinstance(rel.get("predicate"), str) or not rel["predicate"].strip():
                raise ValueError(f"{where}: needs a non-empty 'predicate'.")
            if not isinstance(rel.get("subject"), dict) or not isinstance(rel.get("object"), dict):
                raise ValueError(f"{where}: needs 'subject' and 'object' entries.")
            if objects is None and not all(any(k in rel[p] for k in ("x", "y", "w", "h")) for p in ("subject", "object")):
                objects = read_objects(root)
            subject, subject_box = _part(rel["subject"], objects or {}, norm_object, where + " subject")
            obj, object_box = _part(rel["object"], objects or {}, norm_object, where + " object")
            rels.append(Relationship(int(image_id), subject, norm_predicate(rel["predicate"]), obj, subject_box,
                                     object_box))
    return sizes, rels


def vocabulary(names: list[str], size: int) -> list[str]:
    """The ``size`` most frequent names, most frequent first (ties by name)."""
    counts = Counter(names)
    return [n for n, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:size]]
