"""Pipe-BD's algorithms in one process: schedules, AHD's search against brute force, guide
features, the runner's modes, bad input."""

from __future__ import annotations

import itertools
import random

import lightning.pytorch as pl
import pytest
import torch
from torch import nn

import lightning_granndis  # noqa: F401  (registers the strategies)
from lightning_granndis.distill import (BlockCosts, BlockwiseDistillation, BlockwiseRunner, DistillSchedule,
                                        StageCostModel, check_blocks, guide_features, row_range, search_schedule)
from lightning_granndis.link_model import LinkModel
from lightning_granndis.strategies import PipeBDStrategy


def test_row_ranges_tile_the_batch_in_order():
    for batch in range(0, 12):
        for parts in range(1, 5):
            bounds = [row_range(batch, parts, j) for j in range(parts)]
            assert bounds[0][0] == 0 and bounds[-1][1] == batch
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
            assert max(b - a for a, b in bounds) - min(b - a for a, b in bounds) <= 1


def test_schedule_places_stages_on_consecutive_ranks():
    s = DistillSchedule.build([[0, 1], [2], [3, 4, 5]], [2, 1, 1]).validate(6, 4)
    assert [s.ranks_of(k) for k in range(3)] == [[0, 1], [2], [3]]
    assert [s.stage_of(r) for r in range(4)] == [0, 0, 1, 2]
    assert s.stage_of_block(4) == 2 and s.describe() == "[[0, 1]x2, [2], [3, 4, 5]]"
    assert DistillSchedule.even(6, 4).stages == ((0,), (1, 2), (3,), (4, 5))


@pytest.mark.parametrize("stages, widths, world, match", [
    ([[0, 1], [3]], None, 2, "must cover blocks 0..3"),
    ([[0, 2], [1, 3]], None, 2, "consecutive"),
    ([[0, 1], [2, 3]], [2, 3], 4, "uses 5 ranks but the world has 4"),
    ([[0, 1], [2, 3]], None, 4, "uses 2 ranks but the world has 4"),
    ([[0, 1], [2, 3]], [1], 2, "2 stages but 1 dp_widths"),
    ([[0, 1, 2, 3], []], None, 2, "at least one block"),
])
def test_bad_schedules_are_refused_with_the_fix(stages, widths, world, match):
    with pytest.raises(ValueError, match=match):
        DistillSchedule.build(stages, widths).validate(4, world)


# ---------------------------------------------------------------------------------------- AHD
def _random_costs(n: int, world: int, seed: int) -> BlockCosts:
    rnd = random.Random(seed)
    base_t = [rnd.uniform(1, 10) for _ in range(n)]
    base_s = [rnd.uniform(1, 10) for _ in range(n)]
    # per-rank batches shrink with the width, but not perfectly (fixed per-call overheads)
    teacher = {g: [t * (0.2 + 0.8 / g) * rnd.uniform(0.9, 1.1) for t in base_t] for g in range(1, world + 1)}
    student = {g: [s * (0.2 + 0.8 / g) * rnd.uniform(0.9, 1.1) for s in base_s] for g in range(1, world + 1)}
    return BlockCosts(batch=64, teacher=teacher, student=student,
                      param_bytes=[rnd.randint(10**4, 10**7) for _ in range(n)],
                      feature_bytes=[rnd.randint(10**3, 10**5) for _ in range(n)])


def _brute_force(model: StageCostModel, n: int, world: int):
    best = ((float("inf"), float("inf")), None)
    for k in range(1, min(n, world) + 1):
        for cuts in itertools.combinations(range(1, n), k - 1):
            bounds = (0, *cuts, n)
            stages = [list(range(a, b)) for a, b in zip(bounds, bounds[1:])]
            for wcuts in itertools.combinations(range(1, world), k - 1):
                wb = (0, *wcuts, world)
                widths = [b - a for a, b in zip(wb, wb[1:])]
                schedule = DistillSchedule.build(stages, widths)
                work = model.rank_seconds(schedule)
                cost = (model.step_time(max(model.schedule_costs(schedule)), work), work)  # then the fewest rank-seconds
                if cost < best[0]:
                    best = (cost, (stages, widths))
    return best


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n, world, servers, shared", [(6, 4, 1, None), (5, 3, 1, None), (7, 6, 2, None), (4, 8, 2, None),
                                                       (6, 4, 1, 2), (7, 6, 2, 3), (5, 8, 2, 2)])
