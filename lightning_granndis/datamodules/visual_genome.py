"""Visual Genome relationships for predicate detection, with generated scenes as the default."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader, Dataset

from lightning_granndis.datamodules.splits import SplitDataModule

from lightning_granndis.vrd.spatial import spatial_vector
from lightning_granndis.vrd.visual_genome import Relationship, find_images, read_objects, read_relationships, vocabulary


class RelationshipDataset(Dataset):
    """Predicate-detection samples: the union-box crop (loaded lazily), the spatial vector, the
    subject/object classes and the predicate. ``images``: a folder of ``<image_id>.jpg`` (Visual
    Genome) or ``{image_id: path}`` (VRD's file names)."""

    def __init__(self, rels: list[Relationship], sizes: dict[int, tuple[int, int]], objects: dict[str, int],
                 predicates: dict[str, int], images: Path | dict[int, Path], crop_size: int,
                 zero_shot: set | None = None) -> None:
        self.rels, self.sizes, self.objects, self.predicates = rels, sizes, objects, predicates
        self.images, self.crop_size = images, crop_size
        self.zero_shot = zero_shot or set()

    def __len__(self) -> int:
        return len(self.rels)

    def image_path(self, rel: Relationship) -> Path:
        return self.images[rel.image_id] if isinstance(self.images, dict) else self.images / f"{rel.image_id}.jpg"

    def crop(self, rel: Relationship) -> torch.Tensor:
        from PIL import Image
        import torchvision.transforms.functional as TF

        path = self.image_path(rel)
        if not path.exists():
            raise FileNotFoundError(f"{path}: image {rel.image_id} of a relationship is missing from {path.parent}.")
        try:
            with Image.open(path) as opened:
                image = opened.convert("RGB")
        except OSError as err:  # PIL's UnidentifiedImageError and truncated files are OSErrors
            raise ValueError(f"{path}: image {rel.image_id} cannot be read as an image ({err}); the file is "
                             "corrupt or truncated: download it again, or remove its relationships.") from err
        s, o = rel.subject_box, rel.object_box
        box = (max(0, min(s[0], o[0]) - 1), max(0, min(s[1], o[1]) - 1),
               min(image.width, max(s[2], o[2]) + 1), min(image.height, max(s[3], o[3]) + 1))  # 1-px margin
        crop = image.crop(tuple(int(round(v)) for v in box)).resize((self.crop_size, self.crop_size))
        return TF.normalize(TF.to_tensor(crop), (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))

    def __getitem__(self, i: int) -> dict:
        rel = self.rels[i]
        w, h = self.sizes[rel.image_id]
        sub, obj = torch.tensor([rel.subject_box]), torch.tensor([rel.object_box])
        return {
            "crop": self.crop(rel), "spatial": spatial_vector(sub, obj, w, h)[0],
            "subject": self.objects[rel.subject], "object": self.objects[rel.object],
            "predicate": self.predicates[rel.predicate], "image_id": rel.image_id,
            "subject_box": sub[0], "object_box": obj[0],
            "zero_shot": rel.triplet in self.zero_shot,
            "image_path": str(self.image_path(rel)),
        }


class ImageGroups(Dataset):
    """The relationships of a :class:`RelationshipDataset` grouped by image: item ``i`` is the list
    of image ``i``'s samples (Recall@K ranks each image's pairs together, so an image never
    straddles ranks or batches)."""

    def __init__(self, samples: RelationshipDataset, multiple_of: int = 1) -> None:
        self.samples = samples
        groups: dict[int, list[int]] = {}
        for i, rel in enumerate(samples.rels):
            groups.setdefault(rel.image_id, []).append(i)
        self.groups = list(groups.values())
        # Empty images up to a multiple of the world size: a DistributedSampler then pads nothing,
        # so no image is counted twice by Recall@K (and every rank runs as many batches).
        self.groups += [[] for _ in range(-len(self.groups) % multiple_of)]

    def __len__(self) -> int:
        return len(self.groups)

    def __getitem__(self, i: int) -> list[dict]:
        return [self.samples[j] for j in self.groups[i]]


def _as_list(batch: list) -> list:
    return list(batch)


class RelationshipDataModule(SplitDataModule):
    """What relationship DataModules share: ``object_names`` / ``predicate_names`` (class order),
    per-relationship training batches and per-image evaluation batches (:class:`ImageGroups`)."""

    object_names: list[str]
    predicate_names: list[str]

    @property
    def num_object_classes(self) -> int:
        return len(self.object_names)

    @property
    def num_predicate_classes(self) -> int:
        return len(self.predicate_names)

    def _datasets(self, parts: dict[str, list[Relationship]], sizes: dict[int, tuple[int, int]],
                  images: Path | dict[int, Path], zero_shot: set) -> dict[str, RelationshipDataset]:
        """One :class:`RelationshipDataset` per split, labelled by ``object_names`` /
        ``predicate_names``."""
        objects = {n: i for i, n in enumerate(self.object_names)}
        predicates = {n: i for i, n in enumerate(self.predicate_names)}
        return {k: RelationshipDataset(v, sizes, objects, predicates, images, self.hparams.crop_size, zero_shot)
                for k, v in parts.items()}

    def _images(self, split: str) -> DataLoader:
        from lightning_granndis import comm

        groups = ImageGroups(self.splits[split], multiple_of=comm.get_world_size() if comm.is_initialized() else 1)
        return DataLoader(groups, batch_size=self.hparams.images_per_batch, collate_fn=_as_list,
                          num_workers=self.hparams.num_workers)

    def val_dataloader(self) -> DataLoader:
        return self._images("val")

    def test_dataloader(self) -> DataLoader:
        return self._images("test")


class VisualGenomeDataModule(RelationshipDataModule):
    """Predicate detection on Visual Genome's files (or generated scenes in the same layout).

    Args:
        root: a folder with ``image_data.json``, ``objects.json``, ``relationships.json``, the
            images as ``<image_id>.jpg`` in ``VG_100K/`` and ``VG_100K_2/`` (the release's layout) or
            ``images/``, and optionally the alias files. Every image a kept relationship refers to
            is checked at ``setup()``. ``None`` (default): generated
            scenes (:func:`~lightning_granndis.vrd.scenes.write_scenes`) written once to
            ``data/vg_scenes/v<version>-n<num_images>-seed<seed>``.
        num_objects, num_predicates: vocabulary sizes (default 150 / 50, Visual Genome's usual;
            100 / 70 is VRD's).
        crop_size: side of the union-box crop (default 32).
        batch_size: samples per batch (default 64).
        val_fraction, test_fraction: shares of images (default 0.1 / 0.2), split by a seeded
            permutation of image ids.
        seed: split seed (default 0).
        num_images: generated scenes when ``root`` is ``None`` (default 800).
        num_workers: DataLoader workers (default 0).
        images_per_batch: images per evaluation batch (default 8).

    Training batches are dicts: ``crop`` ``[B, 3, S, S]``, ``spatial`` ``[B, 7]``, ``subject``,
    ``object``, ``predicate``, ``image_id``, ``zero_shot`` (test triplets never seen in training)
    ``[B]``. Validation and test batches are lists of ``images_per_batch`` images, each the list
    of its samples (:class:`ImageGroups`), for per-image Recall@K.
    """

    def __init__(self, root: str | None = None, num_objects: int = 150, num_predicates: int = 50, crop_size: int = 32,
                 batch_size: int = 64, val_fraction: float = 0.1, test_fraction: float = 0.2, seed: int = 0,
                 num_images: int = 800, num_workers: int = 0, images_per_batch: int = 8) -> None:
        super().__init__()
        if not 0 < val_fraction + test_fraction < 1:
            raise ValueError(f"val_fraction + test_fraction must lie in (0, 1), got {val_fraction} + {test_fraction}.")
        self.save_hyperparameters()
        self.splits: dict[str, RelationshipDataset] = {}
        self.object_names: list[str] = []
        self.predicate_names: list[str] = []

    @property
    def root(self) -> Path:
        if self.hparams.root:
            return Path(self.hparams.root)
        from lightning_granndis.vrd.scenes import SCENES_VERSION

        # one folder per generator version and setting: a cached copy is never another setting's
        return Path("data") / "vg_scenes" / f"v{SCENES_VERSION}-n{self.hparams.num_images}-seed{self.hparams.seed}"

    def prepare_data(self) -> None:
        if self.hparams.root is None and not (self.root / "relationships.json").exists():
            from lightning_granndis.vrd.scenes import write_scenes

            self.root.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=self.root.parent, prefix=f".{self.root.name}."))
            write_scenes(tmp, self.hparams.num_images, seed=self.hparams.seed)
            try:
                tmp.rename(self.root)  # atomic: a reader sees all of it or nothing
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)  # another process got there first

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        if self.hparams.root is None:
            self.prepare_data()
        hp = self.hparams
        annotated = read_objects(self.root)
        sizes, rels = read_relationships(self.root, annotated)
        # object classes by frequency over every annotated object, as VG-150-style preparations do
        self.object_names = vocabulary([name for name, _ in annotated.values()], hp.num_objects)
        self.predicate_names = vocabulary([r.predicate for r in rels], hp.num_predicates)
        objects, predicates = set(self.object_names), set(self.predicate_names)
        kept = [r for r in rels if r.subject in objects and r.object in objects and r.predicate in predicates]
        #: relationships read, and those left out as outside the object/predicate vocabulary
        self.relationship_counts = {"read": len(rels), "out_of_vocabulary": len(rels) - len(kept)}
        rank_zero_info(f"Visual Genome ({self.root}): {len(kept):,} of {len(rels):,} relationships kept, "
                       f"{len(rels) - len(kept):,} left out as outside the {hp.num_objects}-object / "
                       f"{hp.num_predicates}-predicate vocabulary.")
        rels = kept
        images = find_images(self.root, (r.image_id for r in rels))
        ids = sorted(sizes)
        order = torch.randperm(len(ids), generator=torch.Generator().manual_seed(hp.seed)).tolist()
        n_val, n_test = int(hp.val_fraction * len(ids)), int(hp.test_fraction * len(ids))
        split_of = {}
        for rank, idx in enumerate(order):
            split_of[ids[idx]] = "val" if rank < n_val else "test" if rank < n_val + n_test else "train"
        parts = {k: [r for r in rels if split_of[r.image_id] == k] for k in ("train", "val", "test")}
        unseen = {r.triplet for r in rels} - {r.triplet for r in parts["train"]}
        self.splits = self._datasets(parts, sizes, images, unseen)
