"""Registry, bad input and the masking hooks of the GNN strategies (in one process)."""

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.data import Data
from torch_geometric.nn import SAGEConv

import lightning_granndis  # noqa: F401
from lightning_granndis.graph.masking import OneHopMasking, message_passing_layers
from lightning_granndis.graph.one_hop import split_one_hop
from lightning_granndis.graph.validation import GraphValidationError
from lightning_granndis.models.gnn import GNNNodeClassifier
from lightning_granndis.strategies import FullGraphBaselineStrategy, MiniBatchBaselineStrategy, ServerAwareGNNStrategy


@pytest.mark.parametrize("name, cls, mode", [
    ("granndis", ServerAwareGNNStrategy, "auto"), ("granndis_flx", ServerAwareGNNStrategy, "flx"),
    ("granndis_cob", ServerAwareGNNStrategy, "cob"), ("granndis_eas", ServerAwareGNNStrategy, "eas"),
    ("gnn_fb_base", FullGraphBaselineStrategy, "full"), ("gnn_mb_base", MiniBatchBaselineStrategy, "minibatch"),
])
def test_registry(name, cls, mode):
    strategy = pl.Trainer(strategy=name, devices=1, accelerator="cpu", logger=False).strategy
    assert isinstance(strategy, cls) and strategy.mode == mode


def test_world_size_must_split_into_servers():
    with pytest.raises(ValueError, match="servers"):
        pl.Trainer(strategy=ServerAwareGNNStrategy(servers=3), devices=4, accelerator="cpu", logger=False)


