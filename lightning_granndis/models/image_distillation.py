"""Blockwise distillation of a torchvision small-image teacher into a narrower student."""

from __future__ import annotations

from pathlib import Path

import torch

from lightning_granndis.distill.module import BlockwiseDistillation
from lightning_granndis.models.blockwise_students import students_for
from lightning_granndis.models.small_vision import cut_into_blocks, small_image_net


class ImageBlockwiseDistillation(BlockwiseDistillation):
    """A teacher from :func:`~lightning_granndis.models.small_vision.small_image_net`, cut into
    ``num_blocks`` blocks, distilled block by block into a student of narrower, shallower blocks
    (:func:`~lightning_granndis.models.blockwise_students.students_for`).

    Args:
        teacher_weights: path of the teacher's ``state_dict`` (what ``ImageClassifier(export_path=...)``
            writes; loaded with ``weights_only=True``). ``None`` keeps a random teacher (tests and
            timing only: there is nothing to distil).
        arch, num_classes, in_channels, image_size, width_mult: the teacher, as it was trained.
        num_blocks: blocks to cut the teacher into (default 6, the artifact's).
        expand_ratio: the student's inverted-residual expansion (default 2; the teacher's is 6).
        lr, weight_decay, kd_temperature: as in :class:`~lightning_granndis.distill.BlockwiseDistillation`.
    """

    def __init__(self, teacher_weights: str | None = None, arch: str = "mobilenet_v2", num_classes: int = 10,
                 in_channels: int = 1, image_size: int = 16, width_mult: float = 1.0, num_blocks: int = 6,
                 expand_ratio: int = 2, lr: float = 2e-3, weight_decay: float = 0.0,
                 kd_temperature: float | None = 4.0) -> None:
        super().__init__(lr=lr, weight_decay=weight_decay, kd_temperature=kd_temperature)
        self.save_hyperparameters()
        teacher = small_image_net(arch, num_classes, in_channels, width_mult)
        if teacher_weights is not None:
            path = Path(teacher_weights)
            if not path.exists():
                raise FileNotFoundError(
                    f"teacher weights {path} not found: train the teacher first "
                    "(granndis fit --config recipes/pipe_bd_teacher.yaml writes them), or pass teacher_weights."
                )
            state = torch.load(path, map_location="cpu", weights_only=True)
            try:
                teacher.load_state_dict(state)
            except RuntimeError as err:
                first = str(err).splitlines()[1].strip() if len(str(err).splitlines()) > 1 else str(err)
                raise ValueError(
                    f"teacher weights {path} do not fit a {arch} (width {width_mult}, {in_channels} channels, "
                    f"{num_classes} classes): {first}. Use the architecture settings the teacher was trained with."
                ) from err
        teacher.eval()
        blocks = cut_into_blocks(teacher, arch, num_blocks)
        self.example_input_array = torch.zeros(1, in_channels, image_size, image_size)
        torch.manual_seed(torch.initial_seed())  # students start alike on every rank (rank 0's are broadcast too)
        self.set_blocks(blocks, students_for(blocks, self.example_input_array, expand_ratio))
