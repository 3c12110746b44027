"""lightning_granndis: GraNNDis, Optimus-CC and Pipe-BD as PyTorch Lightning strategies.

Importing the package registers its strategy names with Lightning::

    import lightning_granndis
    trainer = Trainer(strategy="server_aware_ddp", devices=4)
"""

from lightning_granndis import warnings_once

warnings_once.install()  # before the libraries below warn, once per rank

from lightning_granndis import _namespace  # noqa: E402
from lightning_granndis.ledger import CommLedger
from lightning_granndis.link_model import LinkModel
from lightning_granndis.strategies import (
    FullGraphBaselineStrategy,
    MiniBatchBaselineStrategy,
    PipeBDStrategy,
    ServerAwareDDPStrategy,
    ServerAwareGNNStrategy,
    register_strategies,
    registered_names,
)
from lightning_granndis.topology import ServerTopology

__version__ = "0.1.0"

register_strategies()
_namespace.install(registered_names())

__all__ = [
    "CommLedger", "FullGraphBaselineStrategy", "LinkModel", "MiniBatchBaselineStrategy", "PipeBDStrategy", "ServerAwareDDPStrategy",
    "ServerAwareGNNStrategy", "ServerTopology", "__version__",
]
