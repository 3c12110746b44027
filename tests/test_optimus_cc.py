"""CompressedPipelineStrategy in real gloo runs (4 and 8 ranks) against one-device training of the
same GPT on the same batches."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

from helpers import SCRIPTS, run, torchrun
from lightning_granndis.models import GPT
from lightning_granndis.pipeline import consolidate_checkpoint

#: Parameters after 3 AdamW steps (lr 1e-2) may differ by float summation order, which Adam's
#: normalisation amplifies near zero gradients; the loss is compared tighter.
PARAM_TOL, LOSS_TOL = 5e-5, 1e-5

D2 = {"stages": 2, "replicas": 2, "batch": 8, "steps": 3}
CKPT = {"stages": 2, "replicas": 2, "batch": 8, "model": {"lr_schedule": "constant", "dropout": 0.1},
        "strategy": {"compress_backward": True, "rank": 4, "dp_compression": True, "dp_rank": 2}}
EXACT = {
    "gpipe_s2_dp2": {**D2, "schedule": "gpipe", "validate": True},
    "1f1b_s2_dp2_accumulate": {**D2, "batch": 7, "micro": 3, "accumulate": 2, "steps": 4},
    "gpipe_s4": {"stages": 4, "schedule": "gpipe", "batch": 8, "steps": 3},
    "1f1b_s4_clip": {"stages": 4, "batch": 8, "steps": 3, "clip": 0.05},
    "1f1b_s2_dp2_fe": {**D2, "strategy": {"fused_embedding": True}},
}
APPROX = {
    "1f1b_s2_dp2_sc": {**D2, "strategy": {"dp_compression": True, "dp_rank": 2, "selective_stages": 1}},
    "1f1b_s4_cb_inter": {"stages": 4, "batch": 8, "steps": 3,
                         "strategy": {"compress_backward": True, "rank": 4, "servers": 2, "inter_server_only": True}},
}


def configs(out):
    cfgs = [{**c, "tag": t} for t, c in {**EXACT, **APPROX}.items()]
    # 6 steps per epoch; Lightning resumes a plain DataLoader at an epoch boundary, so the run
    # saves at the end of epoch 0 (step 6) and step 7 is the first resumed step.
    cfgs += [
        # the split pinned: a profiled one follows the machine's load, and which stage (so which
        # generator) runs a block's dropout follows the split (CI once split run b differently)
        {**D2, "tag": "dropout_a", "model": {"dropout": 0.1}, "steps": 1, "strategy": {"balance": [2, 2]}},
        {**D2, "tag": "dropout_b", "model": {"dropout": 0.1}, "steps": 1, "strategy": {"balance": [2, 2]}},
        # a manual split the profiler would not choose: the resumed run (profiled split) must keep it
        {**CKPT, "tag": "ckpt_full", "steps": 7, "ckpt_every": 1, "ckpt_dir": str(out / "ckpt"),
         "save": str(out / "full.ckpt"), "strategy": {**CKPT["strategy"], "balance": [3, 1]}},
        {**CKPT, "tag": "ckpt_resumed", "steps": 7, "resume": str(out / "ckpt" / "step=6.ckpt")},
    ]
    return cfgs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipeline")
    torchrun("pipeline_train.py", 4, str(out), json.dumps(configs(out)), timeout=900)
    refs = [{**c, "tag": f"ref_{t}"} for t, c in {**EXACT, **APPROX}.items()]
    run([sys.executable, str(SCRIPTS / "pipeline_train.py"), str(out), json.dumps(refs)])

    def load(tag, world=4):
        return [json.loads((out / f"{tag}_rank{r}.json").read_text()) for r in range(world)]

    return {"load": load, "ref": lambda tag: load(f"ref_{tag}", 1)[0], "out": out}


def max_param_error(ranks, ref):
    err = 0.0
    for res in ranks:
        for name, value in res["params"].items():
            err = max(err, float(np.abs(np.asarray(value) - np.asarray(ref["params"][name])).max()))
    return err


def replica_mean_losses(ranks):
    """The global batch's loss per step: the mean of the replicas' losses (every stage reports its
    replica's)."""
    per_replica = {}
    for res in ranks:
        per_replica.setdefault(res["replica"], res["losses"])
        assert res["losses"] == per_replica[res["replica"]]  # every stage of a replica agrees
    return np.mean(list(per_replica.values()), axis=0)


@pytest.mark.parametrize("tag", list(EXACT))
def test_uncompressed_pipeline_equals_single_device_training(runs, tag):
    ranks, ref = runs["load"](tag), runs["ref"](tag)
    np.testing.assert_allclose(replica_mean_losses(ranks), ref["losses"], atol=LOSS_TOL)
    assert max_param_error(ranks, ref) < PARAM_TOL
    # Every parameter of the model lives on some stage, and only there.
    names = set().union(*(r["params"] for r in ranks))
    assert names == set(ref["params"])


def test_validation_runs_through_the_pipeline(runs):
    ranks, ref = runs["load"]("gpipe_s2_dp2"), runs["ref"]("gpipe_s2_dp2")
    for res in ranks:
        assert res["val_loss"] == pytest.approx(ref["val_loss"], abs=1e-5)


def test_fused_embedding_sync_is_one_collective_and_leaves_the_embedding_out_of_the_dp_sync(runs):
    plain, fused = runs["load"]("gpipe_s2_dp2"), runs["load"]("1f1b_s2_dp2_fe")
    vocab, hidden, steps = 64, 32, 3
    embedding = vocab * hidden * 4
    for a, b in zip(plain, fused):
        # Not fused: the embedding rides in the DP all-reduce and then an embedding all-reduce.
        # Fused: the DP all-reduce leaves it out; one all-reduce over 4 holders carries it.
        assert a["bytes"]["intra/grad_sync"] - b["bytes"]["intra/grad_sync"] == steps * embedding
        assert b["bytes"]["intra/embedding_sync"] > 0


def test_selective_compression_compresses_only_the_first_stages(runs):
    plain, sc = runs["load"]("gpipe_s2_dp2"), runs["load"]("1f1b_s2_dp2_sc")
    for a, b in zip(plain, sc):
        if b["stage"] == 0:
            assert b["bytes"]["intra/grad_sync"] < 0.5 * a["bytes"]["intra/grad_sync"]
        else:
            assert b["bytes"]["intra/grad_sync"] == a["bytes"]["intra/grad_sync"]
    ref = runs["ref"]("1f1b_s2_dp2_sc")
    np.testing.assert_allclose(replica_mean_losses(sc), ref["losses"], rtol=1e-2)


def test_inter_server_only_compresses_just_the_boundary_that_crosses_servers(runs):
    plain, cb = runs["load"]("1f1b_s4_clip"), runs["load"]("1f1b_s4_cb_inter")
    # servers=2: ranks {0,1} | {2,3}; only boundary 1 -> 2 crosses, and stage 2 sends over it.
    for a, b in zip(plain, cb):
        sent_a = a["bytes"]["intra/activation_grad"] + a["bytes"]["inter/activation_grad"]
        sent_b = b["bytes"]["intra/activation_grad"] + b["bytes"]["inter/activation_grad"]
        if b["stage"] == 2:
            # 2 x 16 rows x 32 wide per micro-batch -> P [32, 4] + Q [32, 4]: 4x fewer bytes both ways
            assert b["bytes"]["inter/activation_grad"] > 0
            assert sent_b <= sent_a / 2
        elif b["stage"] in (0, 3):
            assert sent_b == sent_a
    ref = runs["ref"]("1f1b_s4_cb_inter")
    np.testing.assert_allclose(replica_mean_losses(cb), ref["losses"], rtol=1e-2)


def test_resume_from_per_stage_shards_is_exact(runs):
    """Weights, AdamW moments, the LEP residual and PowerSGD's warm-start Q and errors all come back:
    the first step after resuming is bit-identical to the uninterrupted run's (with dropout: each
    rank's generator state travels in the checkpoint)."""
    shards = runs["out"] / "ckpt"
    assert (shards / "step=6.ckpt").exists() and (shards / "step=6.ckpt.stage1").exists()
    full, resumed = runs["load"]("ckpt_full"), runs["load"]("ckpt_resumed")
    assert resumed[0]["losses"] == full[0]["losses"][6:]
    for a, b in zip(full, resumed):
        assert a["params"].keys() == b["params"].keys()
        for name in a["params"]:
            np.testing.assert_array_equal(np.asarray(a["params"][name]), np.asarray(b["params"][name]))


def test_every_stage_and_replica_draws_its_own_reproducible_randomness(runs):
    """Seeded alike, the 2 stages x 2 replicas start training from four different generator
    states (so their dropout masks differ), the same ones on a second run."""
    first, second = runs["load"]("dropout_a"), runs["load"]("dropout_b")
    states = [r["rng_at_start"] for r in first]
    assert len(set(states)) == 4
    assert states == [r["rng_at_start"] for r in second]
    assert first[0]["losses"] == second[0]["losses"]


def test_consolidated_export_loads_into_one_device_model(runs):
    out = runs["out"]
    state = consolidate_checkpoint(out / "full.ckpt", output=out / "whole.ckpt")
    model = GPT(vocab_size=64, block_size=16, hidden=32, layers=2, heads=2)
    model.load_state_dict(state, strict=True)
    assert model.blocks[0].tok.weight is model.blocks[-1].weight  # still tied
    for res in runs["load"]("ckpt_full"):
        for name, value in res["params"].items():
            np.testing.assert_array_equal(model.state_dict()[name].numpy(), np.asarray(value, dtype=np.float32))
    again = torch.load(out / "whole.ckpt", weights_only=True)
    assert again["pipeline"]["consolidated"] and set(again["state_dict"]) == set(state)


# ---------------------------------------------------------------------- 8 ranks: 4 stages x 2 replicas
def test_1f1b_four_stages_two_replicas_equals_single_device_training(tmp_path):
    cfg = {"stages": 4, "replicas": 2, "batch": 8, "steps": 3, "schedule": "1f1b"}
    torchrun("pipeline_train.py", 8, str(tmp_path), json.dumps({**cfg, "tag": "s4_dp2"}), timeout=600)
    run([sys.executable, str(SCRIPTS / "pipeline_train.py"), str(tmp_path), json.dumps({**cfg, "tag": "ref"})])
    ranks = [json.loads((tmp_path / f"s4_dp2_rank{r}.json").read_text()) for r in range(8)]
    ref = json.loads((tmp_path / "ref_rank0.json").read_text())
    assert sorted((r["replica"], r["stage"]) for r in ranks) == [(d, s) for d in range(2) for s in range(4)]
    np.testing.assert_allclose(replica_mean_losses(ranks), ref["losses"], atol=LOSS_TOL)
    assert max_param_error(ranks, ref) < PARAM_TOL


# ---------------------------------------------------------------------- convergence on the default corpus
LM = {"data": "stdlib", "stages": 4, "batch": 16, "micro": 4, "steps": 80, "validate": True, "val_batches": 10,
      "model": {"hidden": 64, "layers": 2, "heads": 4, "block_size": 32, "lr": 3e-3}}


@pytest.fixture(scope="module")
def corpus_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("lep")
    from lightning_granndis.datamodules import TextDataModule

    TextDataModule(max_files=40).prepare_data()
    cfgs = [{**LM, "tag": "baseline"},
            {**LM, "tag": "cb_lep", "strategy": {"compress_backward": True, "rank": 16}},
            {**LM, "tag": "cb_nolep", "strategy": {"compress_backward": True, "rank": 16, "lep": False}}]
    torchrun("pipeline_train.py", 4, str(out), json.dumps(cfgs), timeout=600)
    return {t: [json.loads((out / f"{t}_rank{r}.json").read_text()) for r in range(4)]
            for t in ("baseline", "cb_lep", "cb_nolep")}


def test_cb_with_lep_stays_within_two_percent_of_uncompressed_validation_loss(corpus_runs):
    """80 steps of a 4-stage GPT (d=64) on 40 standard-library files, rank 16. Observed here:
    baseline 3.111, CB+LEP 3.146 (+1.1 %), CB without LEP 3.135 (+0.8 %): at this scale LEP does not
    help; its residual is added to the next micro-batch, whose rows are other text."""
    base = corpus_runs["baseline"][0]["val_loss"]
    for tag in ("cb_lep", "cb_nolep"):
        losses = {r["val_loss"] for r in corpus_runs[tag]}
        assert len(losses) == 1  # reported on every rank
        assert losses.pop() <= 1.02 * base, tag


def test_cb_sends_exactly_the_low_rank_factors(corpus_runs):
    # each micro-batch's gradient is [4 rows x 32 tokens, 64]: P [128, 16] + Q [64, 16] instead
    steps, micro, n, m, r = 80, 4, 128, 64, 16
    for plain, cb in zip(corpus_runs["baseline"], corpus_runs["cb_lep"]):
        if plain["stage"] == 0:
            continue
        assert plain["bytes"]["intra/activation_grad"] == steps * micro * n * m * 4
        assert cb["bytes"]["intra/activation_grad"] == steps * micro * (n + m) * r * 4
