"""Recovery from data-parallel replicas (SWIFT-style): the latest step's state kept in each
server's memory, so a restarted run loses at most one step instead of going back to the last
disk checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from typing_extensions import override

from lightning_granndis import comm
from lightning_granndis.callbacks.resumable_checkpoint import ResumableCheckpoint
from lightning_granndis.checkpoint_sets import RECEIVED_PLACEHOLDER, read_set, uncommit


class ReplicaSnapshot(ResumableCheckpoint):
    """Keeps the run's state of the latest step in node-local memory, one copy per server.

    SWIFT (Zhong et al., "SWIFT: Expedited Failure Recovery for Large-scale DNN Training")
    observes that data-parallel replicas hold identical parameters and optimizer state, so a failed
    worker can be recovered from a surviving replica instead of the last checkpoint on disk. Here
    every ``every_n_train_steps`` steps (default 1) each server's head writes the whole state
    (parameters, optimizer, loops, loader positions, every rank's generators) as a committed
    checkpoint set into ``dirpath/server<k>/`` (put ``dirpath`` in node-local memory, e.g.
    ``/dev/shm/<run>``), keeping only the newest.

    After a restart with ``trainer.fit(..., ckpt_path="last")``, every rank takes the newest of its
    own server's snapshot and the disk checkpoints of a :class:`ResumableCheckpoint` beside it. A
    server whose memory was lost (the machine replaced) finds only the disk checkpoint; the ranks
    then agree on the newest step any of them holds, and the lowest rank holding it sends that
    snapshot to the servers that lack it (see ``agree_on_checkpoint`` of the strategy), so the
    whole run resumes from it. Where no server kept a snapshot, the disk checkpoint is resumed.

    Covers the strategies whose ranks hold whole replicas: ``server_aware_ddp``, every ``granndis``
    mode and baseline, and ``pipe_bd`` (its checkpoint gathers the whole student and every rank's
    optimizer state). A pipeline (``compressed_pipeline``/``optimus_cc``) keeps one stage per rank,
    so a server holds no whole replica: it is refused.

    Args:
        dirpath: the snapshot folder, node-local (each server uses ``dirpath/server<k>``).
        every_n_train_steps: steps between snapshots (default 1: at most one step lost).
    """

    resume_prefix = ""  # the folder holds nothing else

    def __init__(self, dirpath: str, every_n_train_steps: int = 1) -> None:
        super().__init__(dirpath=dirpath, every_n_train_steps=every_n_train_steps, keep=1, checksum=False)
        self.base = Path(dirpath)

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(every_n_train_steps=self._every_n_train_steps, replica=True)

    @staticmethod
    def _strategy(trainer: pl.Trainer):
        from lightning_granndis.strategies import CompressedPipelineStrategy, ServerAwareDDPStrategy

        strategy = trainer.strategy
        if not isinstance(strategy, ServerAwareDDPStrategy) or isinstance(strategy, CompressedPipelineStrategy):
            raise ValueError(
                f"ReplicaSnapshot needs a strategy whose servers hold whole replicas (server_aware_ddp, granndis, "
                f"pipe_bd), not {type(strategy).__name__}: a pipeline keeps one stage per rank. Use "
                "ResumableCheckpoint alone for it."
            )
        return strategy

    def server_folder(self, trainer: pl.Trainer) -> Path:
        """This rank's server's snapshot folder (known before the process group exists)."""
        strategy = self._strategy(trainer)
        topology = strategy.topology or strategy.build_topology()
        return self.base / f"server{topology.server_of(trainer.global_rank)}"

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self.dirpath = str(self.server_folder(trainer))
        trainer.strategy.replica_folder = self.dirpath  # where a lost server receives a peer's snapshot
        if stage == "fit" and comm.is_initialized():
            self._check_every_rank_resumes(trainer)

    @override
    def _find_last_checkpoints(self, trainer: pl.Trainer) -> set[str]:
        self.dirpath = str(self.server_folder(trainer))
        found = super()._find_last_checkpoints(trainer)
        step = read_set(next(iter(found)))[0].step if found else -1
        # Ranks choose before the process group exists, each from its own server's memory. A rank
        # that found nothing would skip loading (and the collectives of the ranks that resume): it
        # resumes too, from the snapshot its server then receives (the strategy's load_checkpoint).
        steps = comm.exchange_before_group("replica_snapshot_newest_step", step)
        if not found and steps is not None and max(steps) >= 0:
            # Lightning resumes from the newest existing file among the callbacks' candidates: an
            # empty placeholder, made now, stands for the snapshot this server will receive
            placeholder = Path(self.dirpath) / RECEIVED_PLACEHOLDER
            placeholder.parent.mkdir(parents=True, exist_ok=True)
            placeholder.touch()
            found = {str(placeholder)}
        self.resume_candidates = found
        return found

    @staticmethod
    def _check_every_rank_resumes(trainer: pl.Trainer) -> None:
        """Outside torchrun the ranks cannot agree before the group exists: a rank that found
        nothing to resume from (no snapshot in its server's memory, no disk checkpoint) would start
        afresh beside ranks that resume, and the run would hang in mismatched collectives. Every
        rank says so instead. (A rank that found only a disk checkpoint resumes: the ranks then
        agree on the newest step and its server receives that snapshot.)"""
        asked = [cb.resume_candidates for cb in trainer.checkpoint_callbacks
                 if isinstance(cb, ResumableCheckpoint) and cb.resume_candidates is not None]
        resuming = comm.gather_objects(any(asked) if asked else None)  # None: ckpt_path="last" not asked
        if None in resuming or all(resuming) or not any(resuming):
            return
        fresh = [rank for rank, has in enumerate(resuming) if not has]
        raise RuntimeError(
            f"ReplicaSnapshot: ranks {fresh} found no snapshot or checkpoint to resume from while the others "
            "resume: their servers lost their snapshots. Launch with torchrun (the ranks then agree before "
            "starting and those servers receive a peer's snapshot), or resume every rank from one checkpoint "
            "(ckpt_path=...)."
        )

    @override
    def _write_resume_set(self, trainer: pl.Trainer, path: str) -> None:
        with trainer.strategy.writing_on_every_server():
            super()._write_resume_set(trainer, path)
            if trainer.strategy.writes_checkpoint_files:
                self._drop_older_snapshots(Path(path))

    @staticmethod
    def _drop_older_snapshots(newest: Path) -> None:
        """Memory holds one snapshot: the one a restart resumed from (which its own saved state
        does not list, so Lightning never removes it) and a received placeholder go too."""
        for path in newest.parent.glob("*.ckpt"):
            if path != newest:
                uncommit(path)  # the record first: a half-removed set is never complete
                path.unlink(missing_ok=True)

    @override
    def _delete_set(self, trainer: pl.Trainer, path: str) -> None:
        with trainer.strategy.writing_on_every_server():
            super()._delete_set(trainer, path)

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # A snapshot received from another server names that server's folder; its copy is in ours.
        # Read it as ours: every rank then keeps the same best-k record (a rank with an empty one
        # would skip the collective decision of the others, and the run would hang).
        saved = state_dict.get("dirpath")
        if saved and self.dirpath and saved != self.dirpath:
            def here(path):
                return path.replace(saved, self.dirpath, 1) if isinstance(path, str) else path

            state_dict = {key: here(value) for key, value in state_dict.items()}
            state_dict["best_k_models"] = {here(k): v for k, v in state_dict.get("best_k_models", {}).items()}
            state_dict["resume_sets"] = [here(p) for p in state_dict.get("resume_sets", [])]
        super().load_state_dict(state_dict)