@pytest.mark.parametrize("kwargs, match", [
    ({"mode": "fast"}, "unknown mode 'fast'"), ({"halo_bits": 3}, "halo_bits must be 2, 4 or 8"),
    ({"eas_sampling": "random"}, "eas_sampling"), ({"hops": 0}, "hops must be at least 1"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ServerAwareGNNStrategy(**kwargs)


def fit(model, datamodule, strategy, **kw):
    trainer = pl.Trainer(strategy=strategy, devices=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, **{"max_epochs": 1, **kw})
    trainer.fit(model, datamodule=datamodule)
    return trainer


class NoMessagePassing(pl.LightningModule):
    def __init__(self, features, classes):
        super().__init__()
        self.lin = nn.Linear(features, classes)

    def forward(self, x, edge_index):
        return self.lin(x)

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self(batch.x, batch.edge_index)[batch.train_mask], batch.y[batch.train_mask])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_model_without_message_passing_is_refused(tiny):
    with pytest.raises(ValueError, match="no torch_geometric MessagePassing layer"):
        fit(NoMessagePassing(tiny.num_features, tiny.num_classes), tiny, ServerAwareGNNStrategy(mode="flx"))


def test_graph_too_big_to_preload_suggests_eas_or_cob(tiny):
    model = GNNNodeClassifier(tiny.num_features, tiny.num_classes)
    with pytest.raises(ValueError, match="mode='eas'.*mode='cob'"):
        fit(model, tiny, ServerAwareGNNStrategy(mode="flx", memory_budget_mb=0.01))


class GraphData(pl.LightningDataModule):
    def __init__(self, data):
        super().__init__()
        self.data = data

    def train_dataloader(self):
        return torch.utils.data.DataLoader([self.data], batch_size=None, collate_fn=lambda d: d)


def test_nan_features_are_refused(tiny):
    data = tiny.data.clone()
    data.x[5, 2] = float("nan")
    with pytest.raises(GraphValidationError, match="NaN"):
        fit(GNNNodeClassifier(tiny.num_features, tiny.num_classes), GraphData(data), ServerAwareGNNStrategy(mode="flx"),
            limit_val_batches=0)


def test_single_process_flx_trains_and_reports_exact_accuracy(tiny):
    pl.seed_everything(0)
    model = GNNNodeClassifier(tiny.num_features, tiny.num_classes, hidden=16)
    strategy = ServerAwareGNNStrategy(mode="flx")
    trainer = fit(model, tiny, strategy, max_epochs=20, num_sanity_val_steps=0)
    acc = trainer.callback_metrics["val_acc"].item()
    # the same model evaluated directly on the whole graph gives the same (OGB) accuracy
    model.eval()
    with torch.no_grad():
        pred = model(tiny.data.x, tiny.data.edge_index).argmax(-1)
    assert acc == pytest.approx(tiny.evaluate(pred, "val"), abs=1e-6)
    assert acc > 0.3


def test_hooks_pass_through_when_inactive_and_check_input():
    torch.manual_seed(0)
    model = nn.ModuleDict({"a": SAGEConv(4, 4), "b": nn.Sequential(nn.ReLU(), SAGEConv(4, 2))})
    assert [type(m).__name__ for m in message_passing_layers(model)] == ["SAGEConv", "SAGEConv"]
    x, ei = torch.randn(6, 4), torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    before = model["a"](x, ei)
    masking = OneHopMasking(model, exchange=lambda rows, g: rows[:0])
    assert torch.equal(model["a"](x, ei), before)
    graph = split_one_hop(ei, torch.arange(6), torch.zeros(6, dtype=torch.long), 1)[0]
    masking.activate(graph)
    assert torch.allclose(model["a"](x, graph.edge_index), before)
    with pytest.raises(ValueError, match="must receive the rank's vertex features as one tensor of 6 rows"):
        model["a"](x[:3], graph.edge_index)
    masking.remove()
    with pytest.raises(ValueError, match="no torch_geometric MessagePassing"):
        message_passing_layers(nn.Linear(2, 2))


@pytest.mark.parametrize("kwargs, match", [
    ({"fanout": 0}, "fanout entries must be -1"), ({"fanout": [15, 0, 5]}, r"got 0 in \[15, 0, 5\]"),
    ({"fanout": "15"}, "fanout must be an int or a non-empty list"), ({"eas_fanout": [-2]}, "eas_fanout entries"),
    ({"batch_size": 0}, "batch_size must be a positive int"), ({"iterations": 0}, "iterations must be"),
    ({"cob_sampling": "saint"}, "cob_sampling"),
])
def test_bad_sampling_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ServerAwareGNNStrategy(**kwargs)
    if "cob_sampling" not in kwargs and "eas_fanout" not in kwargs:
        with pytest.raises(ValueError, match=match):
            MiniBatchBaselineStrategy(**kwargs)


def test_bad_sampling_settings_are_refused_on_every_rank_before_a_step(tmp_path, tiny):
    import json

    from helpers import torchrun

    torchrun("gnn_bad_settings.py", 4, str(tmp_path), str(tiny.root), timeout=400)
    expected = {
        "mb_fanout_length": r"fanout=\[15, 10\] has 2 entries but the model's 3 message-passing layers number 3",
        "cob_fanout_length": r"fanout=\[15, 10, 5, 5\] has 4 entries but the model's 3 message-passing layers",
        "eas_fanout_length": r"eas_fanout=\[15, 10\] has 2 entries but eas_hops=1 expansion hops number 1",
        "mb_drop_last_empty": r"drop_last=True leaves no full batch of this graph's [\d,]+ training seeds",
        "cob_over_budget": r"MemoryError: granndis: training in mode='cob' would need ~[\d,]+ MB per rank \(process .*"
                           r"on rank \d, but the budget is 50 MB per rank.*lower batch_size or fanout",
        "mb_over_budget": r"MemoryError: gnn_mb_base: training in mode='minibatch' would need ~[\d,]+ MB per rank",
    }
    import re

    for name, pattern in expected.items():
        for rank in range(4):
            record = json.loads((tmp_path / f"{name}.rank{rank}.json").read_text())
            assert record["steps"] == 0, (name, rank)
            assert record["error"] and re.search(pattern, record["error"]), (name, rank, record["error"])
