"""Lightning strategies of the suite; importing :mod:`lightning_granndis` registers their names."""

from lightning_granndis.strategies.checkpoint_io import SafeCheckpointIO
from lightning_granndis.strategies.gnn_fb_base import FullGraphBaselineStrategy
from lightning_granndis.strategies.gnn_mb_base import MiniBatchBaselineStrategy
from lightning_granndis.strategies.granndis import ServerAwareGNNStrategy
from lightning_granndis.strategies.optimus_cc import CompressedPipelineStrategy
from lightning_granndis.strategies.pipe_bd import PipeBDStrategy
from lightning_granndis.strategies.server_aware_ddp import ServerAwareDDPStrategy

#: Every strategy class the package defines, in registration order.
STRATEGIES = (
    ServerAwareDDPStrategy, ServerAwareGNNStrategy, FullGraphBaselineStrategy, MiniBatchBaselineStrategy,
    CompressedPipelineStrategy, PipeBDStrategy,
)


def register_strategies() -> None:
    """Registers every strategy name with Lightning's ``StrategyRegistry`` (idempotent)."""
    from lightning.pytorch.strategies import StrategyRegistry

    for cls in STRATEGIES:
        cls.register_strategies(StrategyRegistry)


def registered_names() -> list[str]:
    from lightning.pytorch.strategies import StrategyRegistry

    return sorted(n for n, d in StrategyRegistry.items() if d["strategy"] in STRATEGIES)


__all__ = [
    "STRATEGIES", "CompressedPipelineStrategy", "FullGraphBaselineStrategy", "MiniBatchBaselineStrategy", "PipeBDStrategy", "SafeCheckpointIO", "ServerAwareDDPStrategy",
    "ServerAwareGNNStrategy", "register_strategies", "registered_names",
]
