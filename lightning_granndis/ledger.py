"""The communication ledger: every byte a rank sends, by link class and purpose.

The papers behind this package explain their speed-ups with a breakdown of where time goes
(GraNNDis §8.2: compute, intra-server communication, inter-server communication, gradient
sync). Every operation in :mod:`lightning_granndis.comm` books itself here, so the same
breakdown comes out of any run: bytes sent, messages, measured wall seconds and modelled seconds
per ``(link class, purpose)``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, fields

#: Purposes the package books traffic under; any other string is accepted too.
PURPOSES = (
    "halo",
    "feature_fetch",
    "eval",
    "grad_sync",
    "activation",
    "activation_grad",
    "embedding_sync",
    "teacher_relay",
    "other",
)


@dataclass
class LedgerEntry:
    """Totals of one ``(link, purpose)`` cell."""

    bytes: int = 0
    bytes_received: int = 0
    messages: int = 0
    ops: int = 0
    seconds: float = 0.0
    modelled_seconds: float = 0.0

    def add(self, other: "LedgerEntry") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def minus(self, other: "LedgerEntry") -> "LedgerEntry":
        return LedgerEntry(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)})


class CommLedger:
    """Accumulates :class:`LedgerEntry` cells keyed by ``(link, purpose)``.

    ``link`` is ``"intra"`` or ``"inter"``. Bytes are what this rank *sends* (the convention of
    each operation is documented in :mod:`lightning_granndis.comm`). Measured seconds of an
    operation go to the slowest link class it used; modelled seconds to each class it used.
    """

    def __init__(self) -> None:
        self._cells: dict[tuple[str, str], LedgerEntry] = defaultdict(LedgerEntry)

    def book(
        self,
        link: str,
        purpose: str,
        *,
        nbytes: int = 0,
        bytes_received: int = 0,
        messages: int = 0,
        seconds: float = 0.0,
        modelled_seconds: float = 0.0,
        ops: int = 1,
    ) -> None:
        cell = self._cells[(link, purpose)]
        cell.add(LedgerEntry(nbytes, bytes_received, messages, ops, seconds, modelled_seconds))

    # ------------------------------------------------------------------ reading
    def cells(self) -> dict[tuple[str, str], LedgerEntry]:
        return {k: LedgerEntry(**asdict(v)) for k, v in sorted(self._cells.items())}

    def get(self, link: str, purpose: str) -> LedgerEntry:
        return LedgerEntry(**asdict(self._cells[(link, purpose)])) if (link, purpose) in self._cells else LedgerEntry()

    def total(self, link: str | None = None, purpose: str | None = None) -> LedgerEntry:
        out = LedgerEntry()
        for (lk, pp), cell in self._cells.items():
            if (link is None or lk == link) and (purpose is None or pp == purpose):
                out.add(cell)
        return out

    def snapshot(self) -> "CommLedger":
        copy = CommLedger()
        for k, v in self._cells.items():
            copy._cells[k] = LedgerEntry(**asdict(v))
        return copy

    def since(self, earlier: "CommLedger") -> "CommLedger":
        """The traffic booked after ``earlier`` (a :meth:`snapshot` of this ledger)."""
        diff = CommLedger()
        for k, v in self._cells.items():
            d = v.minus(earlier._cells.get(k, LedgerEntry()))
            if d.ops or d.bytes or d.seconds:
                diff._cells[k] = d
        return diff

    def reset(self) -> None:
        self._cells.clear()

    def __bool__(self) -> bool:
        return bool(self._cells)

    # ------------------------------------------------------------------ (de)serialising
    def to_dict(self) -> dict[str, dict]:
        """``{"intra/halo": {...}, ...}``: JSON-ready."""
        return {f"{lk}/{pp}": asdict(v) for (lk, pp), v in sorted(self._cells.items())}

    @classmethod
    def from_dict(cls, data: dict[str, dict]) -> "CommLedger":
        ledger = cls()
        for key, value in data.items():
            link, purpose = key.split("/", 1)
            ledger._cells[(link, purpose)] = LedgerEntry(**value)
        return ledger

    @classmethod
    def merged(cls, ledgers: list["CommLedger"]) -> "CommLedger":
        """Sums the ledgers of several ranks."""
        out = cls()
        for ledger in ledgers:
            for k, v in ledger._cells.items():
                out._cells[k].add(v)
        return out

    def metrics(self, prefix: str = "comm") -> dict[str, float]:
        """Flat scalars for a logger: ``comm/<link>/<purpose>/{bytes,seconds,modelled_seconds}``."""
        out: dict[str, float] = {}
        for (lk, pp), v in sorted(self._cells.items()):
            out[f"{prefix}/{lk}/{pp}/bytes"] = float(v.bytes)
            out[f"{prefix}/{lk}/{pp}/seconds"] = v.seconds
            out[f"{prefix}/{lk}/{pp}/modelled_seconds"] = v.modelled_seconds
        return out
