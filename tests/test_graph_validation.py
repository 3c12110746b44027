import pytest
import torch
from torch_geometric.data import Data

from lightning_granndis.graph import GraphValidationError, validate_graph


def good():
    n = 6
    return Data(
        x=torch.randn(n, 3), edge_index=torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]]), y=torch.tensor([0, 1, 2, 0, 1, 2]),
        train_mask=torch.tensor([1, 1, 0, 0, 0, 0], dtype=torch.bool), val_mask=torch.tensor([0, 0, 1, 1, 0, 0], dtype=torch.bool),
        test_mask=torch.tensor([0, 0, 0, 0, 1, 1], dtype=torch.bool), num_nodes=n,
    )


def test_good_graph_passes():
    validate_graph(good(), num_classes=3)


@pytest.mark.parametrize("mutate,message", [
    (lambda d: setattr(d, "edge_index", d.edge_index.t()), r"shape \[2, num_edges\]"),
    (lambda d: setattr(d, "edge_index", d.edge_index.float()), "integer vertex ids"),
    (lambda d: setattr(d, "edge_index", torch.tensor([[0, 9], [1, 2]])), r"vertex 9, outside \[0, 6\)"),
    (lambda d: setattr(d, "edge_index", torch.tensor([[0, -1], [1, 2]])), r"vertex -1"),
    (lambda d: d.x.__setitem__((2, 1), float("nan")), "NaN or inf in 1 rows .first: vertex 2"),
    (lambda d: d.x.__setitem__((4, 0), float("inf")), "NaN or inf"),
    (lambda d: setattr(d, "y", torch.tensor([0, 1, 7, 0, 1, 2])), "class 7 but num_classes=3"),
    (lambda d: setattr(d, "y", torch.tensor([0, -1, 2, 0, 1, 2])), "labels y hold -1"),
    (lambda d: setattr(d, "train_mask", torch.ones(5, dtype=torch.bool)), "train_mask must be a bool tensor of length"),
    (lambda d: d.val_mask.__setitem__(0, True), "overlap on 1 vertices .first: 0"),
])
def test_each_problem_is_named(mutate, message):
    d = good()
    mutate(d)
    with pytest.raises(GraphValidationError, match=message):
        validate_graph(d, num_classes=3, name="g")
