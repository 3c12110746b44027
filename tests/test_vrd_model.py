"""The VRD model: its variants, word vectors, and a short training run on the default scenes."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch

from lightning_granndis.datamodules import VisualGenomeDataModule
from lightning_granndis.models.vrd import VARIANTS, VisualRelationshipModel, load_word_vectors


def _batch(n=5, objects=6, size=32):
    g = torch.Generator().manual_seed(0)
    return {"crop": torch.randn(n, 3, size, size, generator=g), "spatial": torch.rand(n, 7, generator=g),
            "subject": torch.randint(0, objects, (n,), generator=g), "object": torch.randint(0, objects, (n,), generator=g)}


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_scores_every_predicate_from_its_own_inputs(variant):
    torch.manual_seed(0)
    model = VisualRelationshipModel(6, 7, variant=variant, width_mult=0.25).eval()
    batch = _batch()
    out = model(batch)
    assert out.shape == (5, 7)
    # the crop matters exactly for the visual variants, the words for the word variants
    changed = dict(batch, crop=torch.randn_like(batch["crop"]))
    assert (not torch.equal(model(changed), out)) == ("V" in variant)
    swapped = dict(batch, subject=(batch["subject"] + 1) % 6)
    assert (not torch.equal(model(swapped), out)) == (variant in ("L", "LS", "SVW", "LS+SVW"))


def test_ls_svw_is_the_product_of_its_two_modules():
    torch.manual_seed(0)
    model = VisualRelationshipModel(6, 7, variant="LS+SVW", width_mult=0.25).eval()
    b = _batch()
    pair = torch.cat([model.words(b["subject"]), model.words(b["object"])], -1)
    ls = model.language(torch.cat([b["spatial"], pair], -1))
    svw = model.visual(torch.cat([b["spatial"], model.cnn(b["crop"]), pair], -1))
    assert torch.allclose(model(b), ls * svw)


def test_word_vectors_come_from_a_text_file(tmp_path):
    path = tmp_path / "vectors.txt"
    path.write_text("red 1 0 0\nbox 0 1 0\nball 0 0 1\n")
    vectors = load_word_vectors(path, ["box", "red ball", "unknown"], 3)
    assert vectors[0].tolist() == [0, 1, 0] and vectors[1].tolist() == [0.5, 0, 0.5]
    model = VisualRelationshipModel(3, 4, variant="L", word_dim=3, word_vectors=str(path),
                                    object_names=["box", "red ball", "unknown"])
    assert torch.equal(model.words.weight.data[:2], vectors[:2])
    with pytest.raises(ValueError, match="expected word_dim=4"):
        load_word_vectors(path, ["box"], 4)
    with pytest.raises(ValueError, match="unknown variant"):
        VisualRelationshipModel(3, 4, variant="LSV")


def test_a_short_run_on_the_default_scenes_beats_chance_clearly(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pl.seed_everything(0)
    dm = VisualGenomeDataModule(num_images=200, batch_size=32)
    dm.setup()
    model = VisualRelationshipModel(dm.num_object_classes, dm.num_predicate_classes, variant="LS", lr=3e-3)
    trainer = pl.Trainer(max_epochs=4, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, dm)
    result = trainer.test(model, dm, verbose=False)[0]
    chance = 1 / dm.num_predicate_classes  # one guess per pair: R@50 with k=1 is top-1 accuracy here
    assert result["test_R@50_k1"] > 2.5 * chance
    assert result["test_R@50_kall"] >= result["test_R@50_k1"]


def test_predictions_are_drawn_after_testing(tmp_path, monkeypatch):
    from lightning_granndis.callbacks import RelationshipPredictionsPlot

    monkeypatch.chdir(tmp_path)
    dm = VisualGenomeDataModule(num_images=40, batch_size=16)
    dm.setup()
    model = VisualRelationshipModel(dm.num_object_classes, dm.num_predicate_classes, variant="LS")
    plot = RelationshipPredictionsPlot(images=4, path=str(tmp_path / "rel.png"))
    pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, callbacks=[plot]).test(model, dm, verbose=False)
    assert plot.written == tmp_path / "rel.png" and plot.written.stat().st_size > 10_000


def test_a_model_built_for_other_vocabularies_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dm = VisualGenomeDataModule(num_images=20)
    dm.setup()
    model = VisualRelationshipModel(num_objects=100, num_predicates=70, variant="L")
    with pytest.raises(ValueError, match=f"built for 100 object classes but the data has {dm.num_object_classes}"):
        pl.Trainer(accelerator="cpu", logger=False, max_epochs=1).fit(model, dm)
    with pytest.raises(ValueError, match="give both num_objects and num_predicates, or neither"):
        VisualRelationshipModel(num_objects=5)


def test_a_model_without_sizes_takes_the_datas_and_its_checkpoint_rebuilds_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dm = VisualGenomeDataModule(num_images=30, batch_size=16)
    model = VisualRelationshipModel(variant="LS+SVW", width_mult=0.25)
    assert model.words is None
    trainer = pl.Trainer(accelerator="cpu", logger=False, max_epochs=1, limit_train_batches=2, limit_val_batches=1,
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    trainer.fit(model, dm)
    assert model.words.num_embeddings == dm.num_object_classes and model.language.out_features == len(dm.predicate_names)
    trainer.save_checkpoint(tmp_path / "vrd.ckpt")
    again = VisualRelationshipModel.load_from_checkpoint(tmp_path / "vrd.ckpt", weights_only=True).eval()
    batch = _batch(objects=dm.num_object_classes)
    assert torch.equal(again(batch), model.eval()(batch))


def test_recipe_trains_under_ddp_and_the_test_run_draws_predictions(tmp_path):
    import json

    from helpers import REPO, run

    granndis = str(REPO / ".venv" / "bin" / "granndis")
    quick = ["--trainer.max_epochs=2", "--trainer.logger=false", "--trainer.enable_progress_bar=false",
             "--data.init_args.num_images=80", "--model.init_args.width_mult=0.25"]
    recipe = str(REPO / "recipes" / "vrd_ls_svw.yaml")
    run([granndis, "fit", "--config", recipe, *quick], cwd=tmp_path, timeout=600)
    summary = json.loads((tmp_path / "runs" / "vrd_ls_svw" / "summary.json").read_text())
    assert summary["metrics"]["val_R@50_k1"] > 0 and summary["steps"] > 0
    ckpt = next((tmp_path / "runs" / "vrd_ls_svw").rglob("*.ckpt"))
    proc = run([granndis, "test", "--config", recipe, *quick, f"--ckpt_path={ckpt}"], cwd=tmp_path, timeout=600)
    assert "test_R@50_k1" in proc.stdout and "predictions drawn:" in proc.stdout
    assert next((tmp_path / "runs" / "vrd_ls_svw").rglob("relationships.png")).stat().st_size > 10_000
