"""A process's random generators as plain tensors and numbers (loadable weights-only), so a run
resumed from a checkpoint draws what the uninterrupted run drew: dropout masks, shuffles,
sampling. Lightning's checkpoints do not keep them; each rank's differ."""

from __future__ import annotations

import random

import numpy as np
import torch


def capture(device: torch.device | None = None) -> dict:
    """torch's CPU generator (and ``device``'s CUDA one), Python's ``random`` and NumPy's."""
    version, words, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": {"version": version, "words": torch.tensor(words, dtype=torch.long), "gauss": gauss},
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached": float(cached)},
    }
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore(state: dict, device: torch.device | None = None) -> None:
    torch.set_rng_state(state["torch"].cpu())
    python = state["python"]
    random.setstate((python["version"], tuple(int(w) for w in python["words"].tolist()), python["gauss"]))
    numpy = state["numpy"]
    np.random.set_state((numpy["kind"], numpy["keys"].numpy().astype(np.uint32), numpy["pos"],
                         numpy["has_gauss"], numpy["cached"]))
    if "cuda" in state and device is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)
