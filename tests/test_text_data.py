"""TextDataModule: the standard-library corpus by default, byte and char level, deterministic split."""

import pytest
import torch

from lightning_granndis.datamodules.text import TextDataModule, stdlib_sources


def test_default_corpus_is_the_standard_library():
    files = stdlib_sources()
    assert len(files) > 100 and any(f.name == "os.py" for f in files)
    dm = TextDataModule(max_files=20, block_size=64, batch_size=4)
    dm.setup()
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (4, 64) and x.dtype == torch.long and dm.vocab_size == 256
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the next tokens
    assert "def " in dm.decode(dm.train_ids[:5000]) or "import" in dm.decode(dm.train_ids[:5000])


def test_char_level_split_is_deterministic_and_disjoint(tmp_path):
    (tmp_path / "a.txt").write_text("hello world " * 200)
    (tmp_path / "b.md").write_text("lightning granndis " * 100)
    first, second = (TextDataModule([str(tmp_path)], level="char", block_size=16, val_fraction=0.2) for _ in range(2))
    first.setup()
    second.setup()
    assert torch.equal(first.val_ids, second.val_ids) and first.vocab == second.vocab
    total = len("hello world " * 200) + 1 + len("lightning granndis " * 100)
    assert first.train_ids.numel() + first.val_ids.numel() == total
    assert first.decode(first.train_ids[:11]) == "hello world"


def test_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither a file nor a directory"):
        TextDataModule([str(tmp_path / "missing")]).setup()
    (tmp_path / "tiny.txt").write_text("abc")
    with pytest.raises(ValueError, match="too small for block_size"):
        TextDataModule([str(tmp_path / "tiny.txt")], block_size=64).setup()
    with pytest.raises(ValueError, match="level must be"):
        TextDataModule(level="word")
