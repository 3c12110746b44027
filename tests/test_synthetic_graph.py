"""The embedded default graph: determinism, statistics, OGB layout read by ogb's own loader."""

import numpy as np
import pytest
import torch

from lightning_granndis.datamodules import OGBNodeDataModule
from lightning_granndis.datamodules.synthetic import PRESETS, SyntheticGraphSpec, generate


def test_generation_is_deterministic_by_seed():
    spec = PRESETS["tiny"]
    a, b = generate(spec), generate(spec)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    c = generate(SyntheticGraphSpec(**{**spec.__dict__, "seed": 1}))
    assert not np.array_equal(a["edge"], c["edge"])


def test_degrees_are_heavy_tailed_and_edges_homophilous():
    spec = PRESETS["small"]
    g = generate(spec)
    deg = np.bincount(g["edge"].ravel(), minlength=spec.num_nodes)
    assert deg.max() > 20 * deg.mean()  # a power-law tail, not a Poisson one (max ~ 2x mean)
    assert np.percentile(deg, 99) > 4 * np.median(deg)
    same = (g["y"][g["edge"][:, 0]] == g["y"][g["edge"][:, 1]]).mean()
    assert 0.45 < same < 0.75  # community edges 75 %, diluted by 25 % label noise


def test_loaded_through_ogb_layout_with_splits_shapes_and_evaluator(tiny):
    d, spec = tiny.data, PRESETS["tiny"]
    assert d.x.shape == (spec.num_nodes, spec.num_features) and d.x.dtype == torch.float32
    assert d.y.shape == (spec.num_nodes,) and int(d.y.max()) == spec.num_classes - 1
    assert tiny.num_classes == spec.num_classes
    sizes = [int(m.sum()) for m in (d.train_mask, d.val_mask, d.test_mask)]
    assert sizes == [1080, 360, 560] and sum(sizes) == spec.num_nodes
    assert int((d.train_mask & d.test_mask).sum()) == 0
    # undirected: every edge has its reverse
    fwd = set(map(tuple, d.edge_index.t().tolist()))
    assert all((b, a) in fwd for a, b in list(fwd)[:500])
    assert tiny.evaluate(d.y, "test") == 1.0
    assert tiny.evaluate(torch.zeros_like(d.y), "test") == pytest.approx(float((d.y[d.test_mask] == 0).float().mean()))
    raw = tiny.root / "synthetic_tiny" / "raw"
    assert {p.name for p in raw.iterdir()} >= {"edge.csv.gz", "node-feat.csv.gz", "node-label.csv.gz"}


def test_graphsage_learns_well_above_chance_and_below_perfect(tiny):
    import lightning.pytorch as pl

    from lightning_granndis.models import GNNNodeClassifier

    pl.seed_everything(0)
    model = GNNNodeClassifier(tiny.num_features, tiny.num_classes)
    trainer = pl.Trainer(accelerator="cpu", max_epochs=60, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, datamodule=tiny)
    acc = trainer.test(model, datamodule=tiny, verbose=False)[0]["test_acc"]
    majority = float((tiny.data.y[tiny.data.test_mask] == 0).float().mean())
    assert majority + 0.25 < acc < 0.95


def test_missing_real_dataset_says_where_to_put_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"cannot be downloaded here.*arxiv.zip.*ogbn_arxiv/raw/edge.csv.gz"):
        OGBNodeDataModule("ogbn-arxiv", root=str(tmp_path)).prepare_data()
    with pytest.raises(ValueError, match="Unknown dataset 'ogbn-nope'"):
        OGBNodeDataModule("ogbn-nope", root=str(tmp_path)).prepare_data()
    with pytest.raises(ValueError, match="Unknown synthetic graph"):
        OGBNodeDataModule("synthetic-huge")


def _prepare_and_count(root, queue):
    try:
        dm = OGBNodeDataModule("synthetic-tiny", root=root)
        dm.prepare_data()
        dm.setup()
        queue.put(dm.data.num_nodes)
    except BaseException as error:  # reported to the test, not lost in a child
        queue.put(repr(error))


def test_ranks_preparing_one_fresh_root_at_once_all_get_the_whole_graph(tmp_path):
    """Under torchrun every rank may call prepare_data: one generates and processes, the others
    wait (they once read half-written files: pandas' EmptyDataError)."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    procs = [context.Process(target=_prepare_and_count, args=(str(tmp_path), queue)) for _ in range(4)]
    for p in procs:
        p.start()
    got = [queue.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert got == [PRESETS["tiny"].num_nodes] * 4
