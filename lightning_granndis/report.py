"""Tables and plots of communication breakdowns (shared by callbacks and benchmarks)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

from lightning_granndis.ledger import CommLedger


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub-flavoured markdown table; floats get 4 significant digits."""

    def cell(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    body = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(headers)]
    line = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths)) + " |"  # noqa: E731
    return "\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, body)])


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} GB"


BREAKDOWN_HEADERS = ("link", "purpose", "bytes (all ranks)", "size", "ops/rank", "measured s/rank", "modelled s/rank")


def breakdown_rows(merged: CommLedger, ranks: int) -> list[list[object]]:
    """Rows of :data:`BREAKDOWN_HEADERS` from the sum of all ranks' ledgers, plus a total row."""
    rows: list[list[object]] = []
    for (link, purpose), cell in merged.cells().items():
        rows.append(
            [link, purpose, cell.bytes, human_bytes(cell.bytes), cell.ops / ranks, cell.seconds / ranks,
             cell.modelled_seconds / ranks]
        )
    total = merged.total()
    rows.append(["all", "all", total.bytes, human_bytes(total.bytes), total.ops / ranks, total.seconds / ranks,
                 total.modelled_seconds / ranks])
    return rows


def save_figure(fig, path: str | Path) -> Path:
    """Lays out ``fig``, writes it to ``path`` (creating the folder) and closes it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_breakdown(merged: CommLedger, ranks: int, path: str | Path, title: str) -> Path:
    """Saves a bar chart of bytes and seconds per (link, purpose) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = merged.cells()
    labels = [f"{lk}\n{pp}" for lk, pp in cells]
    colours = ["tab:blue" if lk == "intra" else "tab:red" for lk, _ in cells]
    fig, (ax_b, ax_t) = plt.subplots(1, 2, figsize=(max(8, 1.6 * len(labels) + 4), 4))
    xs = range(len(labels))
    ax_b.bar(xs, [c.bytes / 1e6 for c in cells.values()], color=colours)
    ax_b.set_ylabel("MB sent (all ranks)")
    ax_b.set_title("bytes by link and purpose")
    width = 0.4
    ax_t.bar([x - width / 2 for x in xs], [c.seconds / ranks for c in cells.values()], width, label="measured")
    ax_t.bar([x + width / 2 for x in xs], [c.modelled_seconds / ranks for c in cells.values()], width,
             label="modelled")
    ax_t.set_ylabel("seconds per rank")
    ax_t.set_title("time by link and purpose")
    ax_t.legend()
    for ax in (ax_b, ax_t):
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, fontsize=8)
    fig.suptitle("\n".join(textwrap.wrap(title, 120)), fontsize=9)
    return save_figure(fig, path)


#: The GraNNDis paper's four time categories (§8.2).
TIME_CATEGORIES = ("compute", "intra_comm", "inter_comm", "grad_sync")
#: Purposes outside training time (exact evaluation) — not part of the breakdown.
NOT_TRAINING = ("eval",)
#: Plot colour of each time category.
TIME_COLOURS = {"compute": "tab:green", "intra_comm": "tab:blue", "inter_comm": "tab:red", "grad_sync": "tab:purple"}


def training_bytes(cells: dict[str, dict], link: str) -> int:
    """Bytes of a :meth:`CommLedger.to_dict` on ``link`` (``intra``/``inter``), training purposes only."""
    return sum(v["bytes"] for k, v in cells.items()
               if k.split("/")[0] == link and k.split("/")[1] not in NOT_TRAINING)


def time_breakdown(ledger: CommLedger, train_seconds: float) -> dict[str, float]:
    """Splits ``train_seconds`` of training into compute, intra-server communication,
    inter-server communication and gradient sync, from the ledger of the same interval: gradient
    sync is every ``grad_sync`` operation, the communication categories the other training
    purposes by link class, and compute the rest."""
    out = dict.fromkeys(TIME_CATEGORIES, 0.0)
    for (link, purpose), cell in ledger.cells().items():
        if purpose in NOT_TRAINING:
            continue
        key = "grad_sync" if purpose == "grad_sync" else f"{link}_comm"
        out[key] += cell.seconds
    out["compute"] = max(0.0, train_seconds - out["intra_comm"] - out["inter_comm"] - out["grad_sync"])
    out["total"] = train_seconds
    return out


def plot_time_breakdown(epochs: Sequence[dict[str, float]], path: str | Path, title: str,
                        labels: Sequence[str] | None = None) -> Path:
    """Stacked bars of the four time categories, one bar per epoch (or per labelled run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(labels) if labels is not None else [str(i) for i in range(len(epochs))]
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(epochs) + 3), 4))
    bottom = [0.0] * len(epochs)
    for cat in TIME_CATEGORIES:
        values = [e.get(cat, 0.0) for e in epochs]
        ax.bar(labels, values, bottom=bottom, label=cat.replace("_", " "), color=TIME_COLOURS[cat])
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("seconds per rank")
    ax.legend(fontsize=8)
    ax.set_title("\n".join(textwrap.wrap(title, 90)), fontsize=9)
    return save_figure(fig, path)
