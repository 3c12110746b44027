"""After testing, a PNG of a few test images with their top predicted relationships."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override


class RelationshipPredictionsPlot(Callback):
    """Draws the first ``images`` test images with their ``per_image`` most confident predicted
    relationships (:func:`~lightning_granndis.vrd.drawing.draw_predictions`) into
    ``<log dir>/relationships.png`` (or ``path``), and logs it to wandb when a WandbLogger is used.

    Args:
        images: how many test images (default 6).
        per_image: predictions drawn per image (default 3).
        path: where the PNG goes (default: the trainer's log dir).
    """

    def __init__(self, images: int = 6, per_image: int = 3, path: str | None = None) -> None:
        self.images, self.per_image, self.path = images, per_image, path
        self.written: Path | None = None

    @override
    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        log_dir = trainer.log_dir  # a collective under DDP: every rank asks
        if not trainer.is_global_zero:
            return
        from lightning_granndis.datamodules.visual_genome import ImageGroups
        from lightning_granndis.vrd.drawing import draw_predictions

        dm = trainer.datamodule
        groups = ImageGroups(dm.splits["test"])
        chosen = [g for g in (groups[i] for i in range(min(self.images, len(groups)))) if g]
        path = Path(self.path) if self.path else Path(log_dir or trainer.default_root_dir) / "relationships.png"
        self.written = draw_predictions(pl_module, chosen, dm.object_names, dm.predicate_names, path, self.per_image)
        print(f"predictions drawn: {self.written}", flush=True)
        for logger in trainer.loggers:
            if type(logger).__name__ == "WandbLogger":
                logger.log_image(key="test_relationships", images=[str(self.written)])
