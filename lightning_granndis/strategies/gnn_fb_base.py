"""FB_base: full-graph GNN training with a halo exchange among all ranks (PipeGCN-vanilla style)."""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_granndis.strategies.granndis import ServerAwareGNNStrategy


class FullGraphBaselineStrategy(ServerAwareGNNStrategy):
    """The GraNNDis paper's FB_base (PACT'24, §8.1): `PipeGCN <https://arxiv.org/abs/2203.10428>`_
    "vanilla" (no pipelining, no staleness).

    The whole graph is METIS-split across all ``P`` ranks, blind to servers; before every
    message-passing layer each rank exchanges its one-hop halo with every other rank, across
    servers too (Eq. 1's inter-server term). Gradients are synchronised with a flat all-reduce
    (plain DDP). Exact: equals single-process full-graph training.

    Args:
        servers: servers (for the ledger's link classes).
        halo_bits: quantise halo messages (AdaQP-style, 2/4/8 bits; default off).
        hierarchical: gradient sync (default ``False``: plain DDP, as the baseline).
        **kwargs: as :class:`ServerAwareGNNStrategy` (``exact_eval``, ``link_model``, ``emulate``...).
    """

    strategy_name = "gnn_fb_base"
    default_mode = "full"
    halo_scope = "world"

    def __init__(self, servers: int | None = None, halo_bits: int | None = None, hierarchical: bool = False,
                 **kwargs: Any) -> None:
        kwargs.pop("mode", None)
        super().__init__(servers=servers, mode="full", halo_bits=halo_bits, hierarchical=hierarchical, **kwargs)

    @classmethod
    @override
    def modes(cls) -> tuple[str, ...]:
        return ("full",)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(cls.strategy_name, cls, override=True,
                                   description="FB_base: full-graph GNN training, halo exchange among all ranks")
