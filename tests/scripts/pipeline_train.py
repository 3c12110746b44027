"""Trains the small GPT with CompressedPipelineStrategy (under torchrun) or on one device (plain
python), and saves per rank: the step losses, this stage's parameters, the ledger's bytes, the
validation loss.

usage: pipeline_train.py OUT CONFIGS_JSON   (one config or a list, run one after another)
CONFIG keys: stages, schedule, micro, steps, batch (per replica), replicas (for the single-device
reference: batch x replicas), strategy (extra kwargs), data ("random" | "stdlib"), model (GPT
kwargs), accumulate, val (bool), ckpt_every / resume (paths), tag.
"""

import json
import os
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import lightning_granndis  # noqa: F401
from lightning_granndis.datamodules import TextDataModule
from lightning_granndis.models import GPT
from lightning_granndis.strategies import CompressedPipelineStrategy

out, configs = Path(sys.argv[1]), json.loads(sys.argv[2])
configs = configs if isinstance(configs, list) else [configs]
distributed = "WORLD_SIZE" in os.environ
rank = int(os.environ.get("RANK", 0))
torch.set_num_threads(1)


class RandomTokens(pl.LightningDataModule):
    """Fixed random token windows (vocab 64, 16 tokens), in order; a short last batch when asked."""

    def __init__(self, batch_size: int, n: int = 96, seq: int = 16, vocab: int = 64):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, vocab, (n, seq + 1), generator=g)
        self.data = TensorDataset(ids[:, :-1], ids[:, 1:])
        self.batch_size = batch_size

    def _loader(self):
        # In order, every epoch alike: replica r reads rows r, r + R, ...; so the replicas' k-th
        # batches together are the one-device run's k-th batch.
        kwargs = self.trainer.strategy.distributed_sampler_kwargs if distributed else {"num_replicas": 1, "rank": 0}
        sampler = DistributedSampler(self.data, shuffle=False, **kwargs)
        return DataLoader(self.data, batch_size=self.batch_size, sampler=sampler)

    def train_dataloader(self):
        return self._loader()

    def val_dataloader(self):
        return self._loader()


class Record(Callback):
    def __init__(self):
        self.losses = []
        self.rng_at_start = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        import hashlib

        if self.rng_at_start is None:  # the generator each stage's dropout draws from
            self.rng_at_start = hashlib.sha1(torch.get_rng_state().numpy().tobytes()).hexdigest()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]) * trainer.accumulate_grad_batches)

def run(cfg: dict) -> None:
    pl.seed_everything(0)
    replicas = cfg.get("replicas", 1)
    batch = cfg["batch"] if distributed else cfg["batch"] * replicas
    model_kwargs = {"vocab_size": 64, "block_size": 16, "hidden": 32, "layers": 2, "heads": 2, "lr": 1e-2,
                    **cfg.get("model", {})}
    if cfg.get("data", "random") == "stdlib":
        dm = TextDataModule(block_size=model_kwargs["block_size"], batch_size=batch, max_files=cfg.get("max_files", 40))
        model_kwargs["vocab_size"] = 256
    else:
        dm = RandomTokens(batch)
    model = GPT(**model_kwargs)
    if distributed:
        strategy = CompressedPipelineStrategy(stages=cfg["stages"], schedule=cfg.get("schedule", "1f1b"),
                                              microbatches=cfg.get("micro", 4), **cfg.get("strategy", {}))
        devices = int(os.environ["WORLD_SIZE"])
    else:
        strategy, devices = "auto", 1
    record = Record()
    callbacks = [record]
    if cfg.get("ckpt_every"):
        from lightning.pytorch.callbacks import ModelCheckpoint

        # at the end of every epoch: Lightning restarts a plain DataLoader's epoch on resume
        callbacks.append(ModelCheckpoint(dirpath=cfg["ckpt_dir"], filename="{step}", save_top_k=-1,
                                         every_n_epochs=1, save_on_train_epoch_end=True))
    trainer = pl.Trainer(
        accelerator="cpu", devices=devices, strategy=strategy, max_steps=cfg["steps"], max_epochs=cfg.get("epochs"), logger=False,
        enable_checkpointing=bool(cfg.get("ckpt_every")), enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
        accumulate_grad_batches=cfg.get("accumulate", 1), limit_val_batches=cfg.get("val_batches", 3 if cfg.get("validate") else 0),
        num_sanity_val_steps=0, use_distributed_sampler=cfg.get("data", "random") == "stdlib", gradient_clip_val=cfg.get("clip"), default_root_dir=str(out),
    )
    trainer.fit(model, datamodule=dm, ckpt_path=cfg.get("resume"))
    if cfg.get("save"):
        trainer.save_checkpoint(cfg["save"])
    result = {"losses": record.losses, "rng_at_start": record.rng_at_start, "params": {k: v.tolist() for k, v in model.state_dict().items()
                                                   if v.is_floating_point()}}
    if distributed:
        from lightning_granndis.ledger import PURPOSES

        ledger = trainer.strategy.comm.ledger
        result["bytes"] = {f"{link}/{purpose}": ledger.get(link, purpose).bytes
                           for link in ("intra", "inter") for purpose in PURPOSES}
        result["stage"], result["replica"] = trainer.strategy.layout.stage, trainer.strategy.layout.replica
    if cfg.get("validate"):
        metrics = trainer.validate(model, datamodule=dm, verbose=False)
        result["val_loss"] = metrics[0]["val_loss"]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{cfg.get('tag', 'run')}_rank{rank}.json").write_text(json.dumps(result))


for cfg in configs:
    run(cfg)

# Leave the process group cleanly: a rank torn down at interpreter exit can abort (seen on busy CI).
from lightning_granndis import comm as _comm  # noqa: E402

_comm.barrier()
_comm.destroy()
