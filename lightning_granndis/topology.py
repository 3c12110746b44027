"""Servers, slots and process groups: which ranks share a fast link.

GraNNDis (PACT'24, §4) starts from one observation: inside a server GPUs talk over a fast link
(NVLink, 112 GB/s in the paper's cluster), between servers over a slow one (32 Gbit/s
InfiniBand). Every technique in this package needs to know, for any two ranks, which of the
two links joins them. :class:`ServerTopology` answers that.

On a real cluster a server is a node: Lightning's ``num_nodes`` × ``devices``, torchrun's
``--nnodes`` × ``--nproc-per-node``, or SLURM's nodes. On one machine, ``servers=S`` splits the
ranks into ``S`` *virtual* servers of consecutive ranks, so multi-server behaviour can be run and
tested anywhere.

Ranks are laid out the way every launcher lays them out: global rank
``r = server * devices_per_server + slot``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

LinkClass = Literal["intra", "inter"]
LINK_CLASSES: tuple[LinkClass, ...] = ("intra", "inter")


@dataclass(frozen=True)
class ServerTopology:
    """Maps global ranks onto servers and their local slots.

    Args:
        world_size: total number of ranks (processes).
        servers: number of servers the ranks are split into. Must divide ``world_size``.
        nodes: number of physical nodes the job runs on (default 1). Virtual servers never
            straddle a node, so ``servers`` must be a multiple of ``nodes``.

    Raises:
        ValueError: if the world size does not divide into the requested servers.
    """

    world_size: int
    servers: int = 1
    nodes: int = 1
    # the process groups made for this topology, filled by comm.server_groups / comm.topology_group
    # (this module describes ranks and never touches torch.distributed)
    process_groups: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {self.world_size}.")
        if self.servers < 1:
            raise ValueError(f"servers must be at least 1, got {self.servers}.")
        if self.world_size % self.servers != 0:
            raise ValueError(
                f"A world of {self.world_size} ranks cannot be split into {self.servers} servers of equal "
                f"size. Launch a multiple of {self.servers} processes (e.g. devices={self.servers * 2}), or "
                f"ask for a number of servers that divides {self.world_size} "
                f"(one of {_divisors(self.world_size)})."
            )
        if self.nodes < 1 or self.servers % self.nodes != 0:
            raise ValueError(
                f"{self.servers} servers cannot be laid over {self.nodes} nodes: a server never spans two "
                f"nodes, so servers must be a multiple of num_nodes. Use servers={self.nodes} (the default) "
                f"or a multiple of it."
            )

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_env(cls, servers: int | None = None) -> "ServerTopology":
        """Reads the launcher's environment (torchrun, Lightning, SLURM).

        With no ``servers`` given, one server per node: ``WORLD_SIZE / LOCAL_WORLD_SIZE`` (torchrun),
        else ``SLURM_NNODES``, else 1.
        """
        world = int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1")))
        nodes = 1
        if "LOCAL_WORLD_SIZE" in os.environ:
            nodes = max(1, world // int(os.environ["LOCAL_WORLD_SIZE"]))
        elif "SLURM_NNODES" in os.environ:
            nodes = int(os.environ["SLURM_NNODES"])
        return cls(world_size=world, servers=servers or nodes, nodes=nodes)

    # ------------------------------------------------------------------ mapping
    @property
    def devices_per_server(self) -> int:
        return self.world_size // self.servers

    def server_of(self, rank: int) -> int:
        self.check_rank(rank)
        return rank // self.devices_per_server

    def slot_of(self, rank: int) -> int:
        """The rank's position inside its server, ``0 .. devices_per_server - 1``."""
        self.check_rank(rank)
        return rank % self.devices_per_server

    def head_of(self, server: int) -> int:
        """The global rank of a server's head (its slot 0)."""
        if not 0 <= server < self.servers:
            raise ValueError(f"server {server} does not exist in a topology of {self.servers} servers.")
        return server * self.devices_per_server

    def is_head(self, rank: int) -> bool:
        return self.slot_of(rank) == 0

    def ranks_of(self, server: int) -> list[int]:
        head = self.head_of(server)
        return list(range(head, head + self.devices_per_server))

    @property
    def heads(self) -> list[int]:
        return [self.head_of(s) for s in range(self.servers)]

    def link(self, a: int, b: int) -> LinkClass:
        """The link class joining two ranks: ``"intra"`` inside one server, else ``"inter"``."""
        return "intra" if self.server_of(a) == self.server_of(b) else "inter"

    def describe(self) -> str:
        kind = "node" if self.servers == self.nodes else "virtual server"
        return (
            f"{self.servers} {kind}{'s' if self.servers != 1 else ''} x {self.devices_per_server} "
            f"device{'s' if self.devices_per_server != 1 else ''} ({self.world_size} ranks)"
        )

    def check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside a world of {self.world_size} ranks.")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