def test_ahd_search_equals_brute_force_on_a_hand_made_cost_table(seed, n, world, servers, shared):
    costs = _random_costs(n, world, seed)
    link = LinkModel.custom(intra_gbps=80.0, inter_gbps=2.0, name="test")  # makes the all-reduce/relay matter
    per_server = world // servers
    model = StageCostModel(costs, link, server_of=lambda r: r // per_server, shared_devices=shared)
    got = search_schedule(model, world)
    want_cost, (stages, widths) = _brute_force(model, n, world)
    assert got.predicted_s == pytest.approx(want_cost[0], rel=1e-12)
    assert [list(s) for s in got.schedule.stages] == stages and list(got.schedule.widths) == widths
    got.schedule.validate(n, world)


def test_ahd_gives_the_expensive_block_the_wider_stage():
    # block 0 costs 12 s whatever the batch (fixed overheads); block 1 60 s / width. All data-parallel:
    # 12 + 20 = 32; pipeline [0] | [1]x2: max(12, 30) = 30 (+ tiny comm); [0]x2 | [1]: 60.
    costs = BlockCosts(batch=96, teacher={g: [12.0, 60.0 / g] for g in range(1, 4)},
                       student={g: [0.0, 0.0] for g in range(1, 4)}, param_bytes=[100, 100], feature_bytes=[10, 10])
    model = StageCostModel(costs)
    result = search_schedule(model, 3)
    assert result.schedule == DistillSchedule.build([[0], [1]], [1, 2])
    assert result.bottleneck_s == pytest.approx(30.0 + model.all_reduce(1, 1, 2, 1) + model.relay(1, 2, 1))
    assert 0 < model.all_reduce(1, 1, 2, 1) + model.relay(1, 2, 1) < 1e-3


def test_ahd_on_shared_cores_weighs_the_busy_rank_seconds():
    # Per-call seconds: block 0 = 20/g + 10, block 1 = 40/g + 5 (a fixed part each, whatever the rows).
    #   [0]x2 | [1]x2: stages 20, 25;   busy rank-seconds 2*20 + 2*25 = 90
    #   [0]   | [1]x3: stages 30, 18.3; busy rank-seconds 30 + 3*18.3  = 85
    # A device per rank: the bottleneck decides (25 < 30). 4 ranks on 2 cores: a step needs at
    # least the busy rank-seconds / 2, so 85/2 = 42.5 beats 90/2 = 45.
    costs = BlockCosts(batch=96, teacher={g: [20.0 / g + 10, 40.0 / g + 5] for g in range(1, 5)},
                       student={g: [0.0, 0.0] for g in range(1, 5)}, param_bytes=[4, 4], feature_bytes=[4, 4])
    alone, shared = StageCostModel(costs), StageCostModel(costs, shared_devices=2)
    got = search_schedule(alone, 4)
    assert got.schedule == DistillSchedule.build([[0], [1]], [2, 2]) and got.predicted_s == pytest.approx(25.0, rel=1e-5)
    got = search_schedule(shared, 4)
    assert got.schedule == DistillSchedule.build([[0], [1]], [1, 3])
    assert got.rank_seconds == pytest.approx(85.0) and got.predicted_s == pytest.approx(42.5)
    assert shared.step_time(20.0, 80.0) == 40.0 and alone.step_time(20.0, 80.0) == 20.0


def test_ahd_prices_a_stage_spanning_servers_with_the_inter_server_link():
    costs = _random_costs(3, 4, 0)
    link = LinkModel.custom(intra_gbps=800.0, inter_gbps=0.01)
    model = StageCostModel(costs, link, server_of=lambda r: r // 2)
    assert model.all_reduce(0, 2, 2, 1) > 100 * model.all_reduce(0, 2, 2, 0)  # ranks 1,2 straddle the servers


# --------------------------------------------------------------------------- blocks and runner
def _toy(n=3, out_dim=5):
    torch.manual_seed(0)
    teacher = [nn.Linear(4, 4) for _ in range(n - 1)] + [nn.Linear(4, out_dim)]
    student = [nn.Linear(4, 4) for _ in range(n - 1)] + [nn.Linear(4, out_dim)]
    return teacher, student


def test_guide_features_are_each_blocks_input_and_output():
    teacher, _ = _toy()
    x = torch.randn(6, 4)
    inputs, outputs = guide_features(teacher, x)
    assert torch.equal(inputs[0], x) and torch.equal(inputs[1], outputs[0])
    assert torch.allclose(outputs[-1], teacher[2](teacher[1](teacher[0](x))))


def test_dna_runs_the_teacher_n_n_plus_1_over_2_times_and_computes_the_same_loss_as_relaying():
    teacher, student = _toy(4)
    x, y = torch.randn(8, 4), torch.randint(0, 5, (8,))
    module = BlockwiseDistillation(teacher, student)
    losses = {}
    for mode in ("tr", "dna", "ls"):
        runner = BlockwiseRunner(module.teacher, module.student, module.block_loss,
                                 DistillSchedule.build([[0, 1, 2, 3]]), mode)
        losses[mode] = runner.train_step((x, y))
        assert runner.counter.total == {"tr": 4, "dna": 10, "ls": 4}[mode]
    assert torch.allclose(losses["tr"], losses["dna"]) and torch.allclose(losses["tr"], losses["ls"])


def test_block_count_and_output_shape_mismatches_are_refused():
    teacher, student = _toy(3)
    with pytest.raises(ValueError, match="the teacher has 3 blocks but the student 2"):
        BlockwiseDistillation(teacher, student[:2])
    with pytest.raises(ValueError, match="at least one teacher block"):
        check_blocks([], [])
    bad = student[:1] + [nn.Linear(4, 3)] + student[2:]
    with pytest.raises(ValueError, match=r"student block 1 outputs shape \(2, 3\) but teacher block 1 outputs \(2, 4\)"):
        check_blocks(teacher, bad, torch.zeros(2, 4))


class _Tiny(BlockwiseDistillation):
    def __init__(self, student_out: int = 4):
        teacher, student = _toy(3)
        student[1] = nn.Linear(4, student_out)
        super().__init__(teacher, student)
        self.example_input_array = torch.zeros(1, 4)


def _loader():
    from torch.utils.data import DataLoader, TensorDataset

    return DataLoader(TensorDataset(torch.randn(16, 4), torch.randint(0, 5, (16,))), batch_size=8)


def _fit(model, **strategy):
    trainer = pl.Trainer(accelerator="cpu", devices=1, strategy=PipeBDStrategy(**strategy), max_steps=2,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(model, _loader())
    return trainer


@pytest.mark.parametrize("strategy, match", [
    ({"schedule": [[0, 1]], "mode": "tr"}, "must cover blocks 0..2"),
    ({"schedule": [[0], [1, 2]], "dp_widths": [1, 1]}, "uses 2 ranks but the world has 1"),
    ({"schedule": "even", "mode": "ls"}, None),  # fine: one stage of everything on one rank
])
def test_strategy_refuses_schedules_that_do_not_fit(strategy, match):
    if match is None:
        assert _fit(_Tiny(), **strategy).global_step == 2
        return
    with pytest.raises(ValueError, match=match):
        _fit(_Tiny(), **strategy)


def test_strategy_refuses_a_student_block_of_the_wrong_shape_before_training():
    with pytest.raises(ValueError, match="student block 1 outputs shape"):
        _fit(_Tiny(student_out=3))


def test_strategy_refuses_a_module_that_is_not_blockwise():
    from lightning_granndis.models import MLPClassifier

    with pytest.raises(TypeError, match="cannot be distilled blockwise"):
        _fit(MLPClassifier(in_features=4, num_classes=5))


@pytest.mark.parametrize("kwargs, match", [
    ({"mode": "kd"}, "unknown Pipe-BD mode"),
    ({"mode": "dna", "schedule": "auto"}, "AHD"),
    ({"schedule": "fast"}, "schedule must be"),
    ({"schedule": "even", "dp_widths": [2, 2]}, "dp_widths go with a list schedule"),
])
def test_bad_strategy_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PipeBDStrategy(**kwargs)


@pytest.mark.parametrize("name, mode, dpu, schedule", [
    ("pipe_bd", "tr", True, "auto"), ("pipe_bd_tr", "tr", False, "even"), ("pipe_bd_tr_dpu", "tr", True, "even"),
    ("pipe_bd_dna", "dna", True, "even"), ("pipe_bd_ls", "ls", True, "even"),
])
def test_registry(name, mode, dpu, schedule):
    strategy = pl.Trainer(strategy=name, accelerator="cpu", devices=1, logger=False).strategy
    assert isinstance(strategy, PipeBDStrategy)
    assert (strategy.mode, strategy.dpu, strategy.schedule_spec) == (mode, dpu, schedule)


def test_in_process_fit_assembles_a_student_that_computes_the_modules_forward():
    model = _Tiny()
    trainer = _fit(model)
    assert trainer.strategy.schedule.describe() == "[[0, 1, 2]]"
    student = model.assemble_student()
    x = torch.randn(3, 4)
    assert isinstance(student, nn.Sequential) and torch.allclose(student(x), model.cpu()(x))
    assert model._distill_runner is None  # detached after fit: the module works alone again


@pytest.mark.parametrize("mode", ["tr", "dna"])
def test_a_rank_without_rows_contributes_a_zero_gradient(mode):
    # 2 rows over a 3-rank stage: rank 0 owns none. BatchNorm would refuse an empty batch.
    torch.manual_seed(0)
    teacher = [nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)), nn.Linear(4, 5)]
    student = [nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)), nn.Linear(4, 5)]
    module = BlockwiseDistillation(teacher, student)
    runner = BlockwiseRunner(module.teacher, module.student, module.block_loss,
                             DistillSchedule.build([[0, 1]], [3]), mode, rank=0)
    x, y = torch.randn(2, 4), torch.tensor([1, 2])
    loss = runner.train_step((x, y))
    loss.backward()
    assert float(loss) == 0.0 and all(float(p.grad.abs().sum()) == 0.0 for p in module.student.parameters())
    module.eval()
    metrics = runner.eval_step((x, y))
    assert metrics["loss"] == 0.0 and metrics["rows"] == 2  # nothing of this batch was on this rank
