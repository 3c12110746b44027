"""The VRD dataset (Lu et al., ECCV'16) for predicate detection: 100 objects, 70 predicates."""

from __future__ import annotations

from pathlib import Path

import torch

from lightning_granndis.datamodules.visual_genome import RelationshipDataModule, RelationshipDataset
from lightning_granndis.vrd.visual_genome import load_json
from lightning_granndis.vrd.vrd_dataset import read_vrd


class VRDDataModule(RelationshipDataModule):
    """Predicate detection on VRD's files under ``root``: ``annotations_{train,test}.json``,
    ``objects.json``, ``predicates.json``, ``sg_train_images/``, ``sg_test_images/``.

    Args:
        root: the dataset folder (default ``data/vrd``).
        crop_size: side of the union-box crop (default 32).
        batch_size: relationships per training batch (default 64).
        val_fraction: share of training images held out for validation (default 0.1, seeded).
        seed: split seed (default 0).
        num_workers: DataLoader workers (default 0).
        images_per_batch: images per evaluation batch (default 8).

    The vocabularies are VRD's own lists, in their order. Zero-shot flags mark test triplets that
    no training image shows. Batches are as in
    :class:`~lightning_granndis.datamodules.VisualGenomeDataModule`.
    """

    def __init__(self, root: str = "data/vrd", crop_size: int = 32, batch_size: int = 64, val_fraction: float = 0.1,
                 seed: int = 0, num_workers: int = 0, images_per_batch: int = 8) -> None:
        super().__init__()
        if not 0 <= val_fraction < 1:
            raise ValueError(f"val_fraction must lie in [0, 1), got {val_fraction}.")
        self.save_hyperparameters()
        self.splits: dict[str, RelationshipDataset] = {}
        self.object_names, self.predicate_names = [], []

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        hp, root = self.hparams, Path(self.hparams.root)
        self.object_names = [str(n) for n in load_json(root / "objects.json")]
        self.predicate_names = [str(n) for n in load_json(root / "predicates.json")]
        sizes, paths, train = read_vrd(root, "train", self.object_names, self.predicate_names)
        test_sizes, test_paths, test = read_vrd(root, "test", self.object_names, self.predicate_names,
                                                first_id=len(sizes))
        sizes.update(test_sizes)
        paths.update(test_paths)
        train_ids = sorted({r.image_id for r in train})
        order = torch.randperm(len(train_ids), generator=torch.Generator().manual_seed(hp.seed)).tolist()
        val_ids = {train_ids[i] for i in order[:int(hp.val_fraction * len(train_ids))]}
        parts = {"train": [r for r in train if r.image_id not in val_ids],
                 "val": [r for r in train if r.image_id in val_ids], "test": test}
        unseen = {r.triplet for r in test} - {r.triplet for r in parts["train"]}
        self.splits = self._datasets(parts, sizes, paths, unseen)
