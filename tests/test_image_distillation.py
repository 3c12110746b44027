"""Models and data for blockwise distillation: torchvision teachers cut into blocks, students from
shapes, teacher weights, the digits default and CIFAR-10's official files."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from torch import nn

from lightning_granndis.datamodules import ImageDataModule
from lightning_granndis.distill import check_blocks
from lightning_granndis.models import ImageBlockwiseDistillation, ImageClassifier
from lightning_granndis.models.small_vision import cut_into_blocks, small_image_net


@pytest.mark.parametrize("arch, num_blocks", [("mobilenet_v2", 6), ("mobilenet_v2", 3), ("mobilenet_v2", 9),
                                              ("resnet18", 6), ("resnet18", 4)])
def test_blocks_compose_to_the_network(arch, num_blocks):
    torch.manual_seed(0)
    net = small_image_net(arch, num_classes=10, in_channels=3, width_mult=1.0 if arch == "resnet18" else 0.5).eval()
    blocks = cut_into_blocks(net, arch, num_blocks)
    assert len(blocks) == num_blocks
    x = torch.randn(2, 3, 32, 32)
    h = x
    for b in blocks:
        h = b(h)
    assert torch.allclose(h, net(x), atol=1e-5)
    assert sum(p.numel() for b in blocks for p in b.parameters()) == sum(p.numel() for p in net.parameters())


def test_students_reproduce_teacher_block_shapes_with_far_fewer_parameters():
    model = ImageBlockwiseDistillation(width_mult=0.5, in_channels=3, image_size=32)
    check_blocks(list(model.teacher), list(model.student), model.example_input_array)  # raises on any mismatch
    teacher = sum(p.numel() for p in model.teacher.parameters())
    student = sum(p.numel() for p in model.student.parameters())
    assert student < teacher / 4
    assert not any(p.requires_grad for p in model.teacher.parameters())


def test_teacher_weights_are_loaded_and_wrong_ones_refused(tmp_path):
    clf = ImageClassifier(width_mult=0.5, export_path=str(tmp_path / "teacher.pt"))
    torch.save(clf.net.state_dict(), tmp_path / "teacher.pt")
    model = ImageBlockwiseDistillation(teacher_weights=str(tmp_path / "teacher.pt"), width_mult=0.5)
    x = torch.randn(2, 1, 16, 16)
    h = x
    for b in model.teacher:
        h = b(h)
    assert torch.allclose(h, clf.net.eval()(x), atol=1e-5)
    with pytest.raises(FileNotFoundError, match="train the teacher first"):
        ImageBlockwiseDistillation(teacher_weights=str(tmp_path / "missing.pt"))
    with pytest.raises(ValueError, match="do not fit a mobilenet_v2"):
        ImageBlockwiseDistillation(teacher_weights=str(tmp_path / "teacher.pt"), width_mult=1.0)


def test_digits_default_is_a_deterministic_image_task():
    a, b = ImageDataModule(image_size=16), ImageDataModule(image_size=16)
    a.setup(), b.setup()
    x, y = next(iter(a.val_dataloader()))
    assert x.shape == (64, 1, 16, 16) and y.max() <= 9
    assert torch.equal(x, next(iter(b.val_dataloader()))[0])
    sizes = {k: len(v) for k, v in a.splits.items()}
    assert sum(sizes.values()) == 1797 and sizes["val"] == sizes["test"] == 269


def _write_cifar(root, per_batch=6, corrupt=False):
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        entry = {"batch_label": name, "data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
                 "labels": [int(v) for v in rng.integers(0, 10, per_batch)], "filenames": [f"{i}.png" for i in range(per_batch)]}
        if corrupt and name == "data_batch_3":
            entry["labels"] = entry["labels"][:-1]
        with open(folder / name, "wb") as f:
            pickle.dump(entry, f)
    return folder


def test_cifar10_is_read_from_its_official_python_files(tmp_path):
    folder = _write_cifar(tmp_path)
    dm = ImageDataModule(dataset="cifar10", root=str(tmp_path), image_size=32, val_fraction=0.2, batch_size=4)
    dm.setup()
    assert len(dm.splits["train"]) + len(dm.splits["val"]) == 30 and len(dm.splits["test"]) == 6
    x, y = dm.splits["test"][0]
    with open(folder / "test_batch", "rb") as f:
        raw = pickle.load(f, encoding="latin1")
    pixel = raw["data"][0].reshape(3, 32, 32)[1, 0, 0] / 255
    assert x.shape == (3, 32, 32) and int(y) == raw["labels"][0]
    assert float(x[1, 0, 0]) == pytest.approx((pixel - 0.4822) / 0.2435, abs=1e-5)


def test_cifar10_problems_name_the_file_and_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="download=True"):
        ImageDataModule(dataset="cifar10", root=str(tmp_path), image_size=32).setup()
    _write_cifar(tmp_path / "bad", corrupt=True)
    with pytest.raises(ValueError, match="data_batch_3: 6 images but 5 labels"):
        ImageDataModule(dataset="cifar10", root=str(tmp_path / "bad"), image_size=32).setup()
    with pytest.raises(ValueError, match="image_size: 32"):
        ImageDataModule(dataset="cifar10", image_size=16)


def test_blockwise_distillation_of_a_trained_teacher_learns_in_one_process(tmp_path):
    import lightning.pytorch as pl

    pl.seed_everything(0)
    dm = ImageDataModule(batch_size=64)
    teacher = ImageClassifier(width_mult=0.25, export_path=str(tmp_path / "t.pt"))
    pl.Trainer(max_epochs=5, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False).fit(teacher, dm)
    model = ImageBlockwiseDistillation(teacher_weights=str(tmp_path / "t.pt"), width_mult=0.25, lr=0.01)
    trainer = pl.Trainer(max_epochs=4, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, dm)
    m = trainer.callback_metrics
    assert m["val_teacher_acc"] > 0.8
    assert m["val_student_acc"] > 0.25           # chance is 0.1 (0.46 measured); the student never saw a label
    assert m["train_block0_loss"] < 1.0
    student = model.assemble_student()
    x, y = next(iter(dm.val_dataloader()))
    assert isinstance(student, nn.Sequential) and student(x).shape == (64, 10)
