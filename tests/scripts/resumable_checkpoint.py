"""server_aware_ddp on one CPU process (a subprocess of the test: no DDP inside pytest): saves
with ResumableCheckpoint, damages the newest set, then loads it directly (refused) and resumes
with ckpt_path="last" (skips it). Prints one JSON line with what happened."""

import json
import sys
import warnings
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_granndis.callbacks import ResumableCheckpoint
from lightning_granndis.checkpoint_sets import newest_complete, verify_set
from lightning_granndis.strategies import ServerAwareDDPStrategy

out = Path(sys.argv[1])


def trainer(steps):
    return pl.Trainer(accelerator="cpu", devices=1, strategy=ServerAwareDDPStrategy(), max_steps=steps, logger=False,
                      enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[ResumableCheckpoint(dirpath=str(out), every_n_train_steps=2)])


result = {}
trainer(6).fit(BoringModel())
records = sorted(out.glob("*.set.json"))
result["records"] = [r.name for r in records]
result["verified_steps"] = [verify_set(r.with_name(r.name[: -len(".set.json")])).step for r in records]
newest, _ = newest_complete(out)
data = newest.checkpoint.read_bytes()
newest.checkpoint.write_bytes(data[:-100])
try:
    trainer(8).fit(BoringModel(), ckpt_path=str(newest.checkpoint))
    result["direct_load"] = "loaded"
except Exception as error:  # noqa: BLE001 - reported to the test
    result["direct_load"] = f"{type(error).__name__}: {error}"
t = trainer(8)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    t.fit(BoringModel(), ckpt_path="last")
result["warnings"] = [str(w.message) for w in caught if "ResumableCheckpoint" in str(w.message)]
result["resumed_steps"] = t.global_step
result["resumed_from"] = str(t.ckpt_path)
print("RESULT " + json.dumps(result))
