import pytest
import torch

from lightning_granndis.strategies import SafeCheckpointIO


class Opaque:  # an arbitrary Python object: a weights-only load must refuse it
    pass


def test_roundtrip_and_weights_only_refusal(tmp_path):
    io = SafeCheckpointIO()
    state = {"state_dict": {"w": torch.arange(3.0)}, "epoch": 2}
    io.save_checkpoint(state, tmp_path / "ok.ckpt")
    loaded = io.load_checkpoint(tmp_path / "ok.ckpt")
    assert torch.equal(loaded["state_dict"]["w"], torch.arange(3.0)) and loaded["epoch"] == 2
    torch.save({"obj": Opaque()}, tmp_path / "bad.ckpt")
    with pytest.raises(RuntimeError, match="refuses \\(it holds test_checkpoint_io.Opaque\\).*weights_only=False"):
        io.load_checkpoint(tmp_path / "bad.ckpt")


def test_failed_save_leaves_the_previous_checkpoint_intact(tmp_path):
    io = SafeCheckpointIO()
    io.save_checkpoint({"epoch": 1, "w": torch.ones(2)}, tmp_path / "last.ckpt")
    with pytest.raises(Exception):
        io.save_checkpoint({"epoch": 2, "bad": lambda: None}, tmp_path / "last.ckpt")  # unpicklable
    assert io.load_checkpoint(tmp_path / "last.ckpt")["epoch"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]
