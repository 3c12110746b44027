import pytest
import torch

from lightning_granndis.strategies import SafeCheckpointIO


class Opaque:  # an arbitrary Python object: a weights-only load must refuse it
    pass


def test_roundtrip_and_weights_only_refusal(tmp_path):
    io = SafeCheckpointIO()
    state = {"state_dict": {"w": torch.arange(3.0)}, "epoch": 2}
    io.save_checkpoint(state, tmp_path / "ok.ckpt")
    assert not list(tmp_path.glob("*.tmp*"))
    loaded = io.load_checkpoint(tmp_path / "ok.ckpt")
    assert torch.equal(loaded["state_dict"]["w"], torch.arange(3.0)) and loaded["epoch"] == 2
    torch.save({"obj": Opaque()}, tmp_path / "bad.ckpt")
    with pytest.raises(RuntimeError, match="weights-only load refuses.*weights_only=False"):
        io.load_checkpoint(tmp_path / "bad.ckpt")
