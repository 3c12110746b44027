"""Strategy names, registration, and the errors a user sees at Trainer(...)."""

import importlib

import pytest
from lightning.pytorch import Trainer
from lightning.pytorch.strategies import StrategyRegistry

import lightning_granndis
from lightning_granndis.strategies import STRATEGIES, ServerAwareDDPStrategy, register_strategies

NAMES = {"server_aware_ddp": ServerAwareDDPStrategy}


@pytest.mark.parametrize("name,cls", NAMES.items())
def test_name_gives_instance_of_its_class(name, cls):
    trainer = Trainer(strategy=name, accelerator="cpu", devices=2, logger=False)
    assert isinstance(trainer.strategy, cls)


def test_every_strategy_class_is_registered():
    registered = {d["strategy"] for d in StrategyRegistry.values()}
    assert set(STRATEGIES) <= registered


def test_registering_twice_is_harmless():
    before = dict(StrategyRegistry)
    register_strategies()
    importlib.reload(lightning_granndis)
    assert set(StrategyRegistry) == set(before)
    assert isinstance(Trainer(strategy="server_aware_ddp", accelerator="cpu", devices=2).strategy, ServerAwareDDPStrategy)


def test_world_size_that_does_not_divide_into_servers_fails_at_trainer_construction():
    with pytest.raises(ValueError, match="A world of 4 ranks cannot be split into 3 servers"):
        Trainer(strategy=ServerAwareDDPStrategy(servers=3), accelerator="cpu", devices=4)


def test_unknown_link_preset_fails_at_strategy_construction():
    with pytest.raises(ValueError, match="Unknown link preset 'fast'"):
        ServerAwareDDPStrategy(link_model="fast")


def test_old_pytorch_lightning_namespace_gets_a_clear_error():
    pl_old = pytest.importorskip("pytorch_lightning", reason="the old namespace package is not installed")
    with pytest.raises(ImportError, match=r"built on the `lightning` package.*from lightning.pytorch import Trainer"):
        pl_old.Trainer(strategy="server_aware_ddp", accelerator="cpu", devices=2)
