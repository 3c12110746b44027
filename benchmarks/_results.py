"""Where benchmarks put what they measured: ``benchmarks/results/<name>.{json,md,png}``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

RESULTS = Path(__file__).parent / "results"


def save_results(name: str, data: dict, text: str, plot: Callable[[Path], None]) -> None:
    """Writes the JSON, the markdown report and the plot, then prints the report."""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
    (RESULTS / f"{name}.md").write_text(text)
    plot(RESULTS / f"{name}.png")
    print(text)
