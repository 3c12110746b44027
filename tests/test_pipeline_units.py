"""Single-process pieces of the pipeline: micro-batching, shape headers, the one-stage runtime,
PowerSGD's averaging rule, layout checks and the errors a user sees."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from torch import nn

from lightning_granndis import comm
from lightning_granndis.compression.powersgd import PowerSGDReducer
from lightning_granndis.models import GPT, MLPClassifier
from lightning_granndis.pipeline import PipelinedModule, place_stages, plan_stages
from lightning_granndis.pipeline.layout import PipelineLayout, build_layout
from lightning_granndis.pipeline.checkpoint import resumed_balance
from lightning_granndis.pipeline.module import micro_ranges, slice_batch
from lightning_granndis.pipeline.p2p import compressed_rank, header_of, parse_header
from lightning_granndis.pipeline.runtime import PipelineRuntime
from lightning_granndis.strategies import CompressedPipelineStrategy
from lightning_granndis.topology import ServerTopology


def test_micro_ranges_cover_the_batch_in_near_equal_parts():
    assert micro_ranges(10, 4) == [(0, 2), (2, 5), (5, 8), (8, 10)]
    assert micro_ranges(3, 8) == [(0, 1), (1, 2), (2, 3)]  # fewer rows than micro-batches
    batch = (torch.arange(10), {"y": torch.arange(10) * 2}, "meta")
    part = slice_batch(batch, 2, 5)
    assert part[0].tolist() == [2, 3, 4] and part[1]["y"].tolist() == [4, 6, 8] and part[2] == "meta"


@pytest.mark.parametrize("shape,dtype", [((3, 5, 7), torch.float32), ((2,), torch.int64), ((1, 2, 3, 4), torch.bfloat16)])
def test_shape_header_round_trips(shape, dtype):
    t = torch.zeros(shape, dtype=dtype)
    assert parse_header(header_of(t)) == (torch.Size(shape), dtype)


def test_header_refuses_what_it_cannot_describe():
    with pytest.raises(ValueError, match="at most 8 dimensions"):
        header_of(torch.zeros([1] * 9))
    with pytest.raises(TypeError, match="complex64"):
        header_of(torch.zeros(2, dtype=torch.complex64))


def test_compressed_rank_views_leading_dimensions_as_rows():
    assert compressed_rank((4, 16, 32), 16) == (64, 32, 16)
    assert compressed_rank((2, 3, 8), 16) == (6, 8, 6)


def _gpt():
    pl.seed_everything(0)
    return GPT(vocab_size=32, block_size=8, hidden=16, layers=2, heads=2)


def test_one_stage_runtime_equals_the_plain_loss_and_gradients():
    model, batch = _gpt(), (torch.randint(0, 32, (6, 8)), torch.randint(0, 32, (6, 8)))
    runtime = PipelineRuntime(0, [0], list(enumerate(model.blocks)), comm.Communicator(), "1f1b", micro_batches=4)
    loss = runtime(model, batch)  # 4 micro-batches of 2, 2, 1, 1 rows... row-weighted
    expected = model.pipeline_loss(model(batch[0]), batch)
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
    assert all(p.grad is not None for p in model.parameters())  # the plain backward's
    for p, g in zip(runtime.params, runtime.grads):
        torch.testing.assert_close(g, p.grad, atol=1e-6, rtol=1e-5)


class _TupleBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x), x


class _Bad(PipelinedModule):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(nn.Linear(4, 4), _TupleBlock())

    def pipeline_loss(self, output, batch):
        return output.sum()


def test_a_block_returning_a_tuple_is_named_in_the_error():
    model = _Bad()
    runtime = PipelineRuntime(0, [0], list(enumerate(model.blocks)), comm.Communicator())
    with pytest.raises(TypeError, match=r"pipeline block 1 \(_TupleBlock\) returned tuple"):
        runtime(model, (torch.zeros(2, 4),))


def test_fewer_blocks_than_stages_is_refused():
    with pytest.raises(ValueError, match="has 4 pipeline blocks but 8 stages"):
        build_layout(_gpt(), ServerTopology(world_size=8), stages=8)


def test_parameters_outside_the_blocks_are_refused():
    model = _gpt()
    model.extra = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="parameters outside every pipeline block: extra.weight"):
        build_layout(model, ServerTopology(world_size=2), stages=2)


def test_world_size_not_divisible_by_stages_fails_at_trainer_construction():
    with pytest.raises(ValueError, match="world size 4 .* is not a multiple of stages=3"):
        pl.Trainer(strategy=CompressedPipelineStrategy(stages=3), accelerator="cpu", devices=4)


@pytest.mark.parametrize("kwargs,match", [({"schedule": "zb"}, "unknown schedule 'zb'"),
                                          ({"microbatches": 0}, "microbatches must be at least 1"),
                                          ({"rank": 0}, "compression ranks must be at least 1")])
def test_bad_strategy_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CompressedPipelineStrategy(**kwargs)


@pytest.mark.parametrize("name,flags", [("compressed_pipeline", (False, False, False)),
                                        ("optimus_cc", (True, True, True))])
def test_registered_names(name, flags):
    strategy = pl.Trainer(strategy=name, accelerator="cpu", devices=2, logger=False).strategy
    assert isinstance(strategy, CompressedPipelineStrategy)
    assert (strategy.compress_backward, strategy.fused_embedding, strategy.dp_compression) == flags


def test_a_checkpoint_from_another_configuration_names_the_difference():
    plan, placement = plan_stages([1.0] * 4, 2, balance=[1, 3]), place_stages(ServerTopology(world_size=2), 2)
    layout = PipelineLayout(plan, placement, replica=0, stage=0, num_blocks=4)
    layout.check_metadata(layout.metadata(), "ok.ckpt")
    other = {**layout.metadata(), "balance": [2, 2]}
    with pytest.raises(ValueError, match=r"another pipeline configuration \(balance: checkpoint \[2, 2\], this run \[1, 3\]\)"):
        layout.check_metadata(other, "x.ckpt")
    with pytest.raises(ValueError, match="not a pipeline checkpoint"):
        layout.check_metadata(None, "plain.ckpt")


def test_a_resumed_run_reads_the_checkpoints_split(tmp_path):
    """Profiled splits depend on timings, so resume keeps the checkpoint's; anything else gives
    ``None`` and the load that follows names the problem."""
    path = tmp_path / "step=6.ckpt"
    torch.save({"pipeline": {"stages": 2, "balance": [3, 1]}, "state_dict": {"w": torch.ones(2)}}, path)
    assert resumed_balance(path, 2) == [3, 1]
    assert resumed_balance(path, 4) is None  # another stage count
    torch.save({"state_dict": {}}, tmp_path / "plain.ckpt")
    assert resumed_balance(tmp_path / "plain.ckpt", 2) is None
    (tmp_path / "broken.ckpt").write_bytes(b"not a checkpoint")
    assert resumed_balance(tmp_path / "broken.ckpt", 2) is None


def test_in_process_one_stage_pipeline_trains_like_plain_lightning(tmp_path):
    """The strategy inside a real Trainer (one process): the same losses and weights as no strategy."""
    def fit(strategy):
        model = _gpt()
        data = torch.utils.data.TensorDataset(torch.randint(0, 32, (24, 8)), torch.randint(0, 32, (24, 8)))
        losses = []

        class Keep(pl.Callback):
            def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
                losses.append(float(outputs["loss"]))

        trainer = pl.Trainer(accelerator="cpu", devices=1, strategy=strategy, max_steps=3, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             callbacks=[Keep()], default_root_dir=str(tmp_path), use_distributed_sampler=False)
        trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=8))
        return losses, model

    plain_losses, plain = fit("auto")
    pipe_losses, piped = fit(CompressedPipelineStrategy(stages=1, microbatches=3))
    assert pipe_losses == pytest.approx(plain_losses, abs=1e-6)
    for (name, a), b in zip(plain.state_dict().items(), piped.state_dict().values()):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=0, msg=name)


def test_a_module_without_blocks_is_refused(tmp_path):
    trainer = pl.Trainer(accelerator="cpu", devices=1, strategy=CompressedPipelineStrategy(stages=1), max_steps=1,
                         logger=False, enable_checkpointing=False, default_root_dir=str(tmp_path))
    with pytest.raises(TypeError, match="MLPClassifier cannot be pipelined: it has no pipeline_blocks"):
        trainer.fit(MLPClassifier(in_features=4, num_classes=2),
                    torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(4, 4), torch.zeros(4).long())))


# ---------------------------------------------------------------------- PowerSGD (one replica)
def test_powersgd_is_exact_on_low_rank_gradients_and_exact_for_vectors():
    g = torch.randn(40, 3) @ torch.randn(3, 30)
    bias = torch.randn(30)
    reducer = PowerSGDReducer(rank=4)
    grads = [g.clone(), bias.clone()]
    for _ in range(2):  # warm-started Q: the second call is exact to float precision
        grads = [g.clone(), bias.clone()]
        reducer.reduce(grads, comm.Communicator(), None, replicas=1)
    torch.testing.assert_close(grads[0], g, atol=1e-4, rtol=1e-4)
    assert torch.equal(grads[1], bias)


def test_powersgd_error_feedback_preserves_the_sum_and_warmup_is_exact():
    torch.manual_seed(0)
    reducer = PowerSGDReducer(rank=2, warmup_steps=1)
    true_sum, sent_sum = torch.zeros(20, 20), torch.zeros(20, 20)
    for step in range(5):
        g = torch.randn(20, 20)
        out = [g.clone()]
        reducer.reduce(out, comm.Communicator(), None, replicas=1)
        if step == 0:
            assert torch.equal(out[0], g)  # warm-up: exact
        true_sum += g
        sent_sum += out[0]
    torch.testing.assert_close(sent_sum + reducer.error[0], true_sum, atol=1e-4, rtol=1e-4)
