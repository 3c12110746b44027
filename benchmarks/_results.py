"""Where benchmarks put what they measured: ``benchmarks/results/<name>.{json,md,png}``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

RESULTS = Path(__file__).parent / "results"


def save_results(name: str, data: dict, text: str, plot: Callable[[Path], None], folder: Path | None = None) -> None:
    """Writes the JSON, the markdown report and the plot (into ``folder``, default the results
    folder), then prints the report."""
    folder = folder or RESULTS
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
    (folder / f"{name}.md").write_text(text)
    plot(folder / f"{name}.png")
    print(text)
